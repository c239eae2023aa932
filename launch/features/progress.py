"""What a run says while it trains, on rank 0: a progress bar on a terminal (`train.progress`), else one
line per logging step (launch/run/progress_bar.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launch.features.base import Feature
from launch.run.progress_bar import Progress

if TYPE_CHECKING:
    from launch.trainer import Trainer


class ProgressReport(Feature):
    name = "progress"
    after = ("divergence",)  # a diverged step's line is never printed: the check raises first
    progress: Progress | None = None

    def start(self, trainer: Trainer) -> None:
        t = self.cfg.train
        self.progress = Progress(t.max_steps, trainer.state.step, enabled=trainer.env.is_main, bar=t.progress)

    def log(self, trainer: Trainer, step: int, record: dict[str, Any]) -> None:
        if self.progress is not None:
            self.progress.logged(record)

    def end_step(self, trainer: Trainer, step: int) -> None:
        if self.progress is not None:
            self.progress.update(step)

    def finish(self, trainer: Trainer) -> None:
        self.close()

    def close(self) -> None:  # also after an error: the bar gives the terminal back
        if self.progress is not None:
            self.progress.close()
