"""The run directory: resolved config, a run log with git commit and environment, metrics.jsonl.

Only rank 0 writes. Every run records what produced it (modded-nanogpt's habit), so a figure in
a table can always be traced back to a commit and a config.
"""

from __future__ import annotations

import json
import logging
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

import torch

from launch.config import Config, dump_yaml

log = logging.getLogger("orscale")

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def git_commit() -> str:
    """HEAD's commit, with '-dirty' when the work tree has uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(PROJECT_ROOT), *args], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD") or "unknown"
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("-dirty" if dirty and commit != "unknown" else "")


def environment() -> dict[str, Any]:
    versions = {}
    for pkg in ("torch", "transformers", "datasets", "tokenizers", "sentencepiece", "deepspeed", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    env = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "argv": sys.argv,
        "packages": versions,
        "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "cpu_threads": torch.get_num_threads(),
    }
    return env


def setup_logging(rank: int) -> None:
    """Console logging for the project's loggers ("orscale.*"): INFO on rank 0, warnings elsewhere.

    Configures only our logger (not the root), so an embedding application or pytest keeps its
    own handlers; idempotent across calls.
    """
    logger = logging.getLogger("orscale")
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    fmt = "%(asctime)s %(levelname)s %(message)s" if rank == 0 else f"[rank {rank}] %(levelname)s %(message)s"
    handler = next((h for h in logger.handlers if getattr(h, "_orscale_console", False)), None)
    if handler is None:
        handler = logging.StreamHandler()
        handler._orscale_console = True
        logger.addHandler(handler)
    handler.setFormatter(logging.Formatter(fmt, datefmt="%H:%M:%S"))


class RunDir:
    """Writes config.yaml, run.log and metrics.jsonl under `path` (rank 0 only)."""

    def __init__(self, path: str, active: bool) -> None:
        self.path = Path(path)
        self.active = active
        self.metrics_path = self.path / "metrics.jsonl"
        self._metrics = None

    def open(self, cfg: Config, extra: Optional[dict[str, Any]] = None) -> None:
        if not self.active:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "config.yaml").write_text(dump_yaml(cfg))
        handler = logging.FileHandler(self.path / "run.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logging.getLogger("orscale").addHandler(handler)
        self._file_handler = handler
        # The long provenance block goes to run.log only; the console gets the commit.
        record = logging.getLogger("orscale.provenance")
        record.propagate = False
        record.setLevel(logging.INFO)
        record.handlers = [handler]
        log.info("run dir %s, git commit %s", self.path, git_commit())
        record.info("environment: %s", json.dumps(environment()))
        if extra:
            record.info("setup: %s", json.dumps(extra))
        record.info("resolved config:\n%s", dump_yaml(cfg))
        self._metrics = self.metrics_path.open("a")

    def write(self, record: dict[str, Any]) -> None:
        if self._metrics is None:
            return
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        handler = getattr(self, "_file_handler", None)
        if handler is not None:
            logging.getLogger("orscale").removeHandler(handler)
            handler.close()
            self._file_handler = None


class WindowAudit:
    """`train.record_windows`: one line `<step> <hash>` per training window, per rank
    (windows_rank{r}.txt), to audit that resumes see every window once. A no-op when off."""

    def __init__(self, path: Optional[Path]) -> None:
        self._fh = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("a")

    def record(self, step: int, batch: torch.Tensor) -> None:
        if self._fh is not None:
            self._fh.writelines(f"{step} {hash(tuple(row.tolist()))}\n" for row in batch)
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
