"""The trainer: the components of a run (engine, data, run directory, checkpointer, the step's meter)
and its loop features (launch/features/), and ONE loop for every backend: read, step, then the
features' hooks (log, evaluate, stop, save). `launch.run.build.build_trainer` assembles one from the
config; `launch.loop.train` runs it."""

from __future__ import annotations

import logging
import math
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


@dataclass(kw_only=True, eq=False)
class Trainer:
    """A built run. `meter` is the step's one loss accumulator (and the logging window); `meta` what
    every checkpoint records (config, commit, model, tokenizer); `val` the fixed validation windows
    [n, seq_len + 1]. The loop's own state: `running` (the step now running, 0 before the first),
    `lr` and `grad_norm` (of the latest step), and what the last line reports."""

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
    last_train_loss: float = math.nan
    last_val: tuple[float, int | None] = (math.nan, None)  # (loss, step) of this launch's last validation
    stopped: str = ""  # why the loop stopped before train.max_steps: "by a signal", "on a failed data read"
    _closed: bool = field(default=False, repr=False)

    def fit(self) -> dict[str, Any]:
        """Train from `state.step` to `train.max_steps` (or a stop); returns the last losses."""
        set_comm_timeout(self.cfg.parallel.comm_timeout_s)  # start-up is over: from here a silent peer ends the run
        self.each("start")
        self.meter.restart_clock()  # the set-up (a checkpoint's load included) is not training throughput
        return self._loop()

    def _loop(self) -> dict[str, Any]:
        while self.state.step < self.cfg.train.max_steps:
            step = self.running = self.state.step + 1
            self.each("before_step", step)
            windows = self._read(step)
            self.each("batch", step, windows)
            self._step(windows)
            self.each("after_step", step)
            self.each("evaluate", step)
            self.each("end_step", step)
            if any(self.each("should_stop", step)):
                self.save(wait=True)  # after the write in flight (run.async_save), and before the exit
                break
            self.each("save", step)
        self.each("finish")
        last_val, step = self.last_val, self.state.step
        val = f"{last_val[0]:.4f} (step {last_val[1]})" if last_val[1] is not None else "not evaluated in this launch"
        how = f"stopped {self.stopped}" if self.stopped else "done"
        log.info("%s at step %d: last train loss %.4f, last val loss %s", how, step, self.last_train_loss, val)
        return {"step": step, "last_train_loss": self.last_train_loss, "val_loss": last_val[0]}

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

    def each(self, hook: str, *args: Any) -> list[Any]:
        """Call `hook(self, *args)` on every feature, in the registry's order; their answers."""
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
