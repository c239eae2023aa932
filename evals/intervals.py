"""Accuracies with 95% Wilson intervals, and whether a result is distinguishable from chance.

Small models sit near chance on most of these tasks for a long time; an interval says whether a
difference between runs (or from chance) is real at the task's size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from torch import Tensor

from evals.task_data import Task


def wilson_interval(k: float, n: float, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of k successes in n trials: sane at 0, n and small n, unlike the normal one.
    The closed form with scipy's normal quantile: equal to `scipy.stats.binomtest(k, n)
    .proportion_ci(level, "wilson")` for whole k (tested), and defined for a fractional k too (a mean
    accuracy over seeds that scored the same n examples, which binomtest refuses)."""
    if n <= 0:
        return 0.0, 1.0
    # Imported here: scipy.stats takes ~1.4 s to import, and every train.py start reaches this module.
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + level / 2))
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(max(p * (1 - p) / n + z2 / (4 * n * n), 0.0)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(task: Task, counts: Tensor | Sequence[float]) -> dict[str, Any]:
    """Accuracies, intervals and chance from `scoring.counts` (summed over ranks)."""
    n, raw, per_char, per_token, inv_choices = (float(c) for c in counts)
    total = max(n, 1.0)
    out: dict[str, Any] = {"task": task.name, "shots": task.shots, "n": int(round(n)), "chance": inv_choices / total}
    for metric, k in (("acc", raw), ("acc_norm", per_char), ("acc_per_token", per_token)):
        out[metric] = k / total
        out[f"{metric}_ci"] = wilson_interval(k, n)
    out["primary_metric"] = task.primary
    out["primary"] = out[task.primary]
    lo, hi = out[f"{task.primary}_ci"]
    out["near_chance"] = bool(n == 0 or lo <= out["chance"] <= hi)
    return out


def chance_note(summary: dict[str, Any]) -> str:
    """ "at chance" where the primary metric's interval holds chance; "below chance" where it lies
    wholly under it (no skill either: a small model's bias towards some answer lengths); else ""."""
    if summary["near_chance"]:
        return "at chance"
    return "below chance" if summary["primary"] < summary["chance"] else ""


def _with_ci(value: float, ci: tuple[float, float]) -> str:
    return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def format_table(summaries: Sequence[dict[str, Any]]) -> str:
    """A markdown table; "at chance" comes from the unrounded interval, so rounding never hides it."""
    lines = [
        "| task | shots | n | chance | acc [95% CI] | acc_norm [95% CI] | primary | note |",
        "|---|---:|---:|---:|---|---|---|---|",
    ]
    for s in summaries:
        note = chance_note(s)
        lines.append(
            f"| {s['task']} | {s['shots']} | {s['n']} | {s['chance']:.3f} | {_with_ci(s['acc'], s['acc_ci'])} "
            f"| {_with_ci(s['acc_norm'], s['acc_norm_ci'])} | {s['primary_metric']} {s['primary']:.3f} | {note} |"
        )
    return "\n".join(lines)
