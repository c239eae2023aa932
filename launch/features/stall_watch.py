"""`train.stall_dump_s`: while a step makes no progress for that long, one line naming the rank and the
step, then every thread's stack (launch/runtime/stack_dumps.py, docs/running.md "Hangs that end")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launch.features.base import Feature
from launch.runtime.stack_dumps import StallWatch

if TYPE_CHECKING:
    from launch.config import Config
    from launch.trainer import Trainer


class StallWatching(Feature):
    """The watcher thread, beaten when each step begins (its read, evaluation and checkpoint included)."""

    name = "stall_watch"
    before = ("preemption",)  # watching from the start: the stop flag's collective set-up included

    watch: StallWatch | None = None

    @classmethod
    def enabled(cls, cfg: Config) -> bool:
        return cfg.train.stall_dump_s > 0

    def start(self, trainer: Trainer) -> None:
        self.watch = StallWatch(self.cfg.train.stall_dump_s)

    def before_step(self, trainer: Trainer, step: int) -> None:
        if self.watch is not None:
            self.watch.beat(step)

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()
