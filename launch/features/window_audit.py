"""`train.record_windows`: one line `<step> <hash>` per training window, per rank (windows_rank{r}.txt),
to audit that resumes see every window once (launch/run/run_dir.py's WindowAudit)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from launch.features.base import Feature
from launch.run.run_dir import WindowAudit

if TYPE_CHECKING:
    from launch.config import Config
    from launch.trainer import Trainer


class WindowAuditing(Feature):
    """This rank's audit file, continued at the step the run starts from."""

    name = "window_audit"
    after = ("reader_failure",)  # it records the windows of a read every rank agreed on
    audit: WindowAudit | None = None

    @classmethod
    def enabled(cls, cfg: Config) -> bool:
        return cfg.train.record_windows

    def start(self, trainer: Trainer) -> None:
        env = trainer.env
        self.audit = WindowAudit.resume(trainer.run_dir.path, env.rank, env.world_size, trainer.state.step)

    def batch(self, trainer: Trainer, step: int, windows: Tensor) -> None:
        if self.audit is not None:
            self.audit.record(step, windows)

    def close(self) -> None:
        if self.audit is not None:
            self.audit.close()
