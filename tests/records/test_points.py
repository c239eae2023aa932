"""What the sweep writes and the report reads back (records/points.py): points, run names, the best
point and grid-edge rule, the plan file; and a run's shape read from its own records."""

from __future__ import annotations

import json
import math

import yaml

from records.points import GroupPlan, SweepPlan, best, edge, parse_run_name, point, run_name
from records.read import read_run
from report.runs import PAPER_SETUP, _shape, build_rows
from tests.helpers import ROOT


def test_run_names_round_trip_and_a_tied_point_is_the_unset_one():
    assert point(1e-3) == point(1e-3, 1e-3) == (1e-3, 1e-3)
    assert run_name(point(1e-3), 2) == "lr0.001-seed2" and run_name(point(1e-3, 8e-3), 0) == "lr0.001-alr0.008-seed0"
    for p, seed in ((point(2.5e-4), 1), (point(1e-5, 3.2e-2), 0), (point(0.016, 0.016000001), 3)):
        assert parse_run_name(run_name(p, seed)) == (p, seed)
    assert parse_run_name("lr0.001-seed") is None and parse_run_name("checkpoints") is None


def test_the_best_point_counts_divergence_as_worst_and_breaks_ties_low():
    assert best({1e-3: 5.0, 2e-3: 4.0, 4e-3: math.nan}) == 2e-3
    assert best({1e-3: 4.0, 2e-3: 4.0}) == 1e-3 and best({1e-3: None, 2e-3: math.nan}) == 1e-3
    assert best({}) is None
    assert edge([1, 2, 3], 1) == "low" and edge([1, 2, 3], 3) == "high" and edge([1, 2, 3], 2) is None
    assert edge([1], 1) is None


def test_the_plan_file_round_trips_with_unset_as_null(tmp_path):
    gp = GroupPlan([1e-3, 2e-3], point(1e-3, 8e-3), points=[point(1e-3), point(1e-3, 8e-3)], note="x")
    SweepPlan({"s/adamw": gp, "s/t": GroupPlan(lr_from_optim="adamw")}, [1, 2], {"seed": 0}).write(tmp_path)
    doc = json.loads((tmp_path / "sweep_plan.json").read_text())
    assert doc["groups"]["s/adamw"]["points"] == [[1e-3, None], [1e-3, 8e-3]]
    back = SweepPlan.read(tmp_path)
    assert back is not None and back.search_seed == 0 and back.groups["s/adamw"] == gp
    assert back.groups["s/t"].lr_from_optim == "adamw" and GroupPlan(best=point(2e-3)).best_adamw_lr is None
    (tmp_path / "sweep_plan.json").write_text("{torn")
    assert SweepPlan.read(tmp_path) is None


def test_the_papers_setups_are_the_configs(tmp_path):
    for scale, setup in PAPER_SETUP.items():
        cfg = yaml.safe_load((ROOT / "configs" / f"{scale}.yaml").read_text())
        assert {k: cfg[k.split(".")[0]][k.split(".")[1]] for k in setup} == setup, scale


def _run(tmp_path, model: dict, setup: str = "") -> object:
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"model": model, "train": {"max_steps": 1}}))
    (tmp_path / "run.log").write_text(f"x INFO setup: {setup}\n" if setup else "")
    return read_run(tmp_path)


def test_a_runs_shape_comes_from_its_records(tmp_path):
    """config.yaml's model keys, else run.log's setup line (the resolved model); nothing else is read."""
    run = _run(tmp_path, {"preset": "tiny", "n_layer": None, "d_model": None})
    assert _shape(run) == (None, None)  # neither record has it: the report does not read models/
    run = _run(tmp_path, {"preset": "tiny", "d_model": 64, "n_head": 2})
    assert _shape(run) == (None, 64)
    logged = '{"params": 10, "model": {"n_layer": 3, "d_model": 32, "vocab_size": 100}}'
    run = _run(tmp_path, {"preset": "tiny"}, logged)
    assert _shape(run) == (3, 32)
    assert build_rows([run]) == []  # unfinished: no row
