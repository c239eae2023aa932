"""What produced a run (modded-nanogpt's habit): the git commit, with `-dirty` for uncommitted
changes, and the environment (Python, packages, devices), so any figure traces back to its code."""

from __future__ import annotations

import functools
import platform
import socket
import subprocess
import sys
from importlib import metadata
from typing import Any

import torch

from data.paths import PROJECT_ROOT


def git_commit() -> str:
    """HEAD's commit, with '-dirty' when the work tree has uncommitted changes."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), *args], capture_output=True, text=True, timeout=10
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD") or "unknown"
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("-dirty" if dirty and commit != "unknown" else "")


@functools.cache
def _package_versions() -> dict[str, str | None]:
    """Installed packages do not change under a running process: read once (a sweep's in-process
    cells and the test pool's jobs run many runs in one)."""
    versions: dict[str, str | None] = {}
    for pkg in ("torch", "transformers", "datasets", "tokenizers", "sentencepiece", "deepspeed", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return versions


def environment() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "argv": sys.argv,
        "packages": dict(_package_versions()),
        "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "cpu_threads": torch.get_num_threads(),
        # The same code and seed round differently on another CPU ISA (torch picks AVX2 or AVX-512
        # kernels): a 192-step CPU run moved by up to 0.07 nats between two such machines.
        "cpu": _cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


@functools.cache
def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None
