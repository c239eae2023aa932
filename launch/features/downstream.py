"""`eval.tasks`: downstream tasks scored on the live model at the validation steps, every rank
(launch/evaluation/tasks.py), an "eval" record in metrics.jsonl (`eval/<task>/<key>`) and a summary line
per task in the log."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from launch.evaluation.tasks import eval_metrics, score_tasks, summary_line
from launch.features.base import Feature
from launch.features.validation import evaluation_step

if TYPE_CHECKING:
    from launch.config import Config
    from launch.trainer import Trainer

log = logging.getLogger("orscale")


class Downstream(Feature):
    name = "downstream"
    after = ("validation",)  # a step's task scores follow its validation loss (metrics.jsonl, the log)

    @classmethod
    def enabled(cls, cfg: Config) -> bool:
        return bool(cfg.eval.tasks)

    def evaluate(self, trainer: Trainer, step: int) -> None:
        if not evaluation_step(self.cfg.train, step):
            return
        cfg = self.cfg
        with trainer.meter.paused():  # evaluation time is not training throughput
            compiled = cfg.parallel.compile != "none"  # a few padded shapes, not a graph per length
            engine, env = trainer.engine, trainer.env
            scores = score_tasks(
                engine.module, engine.autocast, trainer.tokenizer, cfg.eval, env, cfg.data.seq_len, compiled
            )
            trainer.record("eval", eval_metrics(scores))
            for summary in scores.values():
                log.info("step %d: eval %s", step, summary_line(summary))
