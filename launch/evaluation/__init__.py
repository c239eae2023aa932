"""Evaluation of a live model (validation loss, downstream tasks) and of a checkpoint or an HF export
(`python -m launch.evaluation`; docs/evaluation.md)."""

from launch.evaluation.tasks import eval_metrics, score_tasks, summary_line
from launch.evaluation.val_loss import validation_loss

__all__ = ["eval_metrics", "score_tasks", "summary_line", "validation_loss"]
