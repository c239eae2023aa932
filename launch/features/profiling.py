"""`train.profile` and `train.memory_snapshot`: profiler traces and CUDA memory snapshots of windows of
steps, and a snapshot before the one line of a step that ran out of GPU memory (launch/run/traces.py).
Off (the default), its one call per step returns at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launch.features.base import Feature
from launch.run.traces import OutOfMemory, StepTracing

if TYPE_CHECKING:
    from launch.trainer import Trainer


class Profiling(Feature):
    """The launch's StepTracing, stepped after every step (every rank)."""

    name = "profiling"
    # A traced step ends with its update, before the training line's collectives and host syncs.
    before = ("metrics",)
    tracing: StepTracing | None = None

    def start(self, trainer: Trainer) -> None:
        t, env, start = self.cfg.train, trainer.env, trainer.state.step
        self.tracing = StepTracing(t, trainer.run_dir.path, env.rank, env.device, t.max_steps - start, start_step=start)

    def after_step(self, trainer: Trainer, step: int) -> None:
        if self.tracing is not None:
            self.tracing.step(step)

    def out_of_memory(self, err: BaseException, step: int) -> OutOfMemory | BaseException:
        """The one line of step `step`'s torch.OutOfMemoryError (a snapshot dumped first, when asked)."""
        return self.tracing.out_of_memory(err, step) if self.tracing is not None else err

    def close(self) -> None:
        if self.tracing is not None:
            self.tracing.close()
