"""A sweep's token budgets as cooldown branches (a scale with `branch_of: <label>`), and the cooldown
rule every branch follows (`cooldown`, shared with the one-run command `python -m launch.branch`).

    scales:
      - {label: s2-wsd, model.n_layer: 3, ..., train.max_steps: 768, optim.schedule: wsd, optim.wsd.decay_fraction: 0.2}
      - {label: s2-wsd-192, branch_of: s2-wsd, train.max_steps: 192}    # a budget: a branch of each s2-wsd cell

Each cell of a branch scale is a cooldown branch (as launch/branch.py makes them) of the parent scale's cell with the
same optimizer, point and seed: the parent's overrides, then the branch scale's own (its budget,
`train.max_steps`), its cooldown over the parent's share of it (`optim.wsd.decay_steps`), and `run.init_from`
the parent cell's checkpoint at that cooldown's first step. The parent scale gets `train.ckpt_at` (its
branches' first cooldown steps) and `run.keep_checkpoints=0` added, and must run `optim.schedule=wsd`.
A branch runs once its parent has written that checkpoint (re-run the sweep: it is planned then), and
takes its parent's points: the LR search's best (and shared) point, or every LR without a search.
"""

from __future__ import annotations

from pathlib import Path

from launch.config import read_config
from launch.nested import as_overrides
from launch.sweep.cells import ROOT, Cell, CellGroup, Sweep
from launch.sweep.spec_values import fail
from orscale.optim_config import OptimConfig
from orscale.registry import SCHEDULES, schedule_of
from orscale.schedule import Cooldown
from records.points import Point, point


def _parent(sweep: Sweep, g: CellGroup) -> CellGroup:
    return next(p for p in sweep.groups if p.scale == g.branch_of and p.optim == g.optim)


def _optim(cell: Cell) -> OptimConfig:
    """The `optim:` section of `cell`'s config, as its train.py reads it."""
    return read_config(str(ROOT / cell.base), cell.overrides).optim


def _schedule_cooldown(cell: Cell) -> Cooldown | None:
    return schedule_of(_optim(cell).schedule).cooldown


def _cooldown(parent_cell: Cell, budget: int) -> tuple[int, int]:
    """(decay steps, first cooldown step) of a branch of `budget` steps of `parent_cell`: the parent's
    cooldown share of it; a branch leaves the run it branches from at its first cooldown step
    (docs/running.md)."""
    optim = _optim(parent_cell)
    cooldown = schedule_of(optim.schedule).cooldown
    assert cooldown is not None, "attach_branches refused a parent without a cooldown"
    decay = cooldown.length(optim, budget)
    return decay, budget - decay


def attach_branches(sweep: Sweep) -> None:
    """Check every `branch_of` and give each parent scale the checkpoints its branches start from."""
    scales = {g.scale for g in sweep.groups}
    branches = [g for g in sweep.groups if g.branch_of is not None]
    for g in branches:
        where = f"scale '{g.scale}'"
        if g.branch_of not in scales or g.branch_of == g.scale:
            fail(f"{where}: branch_of names '{g.branch_of}', not another scale of this sweep")
        parent = _parent(sweep, g)
        if parent.branch_of is not None:
            fail(f"{where}: branch_of names '{g.branch_of}', itself a branch; branch from the wsd run")
        if g.lr_from is not None:
            fail(f"{where}: a branch takes its parent's points; drop lr_from")
        probe = parent.cell(point(1.0), 0)
        if _schedule_cooldown(probe) is None:
            with_one = " or ".join(name for name, s in SCHEDULES.items() if s.cooldown is not None)
            fail(
                f"{where}: its parent '{g.branch_of}' must run optim.schedule: {with_one} (a run of "
                f"optim.schedule={_optim(probe).schedule} has no stable phase)"
            )
        budget = _budget(g)
        decay, first = _cooldown(probe, budget)
        total = int(probe.value("train.max_steps"))
        if first < int(probe.value("optim.warmup_steps", 0)) or first > total - _cooldown(probe, total)[0]:
            fail(
                f"{where}: a {budget}-step budget cools down from step {first}, outside the stable phase of "
                f"'{g.branch_of}'; choose a budget whose cooldown starts after its warmup and before its own"
            )
    for parent in {id(_parent(sweep, g)): _parent(sweep, g) for g in branches}.values():
        probe = parent.cell(point(1.0), 0)
        starts = sorted({_cooldown(probe, _budget(b))[1] for b in branches if _parent(sweep, b) is parent})
        parent.overrides = [
            *(o for o in parent.overrides if not o.startswith(("train.ckpt_at=", "run.keep_checkpoints="))),
            f"train.ckpt_at=[{','.join(map(str, starts))}]",
            "run.keep_checkpoints=0",
        ]
    for g in branches:  # the parent's settings (its checkpoints above included), then the budget's own
        parent = _parent(sweep, g)
        g.lr_from, g.lrs = parent.lr_from, list(parent.lrs)  # the parent's points and LR source
        g.overrides = [*parent.overrides, *[o for o in g.overrides if o not in parent.overrides]]


def _budget(g: CellGroup) -> int:
    steps = next((o.split("=", 1)[1] for o in reversed(g.overrides) if o.startswith("train.max_steps=")), None)
    if steps is None or not steps.isdigit():
        fail(f"scale '{g.scale}': a branch scale gives its budget as train.max_steps")
    return int(steps)


def branch_cell(sweep: Sweep, g: CellGroup, p: Point, seed: int) -> Cell | str:
    """The branch of the parent cell at (`p`, `seed`), or why it cannot run yet (one line)."""
    parent = _parent(sweep, g).cell(p, seed)
    budget = _budget(g)
    decay, first = _cooldown(parent, budget)
    start = parent.run_dir / "checkpoints" / f"step_{first:08d}"
    if not (start / "meta.json").is_file():
        return f"{g.id}: waits for {parent.id}'s checkpoint at step {first}"
    cell = g.cell(p, seed)
    cooldown = _schedule_cooldown(parent)
    assert cooldown is not None, "attach_branches refused a parent without a cooldown"
    branch = [*as_overrides(cooldown.keys(decay, None, None)), f"run.init_from={Path(start)}"]
    cell.overrides = [*cell.overrides[:-1], *branch, cell.overrides[-1]]  # run.dir stays last
    return cell
