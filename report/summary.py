"""summary.json: the report's numbers, machine-readable, with one JSON shape per kind of object (a
group; a comparison, fit or slope: its dataclass fields) wherever it appears."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from report.analysis import Report
from report.runs import Group, usable
from report.stats import Comparison


def _num(x: float) -> float | None:
    """A number a reader can use as one: NaN (a diverged or missing loss) is null."""
    return x if math.isfinite(x) else None


def group_json(g: Group | None, root: Path) -> dict[str, Any] | None:
    """A group: its status, the point that gives its numbers, the score (null until usable), and
    every point tried."""
    if g is None:
        return None
    s, ok, cells = g.score, usable(g), g.cells
    return {
        "status": g.status,
        "lr": s.point[0],
        "adamw_lr": s.point[1],
        "edge": g.edge,
        "mean": _num(s.mean) if ok else None,
        "std": _num(s.std) if ok else None,
        "n": len(s.runs),
        "seeds": sorted(s.losses),
        "losses": {str(k): _num(v) for k, v in s.losses.items()},
        "select_seed": g.select_seed,
        "sweep_id": g.sweep_id,
        "runs": [str(r.path.relative_to(root)) for r in s.runs],
        "by_point": [
            {"lr": p[0], "adamw_lr": p[1], "mean": _num(m), "n": int(n)}
            for p, m, n in zip(g.points, cells["mean"], cells["n"], strict=True)
        ],
    }


def obj(x: Any) -> dict[str, Any] | None:
    """A Comparison, PowerFit or Slope as its fields (a comparison also says whether it is within noise)."""
    if x is None:
        return None
    return asdict(x) | ({"within_noise": x.within_noise} if isinstance(x, Comparison) else {})


def summary(rep: Report) -> dict[str, Any]:
    root, complete, total = rep.root, *rep.progress
    rows: list[dict[str, Any]] = []
    for row in rep.rows:
        rows.append(dict(name=row.name, label=row.label, scale=row.sweep_scale, steps=row.steps))
        rows[-1] |= dict(tokens_per_step=row.tokens_per_step, tokens=row.tokens, non_embedding_params=row.n_params)
        rows[-1] |= dict(params=row.n_total, paper_scale=row.paper_scale)
        rows[-1] |= dict(family=row.family, groups={name: group_json(g, root) for name, g in row.groups.items()})
    scaling = rep.scaling
    return {
        "n_runs": len(rep.runs),
        "n_finished": sum(r.finished for r in rep.runs),
        "selection": "search seed" if rep.plan is not None and rep.plan.search is not None else "same seeds",
        "rows": rows,
        "headline": {
            "complete": complete,
            "total": total,
            "n_tests": rep.n_tests,
            "wins": [_wins(rep, row) for row in rep.ordered],
            "speedup": [_speedup(e) for e in rep.speedup],
            "lr_transfer": {
                "points": rep.transfer["points"],
                "fits": {n: {**f, "slope": obj(f["slope"])} for n, f in rep.transfer["fits"].items()},
            },
            "scaling": {
                "series": scaling["series"],
                "fits": {n: _scaling_fit(e) for n, e in scaling["fits"].items()},
                "gaps": {f"{a}|{b}": {**g, "trend": obj(g["trend"])} for (a, b), g in scaling["gaps"].items()},
            },
        },
        "protocols": {e["row"].short: _protocols(e, root) for e in rep.protocols},
        "figures": rep.figures,
        "records": rep.records,
        "pending": {p.sweep_id: p.status for p in rep.pending},
        "unfinished": {str(r.path.relative_to(root)): r.problem for r in rep.runs if not r.finished},
    }


def _speedup(e: dict[str, Any]) -> dict[str, Any]:
    fit = None if "fit" not in e else {**asdict(e["fit"]), "E_ci": e["E_ci"], "alpha_ci": e["alpha_ci"]}
    return {"scale": e["scale"], "budgets": e["budgets"], "fit": fit, "reason": e.get("reason"), "rows": e["rows"]}


def _wins(rep: Report, row: Any) -> dict[str, Any]:
    """A row of table 1: its scale and the Δs of its tests (the groups are under `rows`)."""
    win = rep.winners.get(row.name)
    lowest = None if win is None else {"optim": win.first, "runner_up": win.second, "margin": -win.gap}
    return {
        "scale": row.short,
        "row": row.name,
        "N": row.n_params,
        "tokens": row.tokens,
        "deltas": {f"{a}|{b}": obj(c) for (r, a, b), c in rep.comparisons.items() if r == row.name},
        "lowest": lowest,
        "winner": lowest if win is not None and win.tuned else None,  # a tuned comparison's only
        "untuned": [] if win is None else win.untuned,  # best LR at a grid edge
    }


def _scaling_fit(e: dict[str, Any]) -> dict[str, Any]:
    out = {"n": e["n"], "N": e["N"], "reason": e.get("reason")}
    if e.get("fit") is not None:
        out.update(asdict(e["fit"]), n=e["n"], E_ci=e["E_ci"], A_ci=e["A_ci"], alpha_ci=e["alpha_ci"])
    return out


def _protocols(e: dict[str, Any], root: Path) -> dict[str, Any]:
    """A row's protocols: its groups as `group_json`, its comparisons as `obj`."""
    as_json = lambda x: group_json(x, root) if isinstance(x, Group) else obj(x)
    part = lambda p: None if p is None else {"mean": p[0], "ci": [p[1], p[2]]}
    return {
        "optims": {n: {k: as_json(v) for k, v in o.items()} for n, o in e["optims"].items()},
        "gaps": {
            f"{a}|{b}": {
                "tuned": obj(g["tuned"]),
                "shared": obj(g["shared"]),
                "protocol_part": part(g["protocol_part"]),
            }
            for (a, b), g in e["gaps"].items()
        },
        "transfer": {
            label: {
                "group": group_json(t["group"], root),
                "vs_own_tuned": obj(t["vs_own_tuned"]),
                "vs_source": {k: obj(v) for k, v in t["vs_source"].items()},
            }
            for label, t in e["transfer"].items()
        },
    }
