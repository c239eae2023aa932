"""The sweep's planner (`lr_search`): extend an edge optimum, then the seeds at the best LR; lr_from;
the plan decided from the logs alone. Fake run states: no training here."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from launch.sweep.plan import plan, write_plan
from launch.sweep.spec import SpecError, load_sweep
from records.points import PLAN_FILE


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


def test_extensions_are_the_edge_times_a_power_of_the_factor_so_rounding_never_compounds(tmp_path):
    sweep = _sweep(tmp_path, optimizers={"adamw": [1e-2, 3e-2, 1e-1]})  # factor sqrt(10)
    losses = {("s1", lr, 0): 10 - lr for lr in (1e-2, 3e-2, 1e-1, 0.3162)}  # the high edge keeps winning
    assert _ids(plan(sweep, _states(losses)).cells)[-1] == "s1/adamw/lr1-seed0"  # not lr0.9999


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


# ---------------------------------------------------------------- two LRs
def _surface(lr0: float, alr0: float):
    """A state function whose every run finished, with a bowl in (log lr, log adamw_lr) at (lr0, alr0)."""

    def state(cell):
        alr = cell.adamw_lr if cell.adamw_lr is not None else cell.lr
        loss = 4 + math.log2(cell.lr / lr0) ** 2 + 0.5 * math.log2(alr / alr0) ** 2 + 0.001 * cell.seed
        return True, loss

    return state


def _two_d(tmp_path, rounds=2, **more):
    search = {"seed": 0, "max_extra": 2, "adamw_lr": {"ratios": [2, 4, 8], "rounds": rounds}, "shared": True}
    optimizers = {"adamw": [1e-3, 2e-3, 4e-3, 8e-3], "orscale_lm": [1e-3, 2e-3, 4e-3, 8e-3]}
    optimizers["orscale_lm_transfer"] = {"name": "orscale_lm", "lr_from": "adamw"}
    return _sweep(tmp_path, lr_search=search, optimizers=optimizers, **more)


def test_the_two_dimensional_search_finds_an_untied_optimum_with_no_edge(tmp_path):
    """The shared line (adamw_lr = lr) finds 2e-3 for a bowl at (lr 1e-3, adamw_lr 8e-3); the adamw_lr
    line at 2e-3 then the LR line at its best move to the bowl; a second round confirms it."""
    sweep = _two_d(tmp_path)
    p = plan(sweep, _surface(1e-3, 8e-3))
    gp = p.groups["s1/adamw"]
    assert gp.lrs == [1e-3, 2e-3, 4e-3, 8e-3] and gp.shared_lr is not None
    assert (gp.best_lr, gp.best_adamw_lr) == (1e-3, 8e-3) and not gp.at_edge, gp
    assert (1e-3, 8e-3) in gp.points and (2e-3, 1.6e-2) in gp.points  # the adamw_lr line ran at the shared best
    ids = set(_ids(p.cells))
    assert {f"s1/adamw/lr0.001-alr0.008-seed{s}" for s in (1, 2, 3)} <= ids  # the tuned point's seeds
    assert {f"s1/adamw/lr{gp.shared_lr:.6g}-seed{s}" for s in (1, 2, 3)} <= ids  # and the shared point's
    transfer = p.groups["s1/orscale_lm_transfer"]  # no search: adamw's best point, the seeds only
    assert (transfer.best_lr, transfer.best_adamw_lr) == (1e-3, 8e-3)
    assert sorted(c.id for c in p.cells if "transfer" in c.id and c.scale == "s1") == [
        f"s1/orscale_lm_transfer/lr0.001-alr0.008-seed{s}" for s in (1, 2, 3)
    ]
    long = p.groups["s1-long/adamw"]  # another budget: the searched scale's best and shared points
    assert (long.best_lr, long.best_adamw_lr, long.shared_lr) == (1e-3, 8e-3, gp.shared_lr)
    cell = next(c for c in p.cells if c.id == "s1/adamw/lr0.001-alr0.008-seed1")
    assert "optim.adamw_lr=0.008" in cell.overrides and cell.run_dir.name == "lr0.001-alr0.008-seed1"


def test_a_tied_optimum_stays_tied_and_its_cells_are_the_shared_ones(tmp_path):
    p = plan(_two_d(tmp_path), _surface(2e-3, 2e-3))
    gp = p.groups["s1/adamw"]
    assert (gp.best_lr, gp.best_adamw_lr, gp.shared_lr) == (2e-3, None, 2e-3)
    assert (2e-3, 1e-3) in gp.points  # the adamw_lr line was extended below ratio 1
    assert not any("alr" in c.id and c.seed != 0 for c in p.cells if c.optim == "adamw")


def test_the_adamw_lr_line_is_edge_extended_and_an_edge_is_reported(tmp_path):
    p = plan(_two_d(tmp_path, rounds=1), _surface(2e-3, 1.0))  # the bowl far beyond every ratio
    gp = p.groups["s1/adamw"]
    assert gp.at_edge and "adamw_lr still at the high edge" in gp.note
    top = max(a for _, a in gp.points if a is not None)
    assert top == pytest.approx(32 * gp.lrs[-1] if gp.shared_lr == gp.lrs[-1] else 32 * gp.shared_lr, rel=1e-3)


def test_the_plan_json_records_both_lrs(tmp_path):
    sweep = _two_d(tmp_path)
    p = plan(sweep, _surface(1e-3, 8e-3))
    write_plan(sweep, p)
    doc = json.loads((sweep.runs_dir / PLAN_FILE).read_text())
    assert doc["lr_search"]["adamw_ratios"] == [2.0, 4.0, 8.0] and doc["lr_search"]["shared"] is True
    g = doc["groups"]["s1/adamw"]
    assert (g["best_lr"], g["best_adamw_lr"]) == (1e-3, 8e-3) and [1e-3, 8e-3] in g["points"]
    assert doc["groups"]["s1/orscale_lm_transfer"]["lr_from_optim"] == "adamw"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"lr_search": {"seed": 0, "adamw_lr": {"ratios": [1, 2]}}}, "1 is the shared protocol's point"),
        ({"lr_search": {"seed": 0, "adamw_lr": {"ratios": [2], "rounds": 0}}}, "rounds must be an integer >= 1"),
        ({"lr_search": {"seed": 0, "shared": True}}, "needs lr_search.adamw_lr"),
        ({"optimizers": {"adamw": [1e-3], "t": {"name": "adamw", "lr_from": "nope"}}}, "not another searched"),
    ],
)
def test_bad_two_dimensional_search_specs_are_one_line(tmp_path, change, message):
    with pytest.raises(SpecError, match=message):
        _sweep(tmp_path, **change)
