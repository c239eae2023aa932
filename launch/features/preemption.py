"""SIGTERM/SIGINT (preemption, Ctrl-C): every rank stops at the same step, one step after the signal,
with a checkpoint, and the run exits 0 (launch/runtime/stop_flag.py's StopFlag agrees on it); a data
reader that failed on a step it read ahead stops every rank the same way (launch/features/reader_failure.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from launch.features.base import Feature
from launch.runtime.stop_flag import Stop, StopFlag

if TYPE_CHECKING:
    from launch.trainer import Trainer

log = logging.getLogger("orscale")


class Preemption(Feature):
    """The stop flag (signal handlers and its gloo group), from the first step to the last. The
    reader-failure feature agrees on a failed read on the same group (`flag`)."""

    name = "preemption"
    _flag: StopFlag | None = None
    _stop: Stop | None = None

    def start(self, trainer: Trainer) -> None:
        self._flag = StopFlag(trainer.env)  # collective: the gloo group

    @property
    def flag(self) -> StopFlag:
        if self._flag is None:
            raise RuntimeError("the stop flag is made when the run starts (Preemption.start)")
        return self._flag

    def should_stop(self, trainer: Trainer, step: int) -> bool | str:
        self._stop = self.flag.agreed()
        if self._stop is None:
            return False
        if self._stop.signal:
            log.warning("stop signal: saving a checkpoint at step %d and exiting", step)
        else:
            log.warning(
                "the data reader of rank %d failed on a step it read ahead: saving a checkpoint at step %d and exiting",
                self._stop.failed_reader,
                step,
            )
        return "by a signal" if self._stop.signal else "on a failed data read"

    def finish(self, trainer: Trainer) -> None:
        self.flag.restore()
