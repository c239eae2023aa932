"""Which cells of a sweep can run now, decided from the logs alone (so a re-run continues any sweep).

Without `lr_search`: every LR x seed of every (scale, optimizer), all at once. With it, per group:
1. the LR grid on the search seed, optim.adamw_lr unset (= lr: the *shared* protocol's search);
2. once those runs finished: if the lowest final validation loss is at an edge of the LRs tried,
   one more LR beyond that edge (factor x the edge LR), at most `max_extra` times per edge;
3. with `lr_search.adamw_lr` (a coordinate search in two dimensions): a line over adamw_lr =
   ratio x the best LR at that LR (ratio 1 is step 1's point), then a line over the LR at the best
   adamw_lr (the best LR / factor, x factor), `rounds` times or until the point stays; each line is
   edge-extended as in step 2;
4. then the evaluation seeds at the best point (and, with `shared`, at step 2's best LR too);
   groups with `lr_from` take that scale's best point, groups whose optimizer has `lr_from` another
   optimizer's (at the same scale, or at the scale's `lr_from`).
A diverged run (non-finite final loss) counts as the worst. Ties go to the lower LR.

The plan is written to `runs_dir/sweep_plan.json` (search seed, seeds, points tried, best point per
group), which the report reads to keep LR selection and scoring on different seeds; its format, the
points, the run names and the best-point rule are records/points.py's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from launch.sweep.branches import branch_cell
from launch.sweep.cells import Cell, CellGroup, Sweep
from records.points import GroupPlan, Point, SweepPlan, best, edge, point

State = Callable[[Cell], tuple[bool, float | None]]  # (finished, final val loss)


@dataclass
class Plan:
    cells: list[Cell] = field(default_factory=list)  # every cell known now, finished or not, in order
    waiting: list[str] = field(default_factory=list)  # what cannot be planned yet, and why
    groups: dict[str, GroupPlan] = field(default_factory=dict)

    def file(self, sweep: Sweep) -> SweepPlan:
        """What sweep_plan.json records (records/points.py reads it back)."""
        settings = None if sweep.search is None else dataclasses.asdict(sweep.search)  # lr_search as resolved
        return SweepPlan(self.groups, sweep.seeds, settings, str(sweep.path))


def _factor(sweep: Sweep, g: CellGroup) -> float:
    if sweep.search is not None and sweep.search.factor is not None:
        return sweep.search.factor
    lrs = sorted(g.lrs)
    if len(lrs) < 2:
        return 2.0
    return math.exp(math.log(lrs[-1] / lrs[0]) / (len(lrs) - 1))  # the grid's geometric step


def _round(x: float) -> float:
    return float(f"{x:.4g}")


@dataclass
class _Line:
    """One line search's outcome: None best while runs are missing."""

    values: list[float]
    best: float | None = None
    edge: str | None = None  # "low" / "high": the best is still there after every extension
    diverged: bool = False


def _line(values: list[float], loss: Callable[[float], tuple[bool, float | None]], factor: float, extra: int) -> _Line:
    """Minimise along one axis: `values` (ascending), extended past an edge optimum by `factor` up
    to `extra` times per edge; stops at the first value whose run has not finished."""
    values, used = sorted(values), {"low": 0, "high": 0}
    low, high = values[0], values[-1]  # extensions are edge x factor^k: rounding never compounds
    while True:
        states = [loss(v) for v in values]
        if not all(done for done, _ in states):
            return _Line(values)
        got = {v: x for v, (_, x) in zip(values, states, strict=True)}
        if not any(x is not None and math.isfinite(x) for x in got.values()):
            return _Line(values, diverged=True)
        at = best(got)
        side = edge(values, at)
        if side is None:
            return _Line(values, at)
        if used[side] >= extra:
            return _Line(values, at, side)
        used[side] += 1
        k = used[side]
        values = [_round(low / factor**k), *values] if side == "low" else [*values, _round(high * factor**k)]


