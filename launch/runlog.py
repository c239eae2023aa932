"""The run directory: resolved config, a run log with git commit and environment, metrics.jsonl.

Only rank 0 writes. Every run records what produced it (modded-nanogpt's habit), so a figure in
a table can always be traced back to a commit and a config.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

import torch

from launch.config import Config, dump_yaml, to_dict as dataclasses_asdict

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


def strict_json(value: Any) -> Any:
    """`value` with every non-finite float as None, so each line is strict JSON (no bare NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The records of a metrics.jsonl and the line numbers that do not parse (a kill during a
    write leaves a torn last line)."""
    records, bad = [], []
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            bad.append(i)
    return records, bad


class _Mirrors:
    """TensorBoard and/or Weights & Biases (offline) copies of every metrics record."""

    def __init__(self, cfg: Config, path: Path) -> None:
        self.tb = self.wandb = None
        if cfg.train.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(path / "tensorboard"))
        if cfg.train.wandb:
            import wandb

            run_id = f"{path.name}-{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]}"  # one per run dir
            self.wandb = wandb.init(mode="offline", dir=str(path), project="orscale-lm", name=path.name,
                                    config=dataclasses_asdict(cfg), resume="allow", id=run_id)

    def write(self, record: dict[str, Any]) -> None:
        numbers = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))
                   and not isinstance(v, bool)}
        if self.tb is not None:
            for key, value in numbers.items():
                self.tb.add_scalar(key, value, record["step"])
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(numbers, step=record["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def check_mirrors_available(cfg: Config) -> None:
    """One clear line, before anything runs, if a requested metrics mirror is not installed."""
    from launch.config import ConfigError

    for flag, module, package in (("tensorboard", "tensorboard", "tensorboard"), ("wandb", "wandb", "wandb")):
        if getattr(cfg.train, flag) and importlib.util.find_spec(module) is None:
            raise ConfigError(f"train.{flag}=true needs the {package} package: pip install {package}")


class RunDir:
    """Writes config.yaml, run.log and metrics.jsonl under `path` (rank 0 only)."""

    def __init__(self, path: str, active: bool) -> None:
        self.path = Path(path)
        self.active = active
        self.metrics_path = self.path / "metrics.jsonl"
        self._metrics = None
        self._mirrors: Optional[_Mirrors] = None

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
        self._mirrors = _Mirrors(cfg, self.path)

    def write(self, record: dict[str, Any]) -> None:
        """One strict-JSON line (non-finite numbers as null), flushed; mirrored if configured."""
        if self._metrics is None:
            return
        self._metrics.write(json.dumps(strict_json(record), allow_nan=False) + "\n")
        self._metrics.flush()
        if self._mirrors is not None:
            self._mirrors.write(record)

    def close(self) -> None:
        if self._mirrors is not None:
            self._mirrors.close()
            self._mirrors = None
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
