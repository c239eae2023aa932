"""Checkpoints: when (`train.ckpt_every`, `train.ckpt_at`, the last step; a stop or a failed read ask for
one too, through `Trainer.save`) and how (`run.async_save`: an interval checkpoint staged and written in
the background; `train.on_save_error`). What a checkpoint holds: ARCHITECTURE.md, "One checkpoint"."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from launch.checkpoint import SaveError
from launch.features.base import Feature
from launch.features.divergence import check_finite

if TYPE_CHECKING:
    from launch.trainer import Trainer

log = logging.getLogger("orscale")


class Checkpointing(Feature):
    """The `save` hook (the last of a step, after every feature's other hooks) and `Trainer.save`'s write."""

    name = "checkpointing"

    def save(self, trainer: Trainer, step: int) -> None:
        t = self.cfg.train
        if step == t.max_steps or (t.ckpt_every and step % t.ckpt_every == 0) or step in t.ckpt_at:
            with trainer.meter.paused():
                self.write(trainer)

    def write(self, trainer: Trainer, wait: bool = False) -> Path | None:
        """A checkpoint of the current state, after checking that it is finite on every rank. A
        checkpoint that cannot be written stops the run (SaveError, one line), unless
        `train.on_save_error=continue` and it is not the last step: then the line is logged and the
        next interval tries again. Returns the checkpoint, or None when it was not written.

        With `run.async_save`, an interval checkpoint is only staged here and written while training
        goes on; the last step's and a `wait` one (a stop signal, a failed read) are written before
        this returns, after the write in flight: the run never ends with a write unfinished."""
        check_finite(trainer)
        self.finish_background_save(trainer)
        state = trainer.state
        last = wait or state.step >= self.cfg.train.max_steps
        background = self.cfg.run.async_save and not last
        started = time.perf_counter()
        try:
            meta = {**trainer.meta, "tokens": state.tokens}
            path = trainer.checkpointer.save(state.step, meta, background=background)
        except SaveError as err:
            self._save_failed(err, last=state.step >= self.cfg.train.max_steps)
            return None
        if background:
            took = time.perf_counter() - started
            log.info("checkpoint step %d staged in %.2f s; writing it in the background", state.step, took)
        else:
            log.info("checkpoint: %s", path)
        return path

    def finish_background_save(self, trainer: Trainer) -> None:
        """Wait for the checkpoint written in the background, if any. Its failure is a synchronous
        save's: the run stops, or goes on with `train.on_save_error=continue`."""
        try:
            trainer.checkpointer.wait()
        except SaveError as err:
            self._save_failed(err, last=False)

    def _save_failed(self, err: SaveError, last: bool) -> None:
        if self.cfg.train.on_save_error != "continue" or last:
            raise err
        log.error("%s; training goes on (train.on_save_error=continue) and tries again at the next save", err)
