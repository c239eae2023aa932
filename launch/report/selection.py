"""Which runs give each group's numbers: the sweep's plan (`RUNS_DIR/sweep_plan.json`, written by
launch/sweep/plan.py) applied to the rows built from the logs.

With an LR search (`lr_search` in the plan), the best LR is chosen on the search seed alone and the
numbers come from the evaluation seeds at that LR, so selection never scores itself (a minimum
over noisy LRs, re-used as the score, is biased low). A group still searching, or whose seeds are
still running, gets a status instead of numbers. Without a plan (or without a search) the LR is
chosen and scored on the same seeds, and the report says so.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launch.report.rows import Group, Row

PLAN_FILE = "sweep_plan.json"  # launch.sweep.plan.PLAN_FILE (not imported: the report reads logs only)
_RUN_DIR = re.compile(r"^lr[0-9.e+-]+-seed-?\d+$")


@dataclass
class Pending:
    """A plan group without final numbers: no finished run yet, or one of the statuses below."""

    sweep_id: str
    status: str


def read_plan(runs_dir: Path) -> dict | None:
    """sweep_plan.json, or None when absent or unreadable (the report then says LR was chosen and
    scored on the same seeds)."""
    path = Path(runs_dir) / PLAN_FILE
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return plan if isinstance(plan, dict) and isinstance(plan.get("groups"), dict) else None


def searched(plan: dict | None) -> bool:
    return bool(plan) and isinstance(plan.get("lr_search"), dict)


def _sweep_id(g: Group, root: Path) -> str | None:
    """ "<scale>/<optimizer>" when the group's runs sit in the sweep layout scale/optim/lrX-seedY."""
    for c in g.cells.values():
        for r in c.runs:
            try:
                parts = r.path.relative_to(root).parts
            except ValueError:
                continue
            if len(parts) == 3 and _RUN_DIR.match(parts[2]):
                return f"{parts[0]}/{parts[1]}"
    return None


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6)


def _search_status(g: Group, pg: dict, seed: int) -> str:
    tried = [float(x) for x in pg.get("lrs") or []]
    done = [lr for lr in tried if any(_same(lr, c) and seed in g.cells[c].losses for c in g.cells)]
    if pg.get("best_lr") is None and pg.get("note") != "every LR diverged":
        return f"LR search running ({len(done)}/{len(tried)} LRs finished on seed {seed})"
    if len(done) < len(tried):
        return f"LR search incomplete ({len(done)}/{len(tried)} LRs finished on seed {seed})"
    if pg.get("note") == "every LR diverged":
        return "every LR diverged on the search seed"
    return "done"


def apply_plan(rows: list[Row], root: Path, plan: dict | None) -> list[Pending]:
    """Set each group's selection (search seed, evaluation seeds, lr_from) and status from the plan;
    return the plan's groups that have no finished run at all (shown as pending, never as numbers)."""
    by_id: dict[str, Group] = {}
    for row in rows:
        for g in row.groups.values():
            g.sweep_id = _sweep_id(g, root)
            if g.sweep_id is not None:
                by_id.setdefault(g.sweep_id, g)
                row.sweep_scale = row.sweep_scale or g.sweep_id.split("/")[0]
    if not searched(plan):
        return []
    assert plan is not None
    seed = int(plan["lr_search"]["seed"])
    seeds = [int(s) for s in plan.get("seeds") or []]
    eval_seeds = tuple(s for s in seeds if s != seed) or (seed,)
    groups: dict[str, Any] = plan["groups"]
    for gid, g in by_id.items():  # searched groups first: lr_from groups read their result
        pg = groups.get(gid)
        if pg is None or pg.get("lr_from"):
            continue
        g.select_seed, g.eval_seeds = seed, eval_seeds
        g.status = _search_status(g, pg, seed)
        if g.status == "done":
            g.status = _seeds_status(g, eval_seeds)
    for gid, g in by_id.items():
        pg = groups.get(gid)
        if pg is None or not pg.get("lr_from"):
            continue
        src = by_id.get(f"{pg['lr_from']}/{gid.split('/', 1)[1]}")
        g.eval_seeds = eval_seeds
        if src is None or src.status.startswith(("LR search", "every LR")):
            g.status = f"waiting for the LR search at {pg['lr_from']}"
            continue
        g.fixed_lr = next((lr for lr in g.cells if _same(lr, src.best.lr)), None)
        g.inherited_edge = src.edge
        g.status = (
            _seeds_status(g, eval_seeds) if g.fixed_lr is not None else f"no run yet at {pg['lr_from']}'s best LR"
        )
    return [Pending(gid, _pending_status(pg, seed)) for gid, pg in groups.items() if gid not in by_id]


def _seeds_status(g: Group, eval_seeds: tuple[int, ...]) -> str:
    have = [s for s in eval_seeds if s in g.best.losses]
    if len(have) < len(eval_seeds):
        return f"evaluation seeds running ({len(have)}/{len(eval_seeds)} finished at LR {g.best.lr:.4g})"
    return "done"


def _pending_status(pg: dict, seed: int) -> str:
    if pg.get("lr_from"):
        if pg.get("best_lr") is None:
            return f"waiting for the LR search at {pg['lr_from']}"
        return "evaluation seeds running (0 finished)"
    return f"LR search running (0/{len(pg.get('lrs') or [])} LRs finished on seed {seed})"


def selection_line(plan: dict | None) -> str:
    """The one line that says how LRs were chosen and scored."""
    if not searched(plan):
        return (
            "**LR selection:** no LR search in the logs (no `sweep_plan.json` with `lr_search`): each "
            "optimizer's best LR was chosen and scored on the same seeds, so the numbers at the best LR are "
            "biased low by the selection (more so the more LRs were tried)."
        )
    assert plan is not None
    seed = plan["lr_search"]["seed"]
    seeds = [s for s in plan.get("seeds") or [] if s != seed]
    if not seeds:
        return (
            f"**LR selection:** the LR was chosen on seed {seed}, and the only seed scored is the same one: "
            "the numbers are biased low by the selection."
        )
    return (
        f"**LR selection:** each optimizer's LR was chosen on seed {seed} alone (`sweep_plan.json`), and every "
        f"number at the best LR is scored on the evaluation seeds {', '.join(map(str, seeds))} only: selection "
        "and scoring never share a seed."
    )
