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
from typing import Any, ClassVar, TypeVar

import torch

from orscale.errors import OptimConfigError, require_all
from orscale.optim_config import OptimConfig

DECAY_SHAPES: tuple[str, ...] = ("linear", "1-sqrt", "cosine")  # a wsd cooldown's shape


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


@dataclass
class WSDOptions:
    """`optim.wsd`: the cooldown over the last `decay_steps` of a run (or `decay_fraction` of it; 0.2 when
    neither is set), of `decay_shape` (linear | 1-sqrt | cosine; 1-sqrt, Hägele et al. 2024)."""

    section: ClassVar[str] = "wsd"

    decay_fraction: float | None = None
    decay_steps: int | None = None
    decay_shape: str = "1-sqrt"

    def __post_init__(self) -> None:
        require_all(
            [
                (
                    self.decay_fraction is None or self.decay_steps is None,
                    "optim.wsd.decay_fraction and optim.wsd.decay_steps both set the cooldown's length: set one",
                ),
                (
                    self.decay_fraction is None or 0 < self.decay_fraction <= 1,
                    f"optim.wsd.decay_fraction must be in (0, 1], got {self.decay_fraction}",
                ),
                (
                    self.decay_steps is None or self.decay_steps >= 1,
                    f"optim.wsd.decay_steps must be >= 1, got {self.decay_steps}",
                ),
                (
                    self.decay_shape in DECAY_SHAPES,
                    f"optim.wsd.decay_shape must be one of {', '.join(DECAY_SHAPES)}, got {self.decay_shape!r}",
                ),
            ]
        )

    def length(self, total: int) -> int:
        """The cooldown's steps in a run of `total` steps (at least one)."""
        if self.decay_steps is not None:
            return self.decay_steps
        return max(1, round((0.2 if self.decay_fraction is None else self.decay_fraction) * total))


def decay_steps(optim: OptimConfig, total: int) -> int:
    """A wsd cooldown's length in steps for a run of `total` steps (`WSDOptions.length`)."""
    return optim.own(WSDOptions).length(total)


def _cosine(optim: OptimConfig, step: int, total: int) -> float:
    return lr_at(step, optim.lr, optim.warmup_steps, total, optim.min_lr_ratio)


def _wsd(optim: OptimConfig, step: int, total: int) -> float:
    o = optim.own(WSDOptions)
    return wsd_lr(step, optim.lr, optim.warmup_steps, total, optim.min_lr_ratio, o.length(total), o.decay_shape)


def _constant(optim: OptimConfig, step: int, total: int) -> float:
    """Warmup (the module's convention), then optim.lr to the end: no decay, no floor."""
    return optim.lr * (step + 1) / optim.warmup_steps if step < optim.warmup_steps else optim.lr


def _wsd_fits(optim: OptimConfig, total: int) -> None:
    decay = decay_steps(optim, total)
    if optim.warmup_steps + decay > total:
        raise OptimConfigError(
            f"optim.schedule=wsd: warmup ({optim.warmup_steps}) and cooldown ({decay} steps) take more than "
            f"the run's {total} steps (train.max_steps); shorten optim.warmup_steps or the cooldown "
            "(optim.wsd.decay_steps / decay_fraction)"
        )


def _fits_any_run(optim: OptimConfig, total: int) -> None:
    return None


@dataclass(frozen=True)
class Cooldown:
    """A schedule whose runs of every length agree up to their cooldown (launch/branch): its `length` in a
    run of `total` steps, the sub-section whose keys shape it (`section`), and `keys(steps, fraction,
    shape)`, the settings of a cooldown over `steps` steps or else `fraction` of a run (None, None: 0.2
    of it), of `shape` (None: as it was)."""

    length: Callable[[OptimConfig, int], int]
    section: str
    keys: Callable[[int | None, float | None, str | None], dict[str, Any]]


def _wsd_keys(steps: int | None, fraction: float | None, shape: str | None) -> dict[str, Any]:
    keys: dict[str, Any] = {"optim.wsd.decay_steps": steps, "optim.wsd.decay_fraction": fraction}
    return {**keys, "optim.wsd.decay_shape": shape} if shape is not None else keys


@dataclass(frozen=True)
class Schedule:
    """One `optim.schedule`: optim.lr's value at a step of a run (`lr`: config, 0-based step, the run's
    total steps), its check against a run's length (`fits`: raises OptimConfigError), the options
    classes of the `optim.<section>`s it reads, and its cooldown when runs of every length share all
    steps before it (None: they do not)."""

    lr: Callable[[OptimConfig, int, int], float]
    fits: Callable[[OptimConfig, int], None] = _fits_any_run
    options: tuple[type, ...] = ()
    cooldown: Cooldown | None = None


COSINE = Schedule(_cosine)
WSD = Schedule(
    _wsd,
    _wsd_fits,
    (WSDOptions,),
    Cooldown(decay_steps, "optim.wsd", _wsd_keys),
)
CONSTANT = Schedule(_constant)


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
