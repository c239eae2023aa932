"""optim.schedule=constant (orscale/schedule.py): warmup, then the peak LR to the end, in the table of
schedules and in the trainer's metrics."""

from __future__ import annotations

import pytest

from launch.errors import ConfigError
from launch.loop import main as train_main
from launch.plan import load_config
from orscale import OptimConfig, check_schedule, scheduled_lr
from tests.helpers import SMALL, TINY, metrics


def test_constant_warms_up_then_holds_the_peak() -> None:
    cfg = OptimConfig(schedule="constant", lr=2.0, warmup_steps=4, min_lr_ratio=0.1)
    assert [scheduled_lr(cfg, s, 10) for s in range(6)] == [0.5, 1.0, 1.5, 2.0, 2.0, 2.0]
    assert scheduled_lr(cfg, 9, 10) == 2.0 and scheduled_lr(cfg, 50, 10) == 2.0  # no floor, no decay
    assert scheduled_lr(OptimConfig(schedule="constant", lr=3e-3, warmup_steps=0), 0, 5) == 3e-3
    check_schedule(cfg, 2)  # any run length: warmup longer than the run is a warning elsewhere


def test_constant_is_a_valid_schedule_and_keeps_wsds_keys_out() -> None:
    with pytest.raises(ConfigError, match=r"^optim\.schedule must be one of cosine, wsd, constant, got 'flat'$"):
        load_config(TINY, ["optim.schedule=flat"])
    with pytest.raises(ConfigError, match=r"needs optim.schedule=wsd \(got constant\); set optim.schedule=wsd"):
        load_config(TINY, ["optim.schedule=constant", "optim.wsd.decay_fraction=0.2"])


def test_the_trainer_logs_the_constant_schedule(tmp_path) -> None:
    argv = ["--config", TINY, *SMALL, "train.eval_every=0", f"run.dir={tmp_path}", "train.max_steps=5"]
    assert train_main([*argv, "optim.schedule=constant", "optim.lr=0.002", "optim.warmup_steps=2"]) == 0
    lrs = [m["lr"] for m in metrics(tmp_path) if "train_loss" in m]
    assert lrs == pytest.approx([0.001, 0.002, 0.002, 0.002, 0.002], rel=1e-12)
