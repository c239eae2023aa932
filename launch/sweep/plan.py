"""Which cells of a sweep can run now, decided from the logs alone (so a re-run continues any sweep).

Without `lr_search`: every LR x seed of every (scale, optimizer), all at once. With it, per group:
1. the LR grid on the search seed;
2. once those runs finished: if the lowest final validation loss is at an edge of the LRs tried,
   one more LR beyond that edge (factor x the edge LR), at most `max_extra` times per edge;
3. then the evaluation seeds at the best LR; groups with `lr_from` take that scale's best LR.
A diverged run (non-finite final loss) counts as the worst. Ties go to the lower LR.

The plan is written to `runs_dir/sweep_plan.json` (search seed, seeds, LRs tried, best LR per
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


@dataclass
class GroupPlan:
    lrs: list[float]  # every LR tried (or to try) on the search seed, ascending
    best_lr: float | None = None  # decided once every search run finished
    at_edge: bool = False  # the best LR is still at an edge (max_extra reached)
    note: str = ""


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
            else {"seed": search.seed, "max_extra": search.max_extra, "factor": search.factor},
            "seeds": sweep.seeds,
            "groups": {
                gid: {
                    "lrs": gp.lrs,
                    "best_lr": gp.best_lr,
                    "at_edge": gp.at_edge,
                    "note": gp.note,
                    "lr_from": next((g.lr_from for g in sweep.groups if g.id == gid), None),
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


def _search(sweep: Sweep, g: CellGroup, state: State, plan: Plan) -> GroupPlan:
    assert sweep.search is not None
    seed, factor = sweep.search.seed, _factor(sweep, g)
    lrs, extra = sorted(g.lrs), {"low": 0, "high": 0}
    while True:
        states = [state(g.cell(lr, seed)) for lr in lrs]
        if not all(done for done, _ in states):
            plan.waiting.append(f"{g.id}: the evaluation seeds wait for the LR search on seed {seed}")
            return GroupPlan(lrs)
        loss = {
            lr: (v if v is not None and math.isfinite(v) else math.inf) for lr, (_, v) in zip(lrs, states, strict=True)
        }
        if all(math.isinf(v) for v in loss.values()):
            return GroupPlan(lrs, note="every LR diverged")
        best = min(lrs, key=lambda lr: (loss[lr], lr))
        edge = "low" if best == lrs[0] else "high" if best == lrs[-1] else None
        if edge is None:
            return GroupPlan(lrs, best)
        if extra[edge] >= sweep.search.max_extra:
            return GroupPlan(
                lrs, best, at_edge=True, note=f"best LR still at the {edge} edge after {extra[edge]} extensions"
            )
        extra[edge] += 1
        lrs = [float(f"{lrs[0] / factor:.4g}"), *lrs] if edge == "low" else [*lrs, float(f"{lrs[-1] * factor:.4g}")]


def plan(sweep: Sweep, state: State) -> Plan:
    """Every cell that can be known from the logs now (see the module docstring)."""
    out = Plan()
    if sweep.search is None:
        out.cells = sweep.cells
        for g in sweep.groups:
            out.groups[g.id] = GroupPlan(sorted(g.lrs))
        return out
    for g in sweep.groups:
        if g.lr_from is None:
            gp = out.groups[g.id] = _search(sweep, g, state, out)
            out.cells += [g.cell(lr, sweep.search.seed) for lr in gp.lrs]
            if gp.best_lr is not None:
                out.cells += [g.cell(gp.best_lr, s) for s in sweep.seeds]
    for g in sweep.groups:
        if g.lr_from is not None:
            source = out.groups.get(f"{g.lr_from}/{g.optim}")
            if source is None or source.best_lr is None:
                out.waiting.append(f"{g.id}: waits for the best LR of {g.lr_from}/{g.optim}")
                out.groups[g.id] = GroupPlan([])
                continue
            out.groups[g.id] = GroupPlan([source.best_lr], source.best_lr, source.at_edge, f"LR from {g.lr_from}")
            out.cells += [g.cell(source.best_lr, s) for s in sweep.seeds]
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