def _search(sweep: Sweep, g: CellGroup, state: State, plan: Plan) -> GroupPlan:
    assert sweep.search is not None
    search, factor = sweep.search, _factor(sweep, g)
    seed, extra = search.seed, search.max_extra

    def loss(p: Point) -> tuple[bool, float | None]:
        return state(g.cell(p, seed))

    def around(v: float) -> list[float]:
        return [_round(v / factor), v, _round(v * factor)]

    gp = GroupPlan(sorted(g.lrs))
    shared = _line(g.lrs, lambda lr: loss(point(lr)), factor, extra)
    gp.lrs, gp.points = shared.values, [point(lr) for lr in shared.values]
    waiting = f"{g.id}: the evaluation seeds wait for the LR search on seed {seed}"
    if shared.diverged:
        gp.note = "every LR diverged"
        return gp
    if shared.best is None:
        plan.waiting.append(waiting)
        return gp
    edges = {"LR": shared.edge}
    lr, adamw = shared.best, shared.best
    gp.shared_lr = shared.best if search.shared else None
    for round_ in range(search.rounds if search.adamw_ratios else 0):
        start = (lr, adamw)
        # The first line spans the ratios given (ratio 1 is the shared point); later ones step around.
        values = [lr, *(_round(lr * r) for r in search.adamw_ratios)] if round_ == 0 else around(adamw)
        line = _line(values, partial(lambda lr_, a: loss(point(lr_, a)), lr), factor, extra)
        gp.points += [point(lr, a) for a in line.values]
        if line.best is None:
            plan.waiting.append(waiting)
            return gp
        adamw, edges["adamw_lr"] = line.best, line.edge
        line = _line(around(lr), partial(lambda a, x: loss(point(x, a)), adamw), factor, extra)
        gp.points += [point(x, adamw) for x in line.values]
        if line.best is None:
            plan.waiting.append(waiting)
            return gp
        lr, edges["LR"] = line.best, line.edge
        if (lr, adamw) == start:
            break
    gp.best = point(lr, adamw)
    gp.points = list(dict.fromkeys(gp.points))
    at = [f"{name} still at the {side} edge" for name, side in edges.items() if side]
    gp.at_edge = bool(at)
    gp.note = f"best {' and '.join(at)} after {extra} extensions" if at else ""
    return gp


def plan(sweep: Sweep, state: State) -> Plan:
    """Every cell that can be known from the logs now (see the module docstring)."""
    out = Plan()
    if sweep.search is None:
        out.cells = [c for c in sweep.cells if _group(sweep, c).branch_of is None]
        out.groups = {g.id: GroupPlan(sorted(g.lrs)) for g in sweep.groups}
        for g in (g for g in sweep.groups if g.branch_of is not None):
            _add_branches(sweep, g, [point(lr) for lr in g.lrs], out)
        return out
    seed = sweep.search.seed
    for g in sweep.groups:
        if g.searched:
            gp = out.groups[g.id] = _search(sweep, g, state, out)
            out.cells += [g.cell(p, seed) for p in gp.points]
            for p in (gp.best, point(gp.shared_lr) if gp.shared_lr is not None else None):
                if p is not None and gp.best is not None:
                    out.cells += [g.cell(p, s) for s in sweep.seeds]
    later = sorted((g for g in sweep.groups if not g.searched), key=lambda g: g.branch_of is not None)
    for g in later:  # lr_from: another scale's and/or another optimizer's best point; branches: the parent's
        if g.branch_of is not None:
            parent = out.groups.get(f"{g.branch_of}/{g.optim}")
            chosen = [] if parent is None or parent.best is None else [parent.best]
            if parent is not None and parent.shared_lr is not None and parent.best is not None:
                chosen.append(point(parent.shared_lr))
            out.groups[g.id] = GroupPlan([p[0] for p in chosen], parent.best if parent else None, points=chosen)
            if not chosen:
                out.waiting.append(f"{g.id}: waits for the best LR of {g.branch_of}/{g.optim}")
            _add_branches(sweep, g, chosen, out)
            continue
        source_id = f"{g.lr_from or g.scale}/{g.lr_from_optim or g.optim}"
        source = out.groups.get(source_id)
        if source is None or source.best is None:
            out.waiting.append(f"{g.id}: waits for the best LR of {source_id}")
            out.groups[g.id] = GroupPlan([])
            continue
        b = source.best
        out.groups[g.id] = GroupPlan([b[0]], b, source.at_edge, f"LRs from {source_id}", points=[b])
        out.cells += [g.cell(b, s) for s in sweep.seeds]
        if source.shared_lr is not None and g.lr_from_optim is None:  # a token budget: its shared point too
            out.groups[g.id].shared_lr = source.shared_lr
            out.cells += [g.cell(point(source.shared_lr), s) for s in sweep.seeds]
    for g in sweep.groups:
        out.groups[g.id].lr_from, out.groups[g.id].lr_from_optim = g.lr_from, g.lr_from_optim
    unique: dict[str, Cell] = {}
    for c in out.cells:
        unique.setdefault(c.id, c)
    out.cells = list(unique.values())
    return out


def _group(sweep: Sweep, c: Cell) -> CellGroup:
    return next(g for g in sweep.groups if g.scale == c.scale and g.optim == c.optim)


def _add_branches(sweep: Sweep, g: CellGroup, points: list[Point], out: Plan) -> None:
    """The branch cells of `g` at `points` x the seeds that can run now; the others as waiting lines."""
    for p in points:
        for seed in sweep.seeds:
            cell = branch_cell(sweep, g, p, seed)
            if isinstance(cell, str):
                out.waiting.append(cell)
            else:
                out.cells.append(cell)


def write_plan(sweep: Sweep, p: Plan) -> None:
    p.file(sweep).write(sweep.runs_dir)
