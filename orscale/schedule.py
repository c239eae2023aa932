"""Learning-rate schedules (`optim.schedule`, the table ``SCHEDULES``): linear warmup, then cosine
decay to a floor (docs/algorithm.md), or warmup-stable-decay (WSD). Stateless: the LR of a step is
a function of the step and the config.

Warmup convention: ``lr = peak·(step+1)/warmup`` for ``step < warmup`` (steps count from 0), so the
first step already has lr > 0 and the last warmup step reaches the peak. We choose this over
"from exactly 0" because an lr = 0 first step does nothing to the weights yet still feeds the
momentum, and OrScale-LM's lazy calibration (which waits for lr > 0) would then calibrate
against a two-gradient momentum instead of the first one.

After warmup, ``cosine``: from ``peak`` (at ``step = warmup``) to ``peak·min_ratio`` (at
``step = total``), and ``peak·min_ratio`` from then on. ``wsd`` (Hägele et al. 2024, "Scaling Laws and
Compute-Optimal Training Beyond Fixed Training Durations"): ``peak`` until the cooldown's first step
``start = total - decay``, then ``floor + (peak - floor)·f(p)`` with ``p = (step - start) / decay``
(0 at the cooldown's first step) and ``f`` = ``1 - p`` (linear), ``1 - √p`` (1-sqrt) or
``(1 + cos πp) / 2`` (cosine), and the floor from ``step = total`` on. Every step before ``start`` is
the same whatever the total, so a run of a longer budget is, up to there, a run of a shorter one:
a cooldown branched from its checkpoint at or before ``start`` is that shorter run (launch/branch).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

from orscale.errors import OptimConfigError


class ScheduleSettings(Protocol):
    """What a schedule reads of the `optim:` section (``orscale.optim_config.OptimConfig``, which
    imports this module for its checks: a protocol here keeps the import one way)."""

    lr: float
    warmup_steps: int
    min_lr_ratio: float
    schedule: str
    decay_fraction: float | None
    decay_steps: int | None
    decay_shape: str | None


DECAY_SHAPES: tuple[str, ...] = ("linear", "1-sqrt", "cosine")  # a wsd cooldown's shape
DEFAULT_DECAY_FRACTION = 0.2  # a wsd cooldown's share of the run when neither length is set
DEFAULT_DECAY_SHAPE = "1-sqrt"
Checks = list[tuple[bool, str]]  # (holds, the one-line OptimConfigError message when it does not)


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


_SHAPES = {
    "linear": lambda p: 1.0 - p,
    "1-sqrt": lambda p: 1.0 - math.sqrt(p),
    "cosine": lambda p: 0.5 * (1.0 + math.cos(math.pi * p)),
}


def wsd_lr(step: int, peak: float, warmup: int, total: int, min_ratio: float, decay: int, shape: str) -> float:
    """The learning rate of warmup-stable-decay for 0-based step `step` (the module docstring)."""
    if step < 0 or warmup < 0 or total < 0 or peak < 0 or not 0 <= min_ratio <= 1 or decay < 1:
        raise ValueError(
            f"wsd_lr needs step, warmup, total, peak >= 0, min_ratio in [0, 1] and decay >= 1; got step={step}, "
            f"warmup={warmup}, total={total}, peak={peak}, min_ratio={min_ratio}, decay={decay}"
        )
    if step < warmup:
        return peak * (step + 1) / warmup
    floor = peak * min_ratio
    if step >= total:
        return floor
    start = total - decay
    if step < start:
        return peak
    return floor + (peak - floor) * _SHAPES[shape]((step - start) / decay)


def decay_steps(optim: ScheduleSettings, total: int) -> int:
    """A wsd cooldown's length in steps for a run of `total` steps (optim.decay_steps, or
    optim.decay_fraction of the run, 0.2 by default; at least one step)."""
    if optim.decay_steps is not None:
        return optim.decay_steps
    fraction = DEFAULT_DECAY_FRACTION if optim.decay_fraction is None else optim.decay_fraction
    return max(1, round(fraction * total))


def _cosine(optim: ScheduleSettings, step: int, total: int) -> float:
    return lr_at(step, optim.lr, optim.warmup_steps, total, optim.min_lr_ratio)


def _wsd(optim: ScheduleSettings, step: int, total: int) -> float:
    shape = DEFAULT_DECAY_SHAPE if optim.decay_shape is None else optim.decay_shape
    return wsd_lr(step, optim.lr, optim.warmup_steps, total, optim.min_lr_ratio, decay_steps(optim, total), shape)


def _constant(optim: ScheduleSettings, step: int, total: int) -> float:
    """Warmup (the module's convention), then optim.lr to the end: no decay, no floor."""
    return optim.lr * (step + 1) / optim.warmup_steps if step < optim.warmup_steps else optim.lr


def _wsd_checks(optim: ScheduleSettings) -> Checks:
    """optim.decay_* belong to wsd: set only with it, and each in its range."""
    return [
        (
            optim.schedule == "wsd"
            or (optim.decay_fraction is None and optim.decay_steps is None and optim.decay_shape is None),
            "optim.decay_fraction, decay_steps and decay_shape shape the cooldown of optim.schedule=wsd; "
            f"this run has optim.schedule={optim.schedule}: set optim.schedule=wsd or leave them unset",
        ),
        (
            optim.decay_fraction is None or optim.decay_steps is None,
            "optim.decay_fraction and optim.decay_steps both set the cooldown's length: set one of them",
        ),
        (
            optim.decay_fraction is None or 0 < optim.decay_fraction <= 1,
            f"optim.decay_fraction must be in (0, 1], got {optim.decay_fraction}",
        ),
        (
            optim.decay_steps is None or optim.decay_steps >= 1,
            f"optim.decay_steps must be >= 1, got {optim.decay_steps}",
        ),
        (
            optim.decay_shape is None or optim.decay_shape in DECAY_SHAPES,
            f"optim.decay_shape must be one of {', '.join(DECAY_SHAPES)}, got {optim.decay_shape!r}",
        ),
    ]


def _wsd_fits(optim: ScheduleSettings, total: int) -> None:
    decay = decay_steps(optim, total)
    if optim.warmup_steps + decay > total:
        raise OptimConfigError(
            f"optim.schedule=wsd: warmup ({optim.warmup_steps}) and cooldown ({decay} steps) take more than "
            f"the run's {total} steps (train.max_steps); shorten optim.warmup_steps or the cooldown "
            "(optim.decay_steps / decay_fraction)"
        )


def _no_checks(optim: ScheduleSettings) -> Checks:
    return []


def _fits_any_run(optim: ScheduleSettings, total: int) -> None:
    return None


@dataclass(frozen=True)
class Schedule:
    """One `optim.schedule`: optim.lr's value at a step of a run (`lr`: config, 0-based step, the
    run's total steps), the checks of the `optim:` keys it owns (run on every config, in the table's
    order), and its check against a run's length (`fits`: raises OptimConfigError)."""

    lr: Callable[[ScheduleSettings, int, int], float]
    checks: Callable[[ScheduleSettings], Checks] = _no_checks
    fits: Callable[[ScheduleSettings, int], None] = _fits_any_run


# The schedules by `optim.schedule` (the module docstring); a new one is a function and a line here.
SCHEDULES: dict[str, Schedule] = {
    "cosine": Schedule(_cosine),
    "wsd": Schedule(_wsd, _wsd_checks, _wsd_fits),
    "constant": Schedule(_constant),
}


def schedule_checks(optim: ScheduleSettings) -> Checks:
    """The one-line checks of `optim.schedule` and of every schedule's own keys."""
    known = (
        optim.schedule in SCHEDULES,
        f"optim.schedule must be one of {', '.join(SCHEDULES)}, got {optim.schedule!r}",
    )
    return [known, *(check for schedule in SCHEDULES.values() for check in schedule.checks(optim))]


def check_schedule(optim: ScheduleSettings, total: int) -> None:
    """OptimConfigError (one line) for a schedule a run of `total` steps cannot follow."""
    SCHEDULES[optim.schedule].fits(optim, total)


def scheduled_lr(optim: ScheduleSettings, step: int, total: int) -> float:
    """optim.lr's value at 0-based step `step` of a run of `total` steps, by `optim.schedule`."""
    return SCHEDULES[optim.schedule].lr(optim, step, total)


LR_SCALE = "lr_scale"  # routed param-group key: the group's peak LR over optim.lr (absent: 1)
_SCALES = "orscale_lr_scales"  # where an optimizer keeps them (see `keep_lr_scales`)


Opt = TypeVar("Opt", bound=torch.optim.Optimizer)


def keep_lr_scales(opt: Opt) -> Opt:
    """Move each param group's LR_SCALE key onto the optimizer itself, where `set_lr` reads it. Not
    in the groups: a loaded state dict replaces the groups' keys with the saved ones (an older
    checkpoint has none; a resumed run may have changed optim.adamw_lr), and the scale is this
    run's config, not state. Returns `opt`."""
    # torch keeps the very dicts it was given as its param groups: pop from copies, so that the
    # routed groups (reused by ZeRO's owner-side optimizer) keep their scales.
    opt.param_groups[:] = [dict(group) for group in opt.param_groups]
    setattr(opt, _SCALES, [float(group.pop(LR_SCALE, 1.0)) for group in opt.param_groups])
    return opt


def lr_scales(opt: torch.optim.Optimizer) -> list[float]:
    """Each param group's peak LR over optim.lr, as `set_lr` applies it."""
    return list(getattr(opt, _SCALES, None) or [1.0] * len(opt.param_groups))


def set_lr(optimizers: Iterable[torch.optim.Optimizer], lr: float) -> None:
    """Set every param group's LR to `lr` (a Python float, the schedule's value for optim.lr) times
    the group's scale (1.0 unless `keep_lr_scales` recorded another: lr * 1.0 is lr, bit for bit)."""
    for opt in optimizers:
        for group, scale in zip(opt.param_groups, lr_scales(opt), strict=True):
            group["lr"] = float(lr) * scale
