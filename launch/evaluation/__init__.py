"""Evaluation, in one place: the validation loss of a live model (`validation`), downstream tasks
scored on a live model on every rank (`downstream`, what the loop runs at its validation steps), and
the same tasks on a checkpoint or an HF export (`offline`: `python -m launch.evaluation`). The
scoring itself is `evals/`; the checkpoint reading `launch.checkpoint.load_gpt`."""

from launch.evaluation.downstream import eval_metrics, score_tasks, summary_line
from launch.evaluation.validation import validation_loss

__all__ = ["eval_metrics", "score_tasks", "summary_line", "validation_loss"]
