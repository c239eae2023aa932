"""metrics.jsonl's training record (kind "train"; the keys: docs/running.md, `metrics.jsonl`) every
`train.log_every` steps, at step 1 of a fresh run and at the last step: the step's LR and gradient
norm, the meter's window (launch/run/meter.py), the data retries, the optimizer's diagnostics and what
other features add (their `metrics` hook)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from launch.features.base import Feature
from launch.runtime.process_group import all_reduce_sum

if TYPE_CHECKING:
    from launch.trainer import Trainer


class Metrics(Feature):
    """Writes the record, then hands it to every feature's `log` (the check, the progress line)."""

    name = "metrics"

    def after_step(self, trainer: Trainer, step: int) -> None:
        t, optim = self.cfg.train, self.cfg.optim
        # Step 1 of a fresh run, not the first of a resumed one: a resume writes the records the
        # uninterrupted run writes (its first record averages the window the checkpoint holds).
        if not (step % t.log_every == 0 or step in (t.max_steps, 1)):
            return
        retries = torch.tensor(float(trainer.loader.take_read_retries()), device=trainer.env.device)
        values = {
            "lr": trainer.lr,
            "adamw_lr": trainer.lr * optim.adamw_lr_scale,  # the AdamW group's (embedding, head, norms)
            "grad_norm": float(trainer.grad_norm),
            **trainer.meter.read(trainer.state.tokens),
            # Hub requests retried since the previous line, on every rank (data/hub_http.py)
            "data_retries": int(all_reduce_sum(retries)),
            **trainer.engine.diagnostics(),
        }
        for added in trainer.each("metrics", step):
            values.update(added)
        trainer.each("log", step, trainer.record("train", values))
