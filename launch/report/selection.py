"""Which runs give each group's numbers: the sweep's plan (`RUNS_DIR/sweep_plan.json`, written by
launch/sweep/plan.py) applied to the rows built from the logs.

With an LR search (`lr_search` in the plan), the best LR is chosen on the search seed alone and the
numbers come from the evaluation seeds at that LR, so selection never scores itself (a minimum
over noisy LRs, re-used as the score, is biased low). A group still searching, or whose seeds are
still running, gets a status instead of numbers. Without a plan (or without a search) the LR is
chosen and scored on the same seeds, and the report says so.

Protocols (a search over both LRs, `lr_search.adamw_lr`): the row's groups are the *tuned* protocol
(each optimizer's two LRs chosen on the search seed); `Row.protocols["shared"]` holds each
optimizer's view of the same runs restricted to adamw_lr = lr (chosen the same way, scored at its
own seeds), and `Row.protocols["transfer"]` the groups run at another optimizer's tuned point
(`lr_from` an optimizer: the paper's claim that OrScale-LM inherits Moonlight's LRs).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launch.report.markdown_util import fmt_point
from launch.report.rows import Group, Point, Row, same
from launch.run.records import RunRecord

PLAN_FILE = "sweep_plan.json"  # launch.sweep.plan.PLAN_FILE (not imported: the report reads logs only)
_RUN_DIR = re.compile(r"^lr[0-9.e+-]+(-alr[0-9.e+-]+)?-seed-?\d+$")
SHARED, TRANSFER = "shared", "transfer"


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


def run_sweep_id(r: RunRecord, root: Path) -> str | None:
    """ "<scale>/<optimizer label>" of a run in the sweep layout scale/optim/lrX[-alrY]-seedZ."""
    try:
        parts = r.path.relative_to(root).parts
    except ValueError:
        return None
    return f"{parts[0]}/{parts[1]}" if len(parts) == 3 and _RUN_DIR.match(parts[2]) else None


def group_names(runs: list[RunRecord], root: Path, plan: dict | None) -> dict[Path, str]:
    """Runs of a sweep group that takes another optimizer's LRs (a protocol of its own) keep the
    sweep's label as their group name, so they are not pooled with that optimizer's own runs."""
    if not searched(plan):
        return {}
    assert plan is not None
    out = {}
    for r in runs:
        gid = run_sweep_id(r, root)
        if gid is not None and (plan["groups"].get(gid) or {}).get("lr_from_optim"):
            out[r.path] = gid.split("/", 1)[1]
    return out


def _sweep_id(g: Group, root: Path) -> str | None:
    return next((i for c in g.cells.values() for r in c.runs if (i := run_sweep_id(r, root))), None)


def _plan_point(pg: dict, shared: bool = False) -> Point | None:
    if shared:
        lr = pg.get("shared_lr")
        return None if lr is None else (float(lr), float(lr))
    if pg.get("best_lr") is None:
        return None
    lr = float(pg["best_lr"])
    return (lr, float(pg["best_adamw_lr"]) if pg.get("best_adamw_lr") is not None else lr)


def _find(g: Group, point: Point | None) -> Point | None:
    return next((pt for pt in g.cells if point and same(pt[0], point[0]) and same(pt[1], point[1])), None)


def _search_status(g: Group, pg: dict, seed: int) -> str:
    tried = [(float(p[0]), float(p[1] if p[1] is not None else p[0])) for p in pg.get("points") or []]
    tried = tried or [(float(x), float(x)) for x in pg.get("lrs") or []]
    done = [pt for pt in tried if (c := _find(g, pt)) is not None and seed in g.cells[c].losses]
    if pg.get("best_lr") is None and pg.get("note") != "every LR diverged":
        return f"LR search running ({len(done)}/{len(tried)} points finished on seed {seed})"
    if len(done) < len(tried):
        return f"LR search incomplete ({len(done)}/{len(tried)} points finished on seed {seed})"
    if pg.get("note") == "every LR diverged":
        return "every LR diverged on the search seed"
    return "done"


def apply_plan(rows: list[Row], root: Path, plan: dict | None) -> list[Pending]:
    """Set each group's selection (search seed, evaluation seeds, lr_from) and status from the plan,
    build the protocol views (module docstring); return the plan's groups that have no finished run
    at all (shown as pending, never as numbers)."""
    by_id: dict[str, tuple[Row, Group]] = {}
    for row in rows:
        for g in row.groups.values():
            g.sweep_id = _sweep_id(g, root)
            if g.sweep_id is not None:
                by_id.setdefault(g.sweep_id, (row, g))
                row.sweep_scale = row.sweep_scale or g.sweep_id.split("/")[0]
    if not searched(plan):
        return []
    assert plan is not None
    seed = int(plan["lr_search"]["seed"])
    seeds = [int(s) for s in plan.get("seeds") or []]
    eval_seeds = tuple(s for s in seeds if s != seed) or (seed,)
    shared = bool(plan["lr_search"].get("shared"))
    groups: dict[str, Any] = plan["groups"]
    for gid, (row, g) in by_id.items():  # searched groups first: lr_from groups read their result
        pg = groups.get(gid)
        if pg is None or pg.get("lr_from") or pg.get("lr_from_optim"):
            continue
        g.select_seed, g.eval_seeds = seed, eval_seeds
        g.status = _search_status(g, pg, seed)
        if g.status == "done":
            g.status = _seeds_status(g, eval_seeds)
        if shared:
            view = Group(g.optim, {pt: c for pt, c in g.cells.items() if c.tied}, seed, eval_seeds, sweep_id=gid)
            searching = g.status.startswith(("LR search", "every LR"))
            view.status = g.status if searching else _seeds_status(view, eval_seeds)
            row.protocols.setdefault(SHARED, {})[g.optim] = view
    for gid, (row, g) in by_id.items():
        pg = groups.get(gid)
        if pg is None or not (pg.get("lr_from") or pg.get("lr_from_optim")):
            continue
        scale, optim = gid.split("/", 1)
        src_id = f"{pg.get('lr_from') or scale}/{pg.get('lr_from_optim') or optim}"
        src = by_id.get(src_id, (None, None))[1]
        g.eval_seeds = eval_seeds
        if pg.get("lr_from_optim"):  # another optimizer's tuned point: a protocol of its own
            row.protocols.setdefault(TRANSFER, {})[optim] = row.groups.pop(g.optim)
        views = [(g, False)]
        if shared and not pg.get("lr_from_optim"):
            view = Group(g.optim, {pt: c for pt, c in g.cells.items() if c.tied}, None, eval_seeds, sweep_id=gid)
            row.protocols.setdefault(SHARED, {})[g.optim] = view
            views.append((view, True))
        for group, tied in views:
            if src is None or src.status.startswith(("LR search", "every LR")):
                group.status = f"waiting for the LR search at {src_id}"
                continue
            group.fixed = _find(group, _plan_point(groups.get(src_id) or {}, tied))
            group.inherited_edge = src.edge
            group.status = (
                _seeds_status(group, eval_seeds) if group.fixed is not None else f"no run yet at {src_id}'s best point"
            )
    # The headline's groups only: a protocol's group without runs yet is simply absent from its section.
    return [
        Pending(gid, _pending_status(pg, seed))
        for gid, pg in groups.items()
        if gid not in by_id and not pg.get("lr_from_optim")
    ]


def _seeds_status(g: Group, eval_seeds: tuple[int, ...]) -> str:
    have = [s for s in eval_seeds if s in g.best.losses]
    if len(have) < len(eval_seeds):
        return f"evaluation seeds running ({len(have)}/{len(eval_seeds)} finished at LR {fmt_point(g.best.point)})"
    return "done"


def _pending_status(pg: dict, seed: int) -> str:
    if pg.get("lr_from"):
        if pg.get("best_lr") is None:
            return f"waiting for the LR search at {pg['lr_from']}"
        return "evaluation seeds running (0 finished)"
    return f"LR search running (0/{len(pg.get('points') or pg.get('lrs') or [])} points finished on seed {seed})"


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
    line = (
        f"**LR selection:** each optimizer's LR was chosen on seed {seed} alone (`sweep_plan.json`), and every "
        f"number at the best LR is scored on the evaluation seeds {', '.join(map(str, seeds))} only: selection "
        "and scoring never share a seed."
    )
    ratios = plan["lr_search"].get("adamw_ratios") or []
    if ratios:
        rounds = plan["lr_search"].get("rounds", 1)
        line += (
            " **Both** peak LRs were tuned: the hidden matrices' (`optim.lr`) and the AdamW group's "
            "(`optim.adamw_lr`: token embedding = tied head, norm gains), by coordinate search on that seed — the "
            f"LR grid at adamw_lr = lr, then adamw_lr at {', '.join(f'{r:g}' for r in ratios)} × the best LR, then "
            f"the LR at the best adamw_lr (up to {rounds} round{'s' if rounds > 1 else ''}), each line extended past "
            "an edge optimum. The other protocols are in the Protocols section below."
        )
    return line
