"""Learning-rate schedule: linear warmup, then cosine decay to a floor (SPEC §4).

Warmup convention: ``lr = peak·(step+1)/warmup`` for ``step < warmup`` (steps count from 0), so the
first step already has lr > 0 and the last warmup step reaches the peak. We choose this over
"from exactly 0" because an lr = 0 first step does nothing to the weights yet still feeds the
momentum, and OrScale-LM's lazy calibration (which waits for lr > 0) would then calibrate
against a two-gradient momentum instead of the first one.

After warmup: cosine from ``peak`` (at ``step = warmup``) to ``peak·min_ratio`` (at
``step = total``), and ``peak·min_ratio`` from then on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


def lr_at(step: int, peak: float, warmup: int, total: int, min_ratio: float) -> float:
    """The learning rate for 0-based optimizer step `step`."""
    if step < 0 or warmup < 0 or total < 0 or peak < 0 or not 0 <= min_ratio <= 1:
        raise ValueError(
            f"lr_at needs step, warmup, total, peak >= 0 and min_ratio in [0, 1]; got "
            f"step={step}, warmup={warmup}, total={total}, peak={peak}, min_ratio={min_ratio}"
        )
    if step < warmup:
        return peak * (step + 1) / warmup
    floor = peak * min_ratio
    if step >= total:
        return floor
    progress = (step - warmup) / (total - warmup)  # total > step >= warmup: no division by 0
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizers: Iterable[torch.optim.Optimizer], lr: float) -> None:
    """Set `lr` (a Python float) on every param group of every optimizer."""
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = float(lr)
