"""optim.schedule (orscale/schedule.py): cosine unchanged bit for bit; wsd at known steps; the
one-line errors of impossible combinations."""

from __future__ import annotations

import math

import pytest

from orscale import OptimConfig, OptimConfigError, check_schedule, scheduled_lr
from orscale.registry import schedule_of
from orscale.schedule import WSDOptions, decay_steps, lr_at, wsd_lr


def test_cosine_is_todays_schedule_bit_for_bit():
    cfg = OptimConfig(lr=3e-3, warmup_steps=10, min_lr_ratio=0.1)
    for step in range(0, 130):
        assert scheduled_lr(cfg, step, 120) == lr_at(step, 3e-3, 10, 120, 0.1)
    # the formula itself, at steps whose values are known
    assert lr_at(0, 1.0, 10, 110, 0.1) == 0.1  # warmup: (0 + 1) / 10
    assert lr_at(10, 1.0, 10, 110, 0.1) == 1.0  # the peak at the end of warmup
    assert lr_at(60, 1.0, 10, 110, 0.1) == pytest.approx(0.55)  # half way: floor + (peak - floor) / 2
    assert lr_at(110, 1.0, 10, 110, 0.1) == 0.1 and lr_at(500, 1.0, 10, 110, 0.1) == 0.1


@pytest.mark.parametrize(
    "shape, f",
    [
        ("linear", lambda p: 1 - p),
        ("1-sqrt", lambda p: 1 - math.sqrt(p)),
        ("cosine", lambda p: (1 + math.cos(math.pi * p)) / 2),
    ],
)
def test_wsd_warms_up_holds_the_peak_then_cools_down_by_its_shape(shape, f):
    # 100 steps, warmup 10, cooldown 20 from step 80, floor 0.1
    lr = lambda s: wsd_lr(s, 2.0, 10, 100, 0.1, 20, shape)  # noqa: E731
    assert lr(0) == pytest.approx(0.2) and lr(9) == 2.0
    assert all(lr(s) == 2.0 for s in range(10, 81))  # stable through the cooldown's first step (p = 0)
    for s in (85, 90, 99):
        assert lr(s) == pytest.approx(0.2 + 1.8 * f((s - 80) / 20))
    assert lr(100) == pytest.approx(0.2) and lr(1000) == pytest.approx(0.2)
    assert lr(99) > lr(100)  # the floor is reached at step `total`, as cosine's


def test_wsd_steps_before_a_cooldown_do_not_depend_on_the_runs_length():
    """What makes a cooldown branch the run of a shorter budget: the same LR at every step before
    its cooldown, whatever the total."""
    cfg = OptimConfig(schedule="wsd", warmup_steps=5).with_options(WSDOptions(decay_fraction=0.25))
    short, long = 40, 400
    assert [scheduled_lr(cfg, s, short) for s in range(30)] == [scheduled_lr(cfg, s, long) for s in range(30)]
    assert decay_steps(cfg, short) == 10 and decay_steps(cfg, long) == 100
    assert decay_steps(OptimConfig(schedule="wsd"), 100) == 20  # the default: 0.2 of the run
    assert decay_steps(OptimConfig(schedule="wsd").with_options(WSDOptions(decay_steps=7)), 100) == 7
    # OrScale-LM calibrates at the first step with lr > 0: the first, as with cosine
    assert scheduled_lr(cfg, 0, short) > 0


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(schedule="step"), "optim.schedule must be one of cosine, wsd"),
        (dict(decay_fraction=0.2, decay_steps=5), "set one"),
        (dict(decay_fraction=1.5), "optim.wsd.decay_fraction must be in (0, 1]"),
        (dict(decay_steps=0), "optim.wsd.decay_steps must be >= 1"),
        (dict(decay_shape="exp"), "optim.wsd.decay_shape must be one of linear, 1-sqrt, cosine"),
    ],
)
def test_impossible_schedules_are_one_line(kw, message):
    with pytest.raises(OptimConfigError) as err:
        schedule_of(kw["schedule"]) if "schedule" in kw else WSDOptions(**kw)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_cooldown_that_does_not_fit_the_run_is_one_line():
    check_schedule(
        OptimConfig(schedule="wsd", warmup_steps=10).with_options(WSDOptions(decay_steps=20)), 30
    )  # fits exactly
    with pytest.raises(OptimConfigError, match=r"warmup \(10\) and cooldown \(21 steps\) take more than the run's 30"):
        check_schedule(OptimConfig(schedule="wsd", warmup_steps=10).with_options(WSDOptions(decay_steps=21)), 30)
    check_schedule(OptimConfig(warmup_steps=50), 30)  # cosine: a long warmup is a warning elsewhere
