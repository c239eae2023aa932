"""Which runs give each group's numbers: the sweep plan (`RUNS_DIR/sweep_plan.json`, records/points.py)
applied to the rows built from the logs.

With an LR search, the best point is chosen on the search seed alone and the numbers come from the
evaluation seeds at that point, so selection never scores itself (a minimum over noisy LRs, re-used
as the score, is biased low). A group still searching, or whose seeds are still running, gets a
status instead of numbers. Without a plan (or without a search) the point is chosen and scored on the
same seeds, and the report says so.

Protocols (a search over both LRs): the row's groups are the *tuned* protocol; `Row.protocols["shared"]`
holds each optimizer's view of the same runs restricted to adamw_lr = lr (chosen the same way, scored
at its own seeds), and `Row.protocols["transfer"]` the groups run at another optimizer's tuned point
(`lr_from` an optimizer: the paper's claim that OrScale-LM inherits Moonlight's LRs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from records.points import GroupPlan, Point, SweepPlan, parse_run_name, point, same, tied
from records.read import RunRecord
from report.fmt import fmt_point
from report.runs import Group, Row

SHARED, TRANSFER = "shared", "transfer"
SEARCHING = ("LR search", "every LR")  # statuses of a group whose search has no result yet


@dataclass
class Pending:
    """A plan group without a finished run yet, and why."""

    sweep_id: str
    status: str


def searched(plan: SweepPlan | None) -> bool:
    return plan is not None and plan.search is not None


def run_sweep_id(r: RunRecord, root: Path) -> str | None:
    """ "<scale>/<optimizer label>" of a run in the sweep layout scale/optim/<run_name>."""
    try:
        parts = r.path.relative_to(root).parts
    except ValueError:
        return None
    return f"{parts[0]}/{parts[1]}" if len(parts) == 3 and parse_run_name(parts[2]) else None


def group_names(runs: list[RunRecord], root: Path, plan: SweepPlan | None) -> dict[Path, str]:
    """Runs of a sweep group that takes another optimizer's LRs (a protocol of its own) keep the
    sweep's label as their group name, so they are not pooled with that optimizer's own runs."""
    if plan is None or not searched(plan):
        return {}
    out = {}
    for r in runs:
        gid = run_sweep_id(r, root)
        if gid is not None and gid in plan.groups and plan.groups[gid].lr_from_optim:
            out[r.path] = gid.split("/", 1)[1]
    return out


def _find(g: Group, p: Point | None) -> Point | None:
    return next((q for q in g.points if p and same(q[0], p[0]) and same(q[1], p[1])), None)


def _tied_view(g: Group, seed: int | None = None, eval_seeds: tuple[int, ...] | None = None) -> Group:
    """The shared protocol's view of a group: its runs with adamw_lr = lr."""
    keep = [tied(p) for p in zip(g.table["lr"], g.table["adamw_lr"], strict=True)]
    return Group(g.name, g.table[keep], seed, eval_seeds, sweep_id=g.sweep_id)


def _search_status(g: Group, pg: GroupPlan, seed: int) -> str:
    tried = pg.tried()
    done = [p for p in tried if (q := _find(g, p)) is not None and seed in set(g.runs_at(q)["seed"])]
    progress = f"({len(done)}/{len(tried)} points finished on seed {seed})"
    if pg.best is None and pg.note != "every LR diverged":
        return f"LR search running {progress}"
    if len(done) < len(tried):
        return f"LR search incomplete {progress}"
    return "every LR diverged on the search seed" if pg.note == "every LR diverged" else "done"


def _seeds_status(g: Group, eval_seeds: tuple[int, ...]) -> str:
    have = set(g.runs_at(g.best)["seed"]) & set(eval_seeds)
    if len(have) < len(eval_seeds):
        at = fmt_point(g.best) if g.best is not None else "—"
        return f"evaluation seeds running ({len(have)}/{len(eval_seeds)} finished at LR {at})"
    return "done"


def _pending_status(pg: GroupPlan, seed: int) -> str:
    if pg.lr_from:
        return (
            f"waiting for the LR search at {pg.lr_from}" if pg.best is None else "evaluation seeds running (0 finished)"
        )
    return f"LR search running (0/{len(pg.tried())} points finished on seed {seed})"


def apply_plan(rows: list[Row], root: Path, plan: SweepPlan | None) -> list[Pending]:
    """Give each group its selection (search seed, evaluation seeds, lr_from) and status from the
    plan, build the protocol views (module docstring); return the plan's groups that have no
    finished run at all (shown as pending, never as numbers)."""
    by_id: dict[str, tuple[Row, Group]] = {}
    for row in rows:
        for g in row.groups.values():
            g.sweep_id = next((i for r in g.table["run"] if (i := run_sweep_id(r, root))), None)
            if g.sweep_id is not None:
                by_id.setdefault(g.sweep_id, (row, g))
                row.sweep_scale = row.sweep_scale or g.sweep_id.split("/")[0]
    if plan is None or plan.search_seed is None:
        return []
    seed = plan.search_seed
    eval_seeds = tuple(s for s in plan.seeds if s != seed) or (seed,)
    shared = bool((plan.search or {}).get("shared"))
    for gid, (row, g) in by_id.items():  # searched groups first: lr_from groups read their result
        pg = plan.groups.get(gid)
        if pg is None or pg.lr_from or pg.lr_from_optim:
            continue
        g = row.groups[g.name] = replace(g, select_seed=seed, eval_seeds=eval_seeds)
        by_id[gid] = (row, g)
        g.status = _search_status(g, pg, seed)
        if g.status == "done":
            g.status = _seeds_status(g, eval_seeds)
        if shared:
            view = _tied_view(g, seed, eval_seeds)
            view.status = g.status if g.status.startswith(SEARCHING) else _seeds_status(view, eval_seeds)
            row.protocols.setdefault(SHARED, {})[g.name] = view
    for gid, (row, g) in by_id.items():
        pg = plan.groups.get(gid)
        if pg is None or not (pg.lr_from or pg.lr_from_optim):
            continue
        scale, optim = gid.split("/", 1)
        src_id = f"{pg.lr_from or scale}/{pg.lr_from_optim or optim}"
        src, src_plan = by_id.get(src_id, (None, None))[1], plan.groups.get(src_id) or GroupPlan()
        views = [(False, g)] + ([(True, _tied_view(g))] if shared and not pg.lr_from_optim else [])
        for tied_only, group in views:
            if src is None or src.status.startswith(SEARCHING):
                group = replace(group, eval_seeds=eval_seeds)
                group.status = f"waiting for the LR search at {src_id}"
            else:
                shared_point = None if src_plan.shared_lr is None else point(src_plan.shared_lr)
                fixed = _find(group, shared_point if tied_only else src_plan.best)
                group = replace(group, eval_seeds=eval_seeds, fixed=fixed, inherited_edge=src.edge)
                group.status = (
                    _seeds_status(group, eval_seeds) if fixed is not None else f"no run yet at {src_id}'s best point"
                )
            if tied_only:
                row.protocols.setdefault(SHARED, {})[g.name] = group
            elif pg.lr_from_optim:  # another optimizer's tuned point: a protocol of its own
                del row.groups[g.name]
                row.protocols.setdefault(TRANSFER, {})[optim] = group
            else:
                row.groups[g.name] = group
    # The headline's groups only: a protocol's group without runs yet is simply absent from its section.
    return [
        Pending(gid, _pending_status(pg, seed))
        for gid, pg in plan.groups.items()
        if gid not in by_id and not pg.lr_from_optim
    ]
