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
group), which `launch.report` reads to keep LR selection and scoring on different seeds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from launch.sweep.spec import Cell, CellGroup, Sweep

PLAN_FILE = "sweep_plan.json"
State = Callable[[Cell], tuple[bool, float | None]]  # (finished, final val loss)


Point = tuple[float, float | None]  # (optim.lr, optim.adamw_lr); None: adamw_lr unset (= lr)


@dataclass
class GroupPlan:
    lrs: list[float]  # every LR tried (or to try) with adamw_lr unset on the search seed, ascending
    best_lr: float | None = None  # decided once every search run finished
    at_edge: bool = False  # the best point is still at an edge of a line (max_extra reached)
    note: str = ""
    best_adamw_lr: float | None = None  # the best point's adamw_lr (None: unset, = best_lr)
    shared_lr: float | None = None  # the best LR with adamw_lr unset (step 2), when scored on its own
    points: list[Point] = field(default_factory=list)  # every point of the search seed, in search order

    @property
    def best(self) -> Point | None:
        return None if self.best_lr is None else (self.best_lr, self.best_adamw_lr)


@dataclass
class Plan:
    cells: list[Cell] = field(default_factory=list)  # every cell known now, finished or not, in order
    waiting: list[str] = field(default_factory=list)  # what cannot be planned yet, and why
    groups: dict[str, GroupPlan] = field(default_factory=dict)

    def to_json(self, sweep: Sweep) -> dict[str, Any]:
        search = sweep.search
        return {
            "sweep": str(sweep.path),
            "lr_search": None
            if search is None
            else {
                "seed": search.seed,
                "max_extra": search.max_extra,
                "factor": search.factor,
                "adamw_ratios": list(search.adamw_ratios),
                "rounds": search.rounds,
                "shared": search.shared,
            },
            "seeds": sweep.seeds,
            "groups": {
                gid: {
                    "lrs": gp.lrs,
                    "best_lr": gp.best_lr,
                    "best_adamw_lr": gp.best_adamw_lr,
                    "shared_lr": gp.shared_lr,
                    "points": [list(pt) for pt in gp.points],
                    "at_edge": gp.at_edge,
                    "note": gp.note,
                    "lr_from": next((g.lr_from for g in sweep.groups if g.id == gid), None),
                    "lr_from_optim": next((g.lr_from_optim for g in sweep.groups if g.id == gid), None),
                }
                for gid, gp in self.groups.items()
            },
        }


def _factor(sweep: Sweep, g: CellGroup) -> float:
    if sweep.search is not None and sweep.search.factor is not None:
        return sweep.search.factor
    lrs = sorted(g.lrs)
    if len(lrs) < 2:
        return 2.0
    return math.exp(math.log(lrs[-1] / lrs[0]) / (len(lrs) - 1))  # the grid's geometric step


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def _point(lr: float, adamw_lr: float) -> Point:
    """The cell of (lr, adamw_lr): adamw_lr equal to lr is the unset (shared) cell, not a copy of it."""
    return (lr, None if math.isclose(adamw_lr, lr, rel_tol=1e-9) else adamw_lr)


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
    while True:
        states = [loss(v) for v in values]
        if not all(done for done, _ in states):
            return _Line(values)
        got = {
            v: (x if x is not None and math.isfinite(x) else math.inf) for v, (_, x) in zip(values, states, strict=True)
        }
        if all(math.isinf(x) for x in got.values()):
            return _Line(values, diverged=True)
        best = min(values, key=lambda v: (got[v], v))
        edge = (
            "low"
            if best == values[0] and len(values) > 1
            else "high"
            if best == values[-1] and len(values) > 1
            else None
        )
        if edge is None:
            return _Line(values, best)
        if used[edge] >= extra:
            return _Line(values, best, edge)
        used[edge] += 1
        values = [_round(values[0] / factor), *values] if edge == "low" else [*values, _round(values[-1] * factor)]


