"""A data read that failed (e.g. a Hub read that failed after its retries): every rank learns of it
before the step's collectives, keeps what it trained (a checkpoint), then the run stops with the
read's one line; a reader that fails on a later step (read ahead) stops every rank as a signal does,
saying so."""

from __future__ import annotations

from typing import TYPE_CHECKING

from data import DataError
from launch.features.base import Feature
from launch.features.preemption import Preemption

if TYPE_CHECKING:
    from launch.trainer import Trainer


class ReaderFailure(Feature):
    """Agrees on a failed read on the stop flag's group (`Preemption`'s)."""

    name = "reader_failure"
    # The flag is made in Preemption.start and restored in its finish, before this finish raises.
    after = ("preemption",)

    def read(self, trainer: Trainer, step: int, failure: Exception | None) -> None:
        # Every rank learns of a failed read here, before the step's collectives (where the others
        # would wait for the failed rank until parallel.comm_timeout_s): all keep what they trained, then say why.
        if (failed := trainer.feature(Preemption).flag.agree_on_read(failure)) is None:
            return
        if trainer.state.step > trainer.start_step:
            trainer.save(wait=True)
        if failure is not None:
            raise failure
        raise DataError(f"rank {failed[0]} could not read step {step}: {failed[1]}")

    def end_step(self, trainer: Trainer, step: int) -> None:
        if trainer.loader.failure is not None:  # the reader failed on a later step: every rank stops here and saves
            trainer.feature(Preemption).flag.reader_failed = True

    def finish(self, trainer: Trainer) -> None:
        if trainer.loader.failure is not None and trainer.state.step < self.cfg.train.max_steps:
            raise trainer.loader.failure  # after the save: its one line names the file, row group and last status
