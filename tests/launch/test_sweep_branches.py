"""Token budgets as cooldown branches in a sweep (launch/sweep/branches.py): the parent scale
saves where its branches start, each branch cell starts there and equals the run of its budget given
the same schedule from step 0, the report reads branches like full runs and names the protocol, and
the sweep file's mistakes are one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from launch.sweep import sweep_cli as sweep
from launch.sweep.spec import SpecError, load_sweep
from report import build as report
from tests.helpers import metrics, train_in_pool, train_losses
from tests.launch.test_sweep_report import COMMON, write_sweep

PARENT = {"label": "w", "model.n_layer": 1, "model.d_model": 32, "model.n_head": 2, "train.max_steps": 16}
PARENT |= {"optim.schedule": "wsd", "optim.decay_fraction": 0.25}
BRANCH = {"label": "w-8", "branch_of": "w", "train.max_steps": 8}


def _spec(tmp_path: Path, scales: list[dict]) -> Path:
    return write_sweep(
        tmp_path / "s.yaml", tmp_path / "runs", scales=scales, optimizers=["orscale_lm"], lrs=[3e-3], seeds=[0]
    )


@pytest.mark.slow
def test_a_branch_scale_runs_cooldown_branches_that_equal_their_budgets_run(tmp_path):
    assert sweep.main([str(_spec(tmp_path, [PARENT, BRANCH]))]) == 0
    runs = tmp_path / "runs"
    parent, branch = runs / "w/orscale_lm/lr0.003-seed0", runs / "w-8/orscale_lm/lr0.003-seed0"
    p_cfg, b_cfg = (yaml.safe_load((d / "config.yaml").read_text()) for d in (parent, branch))
    # the branch's cooldown: a quarter of 8 steps, from step 6, where the parent was told to save
    assert p_cfg["train"]["ckpt_at"] == [6] and p_cfg["run"]["keep_checkpoints"] == 0
    assert b_cfg["run"]["init_from"] == str(parent / "checkpoints/step_00000006")
    assert (b_cfg["train"]["max_steps"], b_cfg["optim"]["wsd"]["decay_steps"], b_cfg["optim"]["schedule"]) == (
        8,
        2,
        "wsd",
    )
    assert sorted(train_losses(branch)) == [7, 8]
    # the run of 8 steps with that schedule from step 0
    ref = tmp_path / "ref"
    keys = {**COMMON, **{k: v for k, v in PARENT.items() if k != "label"}, "train.max_steps": 8}
    keys |= {"optim.decay_fraction": None, "optim.decay_steps": 2, "optim.name": "orscale_lm", "optim.lr": 3e-3}
    train_in_pool([f"{k}={'null' if v is None else v}" for k, v in keys.items()] + [f"run.dir={ref}", "train.seed=0"])
    want = train_losses(ref)
    assert train_losses(branch) == {s: want[s] for s in (7, 8)}
    val = lambda d: [m["val_loss"] for m in metrics(d) if "val_loss" in m][-1]  # noqa: E731
    assert val(branch) == val(ref)
    # the report: the budget is a row of its own protocol, the wsd series beside cosine
    report.build_report(runs, tmp_path / "report")
    md = (tmp_path / "report/report.md").read_text()
    assert "w-8 (wsd)" in md and "w (wsd)" in md


@pytest.mark.parametrize(
    "scales, message",
    [
        (
            [{**PARENT, "optim.schedule": "cosine", "optim.decay_fraction": None}, BRANCH],
            "must run optim.schedule: wsd",
        ),
        ([PARENT, {**BRANCH, "branch_of": "nope"}], "branch_of names 'nope', not another scale"),
        ([PARENT, {**BRANCH, "train.max_steps": 40}], "outside the stable phase of 'w'"),
    ],
)
def test_branch_scale_mistakes_are_one_line(tmp_path, scales, message):
    scales = [{k: v for k, v in s.items() if v is not None} for s in scales]
    with pytest.raises(SpecError) as err:
        load_sweep(_spec(tmp_path, scales))
    assert message in str(err.value) and "\n" not in str(err.value)
