"""The run directory, written by rank 0 only: resolved config, a run log with git commit and environment (every run
records what produced it, modded-nanogpt's habit, so a figure can be traced back to a commit and a config),
metrics.jsonl, and the per-step logs' roll-back on a resume (`continue_at`: metrics.jsonl, windows_rank*.txt).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch
import yaml

from launch.errors import ConfigError
from launch.run.provenance import environment, git_commit
from launch.train_config import TrainConfig
from records.read import KINDS_READ, strict_json  # the run records' rules, shared with the report

log = logging.getLogger("orscale")


# (step, line) for each entry of a per-step log, and the numbers of the lines that do not parse
StepLines = tuple[list[tuple[int, str]], list[int]]


def continue_at(path: Path, start_step: int, read: Callable[[Path], StepLines]) -> None:
    """Make the per-step log `path` continue at `start_step` with no step twice: a new start (step 0)
    keeps the old file under a new name; a resume keeps the lines of steps up to `start_step` (the
    launch trains the later ones again) and drops those that do not parse (a write cut by a kill)."""
    if not path.exists():
        return
    if start_step == 0:
        kept = path.with_name(f"{path.stem}.{time.strftime('%Y%m%d-%H%M%S')}{path.suffix}")
        os.replace(path, kept)
        log.warning("previous %s kept as %s", path.stem, kept.name)
        return
    entries, bad = read(path)
    if bad:
        log.warning(
            "%s: dropped %d line(s) that do not parse (line %s; a write cut by a kill)",
            path.name,
            len(bad),
            ", ".join(map(str, bad[:5])),
        )
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for step, line in entries if step <= start_step))
    os.replace(tmp, path)


class _Mirrors:
    """TensorBoard and/or Weights & Biases (offline) copies of every metrics record."""

    def __init__(self, path: Path, config: dict[str, Any], tensorboard: bool, wandb: bool) -> None:
        self.tb: Any = None
        self.wandb: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(path / "tensorboard"))
        if wandb:
            import wandb as wandb_lib

            run_id = f"{path.name}-{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]}"  # one per run dir
            self.wandb = wandb_lib.init(
                mode="offline",
                dir=str(path),
                project="orscale-lm",
                name=path.name,
                config=config,
                resume="allow",
                id=run_id,
            )

    def write(self, record: dict[str, Any]) -> None:
        # The trainer's own kinds name their keys apart (train_loss, val_loss, eval/...); a loop feature's
        # record is tagged under its kind, so that its `tokens` or `all` lands beside no training value.
        kind = record.get("kind", "train")
        tag = (lambda k: k) if kind in KINDS_READ else (lambda k: f"{kind}/{k}")
        numbers = {
            tag(k): v
            for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
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


def check_mirrors_available(train: TrainConfig) -> None:
    """One clear line, before anything runs, if a requested metrics mirror is not installed."""
    for flag, module in (("tensorboard", "tensorboard"), ("wandb", "wandb")):
        if getattr(train, flag) and importlib.util.find_spec(module) is None:
            raise ConfigError(f"train.{flag}=true needs the {module} package: pip install {module}")


class RunDir:
    """Writes config.yaml, run.log and metrics.jsonl under `path` (rank 0 only)."""

    def __init__(self, path: str, active: bool) -> None:
        self.path = Path(path)
        self.active = active
        self.metrics_path = self.path / "metrics.jsonl"
        self._metrics: TextIO | None = None
        self._mirrors: _Mirrors | None = None
        self._file_handler: logging.FileHandler | None = None

    def open(self, config: dict[str, Any], train: TrainConfig, extra: dict[str, Any] | None = None) -> None:
        """Write the resolved `config`, start run.log (commit, environment, `extra` setup facts) and
        metrics.jsonl, and the mirrors `train` asks for (rank 0 only)."""
        if not self.active:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        text = yaml.safe_dump(config, sort_keys=False)
        (self.path / "config.yaml").write_text(text)
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
        record.info("resolved config:\n%s", text)
        self._metrics = self.metrics_path.open("a")
        self._mirrors = _Mirrors(self.path, config, train.tensorboard, train.wandb)

    def write(self, record: dict[str, Any]) -> None:
        """One strict-JSON line (non-finite numbers as null), flushed; mirrored if configured."""
        if self._metrics is None:
            return
        self._metrics.write(json.dumps(strict_json(record), allow_nan=False) + "\n")
        self._metrics.flush()
        if self._mirrors is not None:
            self._mirrors.write(record)

    def close(self) -> None:
        for part in (self._mirrors, self._metrics):
            if part is not None:
                part.close()
        if self._file_handler is not None:
            logging.getLogger("orscale").removeHandler(self._file_handler)
            self._file_handler.close()
        self._mirrors, self._metrics, self._file_handler = None, None, None


class WindowAudit:
    """`train.record_windows`: one line `<step> <hash>` per training window, per rank
    (windows_rank{r}.txt), to audit that resumes see every window once. A no-op when off."""

    def __init__(self, path: Path | None) -> None:
        self._fh = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("a")

    @classmethod
    def resume(cls, directory: Path, rank: int, world_size: int, start_step: int) -> WindowAudit:
        """Rank `rank`'s audit, continuing at `start_step` as metrics.jsonl does (`continue_at`); rank 0
        also rolls back the files of ranks beyond `world_size` (a run saved on more ranks), which no
        other rank of this launch opens."""
        for path in directory.glob("windows_rank*.txt"):
            r = path.name.removeprefix("windows_rank").removesuffix(".txt")
            if r.isdigit() and (int(r) == rank or (rank == 0 and int(r) >= world_size)):
                continue_at(path, start_step, _window_lines)
        return cls(directory / f"windows_rank{rank}.txt")

    def record(self, step: int, batch: torch.Tensor) -> None:
        if self._fh is not None:
            self._fh.writelines(f"{step} {hash(tuple(row.tolist()))}\n" for row in batch)
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _window_lines(path: Path) -> StepLines:
    entries, bad = [], []
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        fields = line.split()
        if len(fields) == 2 and fields[0].isdigit() and fields[1].lstrip("-").isdigit():
            entries.append((int(fields[0]), line))
        elif line.strip():
            bad.append(i)
    return entries, bad
