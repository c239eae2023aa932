"""The trainer: the components of a run (engine, data, run directory, checkpointer, the step's meter)
and its loop features (launch/features/), and ONE loop for every backend: read, step, then the
features' hooks (log, evaluate, stop, save). Every metrics.jsonl line goes through `Trainer.record`.
`launch.run.build.build_trainer` assembles one from the config; `launch.loop.train` runs it."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor

from data import PackedLoader, TextTokenizer
from launch.checkpoint import Checkpointer
from launch.config import Config
from launch.engine.base import Engine
from launch.features.base import Feature
from launch.features.checkpointing import Checkpointing
from launch.features.profiling import Profiling
from launch.run.lock import RunLock
from launch.run.meter import StepMeter
from launch.run.run_dir import RunDir
from launch.run.train_state import TrainState
from launch.runtime.hangs import set_comm_timeout
from launch.runtime.process_group import DistEnv
from orscale.registry import scheduled_lr

log = logging.getLogger("orscale")

F = TypeVar("F", bound=Feature)
# A record's kind: a plain name (metrics.jsonl's readers find `"kind": "<kind>"` by its bytes).
_KIND = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(kw_only=True, eq=False)
class Trainer:
    """A built run. `meter` is the step's one loss accumulator (and the logging window); `meta` what
    every checkpoint records (config, commit, model, tokenizer); `val` the fixed validation windows
    [n, seq_len + 1]. The loop's own state: `running` (the step now running, 0 before the first),
    `lr` and `grad_norm` (of the latest step: the step sets them, the features read them), and the
    last record of each kind this launch wrote (`last`)."""

    cfg: Config
    env: DistEnv
    engine: Engine
    loader: PackedLoader
    state: TrainState
    meter: StepMeter
    checkpointer: Checkpointer
    run_dir: RunDir
    lock: RunLock
    tokenizer: TextTokenizer
    val: Tensor
    meta: dict[str, Any]
    accum_steps: int
    features: list[Feature]
    start_step: int = 0
    running: int = 0
    lr: float = math.nan
    grad_norm: Any = math.nan
    _last: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    _closed: bool = field(default=False, repr=False)

    def fit(self) -> dict[str, Any]:
        """Train from `state.step` to `train.max_steps` (or a stop); returns the last losses."""
        set_comm_timeout(self.cfg.parallel.comm_timeout_s)  # start-up is over: from here a silent peer ends the run
        self.each("start")
        self.meter.restart_clock()  # the set-up (a checkpoint's load included) is not training throughput
        return self._loop()

    def _loop(self) -> dict[str, Any]:
        stopped: bool | str = False  # whether (or why) the loop ended before train.max_steps
        while self.state.step < self.cfg.train.max_steps:
            step = self.running = self.state.step + 1
            self.each("before_step", step)
            windows = self._read(step)
            self.each("batch", step, windows)
            self._step(windows)
            self.each("after_step", step)
            self.each("evaluate", step)
            self.each("end_step", step)
            if stopped := next((why for why in self.each("should_stop", step) if why), False):
                self.save(wait=True)  # after the write in flight (run.async_save), and before the exit
                break
            self.each("save", step)
        self.each("finish")
        step, train, val = self.state.step, self.last("train") or {}, self.last("val")
        train_loss, val_loss = train.get("train_loss", math.nan), val["val_loss"] if val else math.nan
        val_text = f"{val_loss:.4f} (step {val['step']})" if val else "not evaluated in this launch"
        how = "done" if not stopped else f"stopped {stopped}" if isinstance(stopped, str) else "stopped"
        log.info("%s at step %d: last train loss %.4f, last val loss %s", how, step, train_loss, val_text)
        return {"step": step, "last_train_loss": train_loss, "val_loss": val_loss}

    def _read(self, step: int) -> Tensor:
        """This rank's share of the step, read ahead in the background; every rank learns of a rank's
        failed read before the step's collectives (the reader-failure feature)."""
        windows, failure = None, None
        try:
            windows = self.loader.next_step()
        except Exception as err:  # e.g. a Hub read that failed after its retries, with no step read before it
            failure = err
        self.each("read", step, failure)
        if windows is None:
            raise failure or RuntimeError(f"no windows for step {step}")
        return windows

    def _step(self, windows: Tensor) -> None:
        """One optimizer step on this rank's windows, split into micro-batches."""
        t = self.cfg.train
        self.lr = scheduled_lr(self.cfg.optim, self.state.step, t.max_steps)
        for micro, batch in enumerate(windows.split(t.micro_batch_size)):
            batch = batch.to(self.env.device, non_blocking=True)
            loss = self.engine.forward_backward(batch, last_micro_batch=micro == self.accum_steps - 1)
            self.meter.add_micro_batch(loss)
        self.grad_norm = self.engine.step(self.lr)
        self.state.step += 1
        self.state.tokens += t.tokens_per_step
        self.meter.end_step(self.state.step, self.grad_norm, t.tokens_per_step, self.loader.take_wait_s())

    def record(self, kind: str, values: dict[str, Any]) -> dict[str, Any]:
        """One metrics.jsonl line that says what it is: `{"kind": kind, "step", "tokens", **values}` at
        the step just done ("train", "val", "eval", or a feature's own kind, its name), written by rank
        0 (and mirrored), kept on every rank as the last of its kind (`last`). Returns the line."""
        if not _KIND.fullmatch(kind):
            raise ValueError(f"a metrics record's kind is a plain name ([a-z][a-z0-9_]*), got {kind!r}")
        if clash := sorted({"kind", "step", "tokens"} & values.keys()):
            raise ValueError(f"a {kind!r} record's values hold {clash}, which the trainer writes itself")
        line = {"kind": kind, "step": self.state.step, "tokens": self.state.tokens, **values}
        self.run_dir.write(line)
        self._last[kind] = line
        return line

    def last(self, kind: str) -> dict[str, Any] | None:
        """The last record of `kind` this launch wrote (None before the first)."""
        return self._last.get(kind)

    def each(self, hook: str, *args: Any) -> list[Any]:
        """Call `hook(self, *args)` on every feature, in their declared order (launch/features/registry.py);
        their answers."""
        return [getattr(feature, hook)(self, *args) for feature in self.features]

    def feature(self, kind: type[F]) -> F:
        """The feature of class `kind` (LookupError when the config did not enable one)."""
        for feature in self.features:
            if isinstance(feature, kind):
                return feature
        raise LookupError(f"this run has no {kind.__name__} feature")

    def save(self, wait: bool = False) -> Path | None:
        """A checkpoint now (a stop signal's, a failed read's): `Checkpointing.write`."""
        return self.feature(Checkpointing).write(self, wait)

    def out_of_memory(self, err: torch.OutOfMemoryError) -> BaseException:
        """The one line of the step that ran out of GPU memory (a snapshot first, when asked)."""
        return self.feature(Profiling).out_of_memory(err, self.running)

    def close(self) -> None:
        """The features' resources, then the run's: a write in flight is published under the run's
        lock (or fails), and the lock goes last."""
        if self._closed:
            return
        self._closed = True
        for feature in self.features:
            feature.close()
        self.checkpointer.close()
        self.loader.close()
        self.run_dir.close()
        self.lock.release()
