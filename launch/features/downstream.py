"""`eval.tasks`: downstream tasks scored on the live model at the validation steps, every rank
(launch/evaluation/tasks.py), written to metrics.jsonl with a summary line per task."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from launch.evaluation import eval_metrics, score_tasks, summary_line
from launch.features.base import Feature
from launch.features.validation import evaluation_step

if TYPE_CHECKING:
    from launch.config import Config
    from launch.trainer import Trainer

log = logging.getLogger("orscale")


class Downstream(Feature):
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
            trainer.run_dir.write({"step": step, "tokens": trainer.state.tokens, **eval_metrics(scores)})
            for summary in scores.values():
                log.info("step %d: eval %s", step, summary_line(summary))
