"""The validation loss on the fixed validation windows every `train.eval_every` steps and at the last
step (launch/evaluation/val_loss.py), a "val" record in metrics.jsonl, and logged; evaluation time is left
out of the training throughput."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from launch.evaluation.val_loss import validation_loss
from launch.features.base import Feature
from launch.train_config import TrainConfig

if TYPE_CHECKING:
    from launch.trainer import Trainer

log = logging.getLogger("orscale")


def evaluation_step(train: TrainConfig, step: int) -> bool:
    """Whether `step` is an evaluation step: each `train.eval_every` (0: none) and the last."""
    return bool(train.eval_every and step % train.eval_every == 0) or step == train.max_steps


class Validation(Feature):
    name = "validation"

    def evaluate(self, trainer: Trainer, step: int) -> None:
        if not evaluation_step(self.cfg.train, step):
            return
        with trainer.meter.paused():  # evaluation time is not training throughput
            loss = validation_loss(trainer.engine, trainer.val, self.cfg.data.val_batch_size, trainer.env)
            trainer.record("val", {"val_loss": loss, "val_tokens": trainer.val[:, 1:].numel()})
            log.info("step %d: val_loss %.4f", step, loss)