def _search(sweep: Sweep, g: CellGroup, state: State, plan: Plan) -> GroupPlan:
    assert sweep.search is not None
    search, factor = sweep.search, _factor(sweep, g)
    seed, extra = search.seed, search.max_extra

    def loss(point: Point) -> tuple[bool, float | None]:
        return state(g.cell(point[0], seed, point[1]))

    gp = GroupPlan(sorted(g.lrs))
    shared = _line(g.lrs, lambda lr: loss((lr, None)), factor, extra)
    gp.lrs, gp.points = shared.values, [(lr, None) for lr in shared.values]
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
        values = (
            [lr, *(_round(lr * r) for r in search.adamw_ratios)]
            if round_ == 0
            else [_round(adamw / factor), adamw, _round(adamw * factor)]
        )
        line = _line(values, lambda a, lr=lr: loss(_point(lr, a)), factor, extra)
        gp.points += [_point(lr, a) for a in line.values]
        if line.best is None:
            plan.waiting.append(waiting)
            return gp
        adamw, edges["adamw_lr"] = line.best, line.edge
        line = _line(
            [_round(lr / factor), lr, _round(lr * factor)], lambda x, a=adamw: loss(_point(x, a)), factor, extra
        )
        gp.points += [_point(x, adamw) for x in line.values]
        if line.best is None:
            plan.waiting.append(waiting)
            return gp
        lr, edges["LR"] = line.best, line.edge
        if (lr, adamw) == start:
            break
    gp.best_lr, gp.best_adamw_lr = _point(lr, adamw)
    gp.points = list(dict.fromkeys(gp.points))
    edge = [f"{name} still at the {side} edge" for name, side in edges.items() if side]
    gp.at_edge = bool(edge)
    gp.note = f"best {' and '.join(edge)} after {extra} extensions" if edge else ""
    return gp


def plan(sweep: Sweep, state: State) -> Plan:
    """Every cell that can be known from the logs now (see the module docstring)."""
    out = Plan()
    if sweep.search is None:
        out.cells = sweep.cells
        for g in sweep.groups:
            out.groups[g.id] = GroupPlan(sorted(g.lrs))
        return out
    seed = sweep.search.seed
    for g in sweep.groups:
        if g.searched:
            gp = out.groups[g.id] = _search(sweep, g, state, out)
            out.cells += [g.cell(lr, seed, alr) for lr, alr in gp.points]
            for point in (gp.best, (gp.shared_lr, None) if gp.shared_lr is not None else None):
                if point is not None and gp.best is not None:
                    out.cells += [g.cell(point[0], s, point[1]) for s in sweep.seeds]
    for g in sweep.groups:  # lr_from: another scale's and/or another optimizer's best point
        if g.searched:
            continue
        source_id = f"{g.lr_from or g.scale}/{g.lr_from_optim or g.optim}"
        source = out.groups.get(source_id)
        if source is None or source.best is None:
            out.waiting.append(f"{g.id}: waits for the best LR of {source_id}")
            out.groups[g.id] = GroupPlan([])
            continue
        lr, alr = source.best
        note = f"LRs from {source_id}"
        out.groups[g.id] = GroupPlan([lr], lr, source.at_edge, note, alr, points=[(lr, alr)])
        out.cells += [g.cell(lr, s, alr) for s in sweep.seeds]
        if source.shared_lr is not None and g.lr_from_optim is None:  # a token budget: its shared point too
            out.groups[g.id].shared_lr = source.shared_lr
            out.cells += [g.cell(source.shared_lr, s) for s in sweep.seeds]
    unique: dict[str, Cell] = {}
    for c in out.cells:
        unique.setdefault(c.id, c)
    out.cells = list(unique.values())
    return out


def write_plan(sweep: Sweep, p: Plan) -> None:
    sweep.runs_dir.mkdir(parents=True, exist_ok=True)
    tmp = sweep.runs_dir / (PLAN_FILE + ".tmp")
    tmp.write_text(json.dumps(p.to_json(sweep), indent=1))
    tmp.replace(sweep.runs_dir / PLAN_FILE)
