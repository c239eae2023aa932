"""The sweep's planner (`lr_search`): extend an edge optimum, then the seeds at the best LR; lr_from;
the plan decided from the logs alone. Fake run states: no training here."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from launch.sweep.plan import PLAN_FILE, plan, write_plan
from launch.sweep.spec import SpecError, load_sweep


def _sweep(tmp_path, **changes):
    doc = {
        "base": "configs/tiny.yaml",
        "runs_dir": str(tmp_path / "runs"),
        "scales": [{"label": "s1", "model.d_model": 64}, {"label": "s1-long", "lr_from": "s1", "train.max_steps": 9}],
        "optimizers": {"adamw": [1e-3, 2e-3, 4e-3]},
        "seeds": [1, 2, 3],
        "lr_search": {"seed": 0, "max_extra": 2},
    }
    doc.update(changes)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_sweep(path)


def _states(losses: dict[tuple[str, float, int], float]):
    """A state function: finished with the given final loss where one is given, else unfinished."""

    def state(cell):
        key = (cell.scale, round(cell.lr, 9), cell.seed)
        return (key in losses, losses.get(key))

    return state


def _ids(cells):
    return [c.id for c in cells]


def test_the_search_runs_first_and_the_seeds_wait(tmp_path):
    sweep = _sweep(tmp_path)
    p = plan(sweep, _states({}))
    assert _ids(p.cells) == ["s1/adamw/lr0.001-seed0", "s1/adamw/lr0.002-seed0", "s1/adamw/lr0.004-seed0"]
    assert any("s1/adamw" in w for w in p.waiting) and any("s1-long/adamw" in w for w in p.waiting)


def test_an_edge_optimum_is_extended_then_the_seeds_run_at_the_interior_best(tmp_path):
    sweep = _sweep(tmp_path)
    losses = {("s1", 1e-3, 0): 5.0, ("s1", 2e-3, 0): 4.5, ("s1", 4e-3, 0): 4.0}  # best at the high edge
    p = plan(sweep, _states(losses))
    assert _ids(p.cells)[-1] == "s1/adamw/lr0.008-seed0" and p.groups["s1/adamw"].best_lr is None
    losses[("s1", 8e-3, 0)] = 4.2  # worse: 4e-3 is now interior
    p = plan(sweep, _states(losses))
    gp = p.groups["s1/adamw"]
    assert gp.best_lr == 4e-3 and not gp.at_edge and gp.lrs == [1e-3, 2e-3, 4e-3, 8e-3]
    seeds = [c for c in p.cells if c.seed != 0]
    assert _ids(seeds) == [f"s1/adamw/lr0.004-seed{s}" for s in (1, 2, 3)] + [
        f"s1-long/adamw/lr0.004-seed{s}" for s in (1, 2, 3)
    ]
    long = next(c for c in p.cells if c.scale == "s1-long")
    assert long.value("train.max_steps") == 9 and long.value("optim.lr") == 4e-3
    write_plan(sweep, p)
    saved = json.loads((sweep.runs_dir / PLAN_FILE).read_text())
    assert saved["lr_search"]["seed"] == 0 and saved["seeds"] == [1, 2, 3]
    assert saved["groups"]["s1/adamw"]["best_lr"] == 4e-3 and saved["groups"]["s1-long/adamw"]["lr_from"] == "s1"


def test_the_extension_stops_at_max_extra_and_says_the_best_is_still_at_the_edge(tmp_path):
    sweep = _sweep(tmp_path)
    losses = {("s1", lr, 0): 10 - 1000 * lr for lr in (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)}  # keeps improving
    gp = plan(sweep, _states(losses)).groups["s1/adamw"]
    assert gp.lrs[-1] == 1.6e-2 and gp.best_lr == 1.6e-2 and gp.at_edge and "high edge" in gp.note


def test_the_low_edge_extends_downwards_and_divergence_counts_as_worst(tmp_path):
    sweep = _sweep(tmp_path)
    losses = {("s1", 1e-3, 0): 4.0, ("s1", 2e-3, 0): 4.4, ("s1", 4e-3, 0): math.nan}
    p = plan(sweep, _states(losses))
    assert _ids(p.cells)[0] == "s1/adamw/lr0.0005-seed0"
    losses = {k: math.nan for k in losses}
    assert plan(sweep, _states(losses)).groups["s1/adamw"].note == "every LR diverged"


def test_without_lr_search_every_lr_runs_every_seed(tmp_path):
    sweep = _sweep(tmp_path, scales=[{"label": "s1"}], lr_search=None)
    assert len(plan(sweep, _states({})).cells) == 9 and plan(sweep, _states({})).waiting == []


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"lr_search": {"seed": 0, "max_extra": -1}}, "lr_search.max_extra"),
        ({"lr_search": {"seed": 0, "fast": 1}}, "unknown lr_search key 'fast'"),
        ({"lr_search": {"seed": 0, "factor": 1}}, "lr_search.factor must be a number > 1"),
        ({"scales": [{"label": "a", "lr_from": "zz"}]}, "lr_from names 'zz'"),
        ({"scales": [{"label": "a"}, {"label": "b", "lr_from": "a"}], "lr_search": None}, "lr_from needs lr_search"),
    ],
)
def test_bad_search_settings_are_one_line_errors(tmp_path, changes, needle):
    with pytest.raises(SpecError, match=needle) as err:
        _sweep(tmp_path, **changes)
    assert "\n" not in str(err.value)
