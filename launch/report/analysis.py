"""The four answers at the top of the report, computed from the rows (launch/report/rows.py):

1. who wins at each scale, by how much (paired Δ with a t-interval, p, Holm over the tests);
2. the data-efficiency multiplier over AdamW from AdamW's L(D) at one scale, with an interval;
3. LR transfer across width: the best LR against d_model per optimizer, the fitted log-log slope;
4. L(N) = E + A·N^−α per optimizer with parameter intervals, and the gap at each scale.

Intervals on fitted quantities draw each point's mean from its t-distribution and refit
(`stats.t_draws` + `stats.fit_power_law_batch`): with 2–3 seeds a resampling bootstrap has only a
few distinct means per point and is too narrow (see launch/report/stats.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from launch.report.rows import REFS, Group, Row
from launch.report.series import budget_rows, main_series, usable
from launch.report.stats import (
    Comparison,
    compare,
    fit_power_law,
    fit_power_law_batch,
    holm,
    ols_slope,
    percentile_ci,
    t_draws,
    t_interval,
)

DRAWS = 4000  # refits per interval: the 2.5% tails rest on 100 draws each
MIN_SCALES = 4  # L(N) has three parameters: with three scales the curve only interpolates


def ordered_rows(rows: list[Row]) -> list[Row]:
    """The main scaling series first (by N), then the other budgets (by scale, then tokens)."""
    series = [r for s in main_series(rows).values() for r in s]
    rest = sorted((r for r in rows if r not in series), key=lambda r: (r.n_params or 0, r.tokens))
    return series + rest


def wins(ctx: dict) -> dict[str, Any]:
    """Per row: each optimizer's score, the Δ against the references (Holm over every test), and
    the winner (lowest mean; 'within seed noise' when its interval against the runner-up holds 0)."""
    comps: dict[tuple[str, str, str], Comparison | None] = ctx["comparisons"]
    keys = [k for k, c in comps.items() if c is not None and c.p is not None]
    adjusted = dict(zip(keys, holm([comps[k].p for k in keys]), strict=True))
    out = []
    for row in ordered_rows(ctx["rows"]):
        good = {n: g for n, g in row.groups.items() if usable(g)}
        entry: dict[str, Any] = {"row": row, "groups": row.groups, "deltas": {}, "winner": None}
        for (rname, a, b), c in comps.items():
            if rname == row.name:
                entry["deltas"][(a, b)] = (c, adjusted.get((rname, a, b)))
        if len(good) >= 2:
            ranked = sorted(good, key=lambda n: good[n].score.mean)
            first, second = ranked[0], ranked[1]
            c = compare(good[first].score.losses, good[second].score.losses)
            entry["winner"] = (first, second, good[first].score.mean - good[second].score.mean, c)
        out.append(entry)
    return {"rows": out, "n_tests": len(keys)}


def _draw_losses(g: Group, seed: int) -> np.ndarray:
    return t_draws([list(g.score.losses.values())], DRAWS, seed=seed)[:, 0]


def speedup(rows: list[Row]) -> list[dict[str, Any]]:
    """Per scale with >= 3 AdamW budgets: AdamW's L(D) fit (and draws of it), then for each other
    optimizer and budget: D_AdamW(L_opt) / D_opt with a 95% interval."""
    out = []
    for (_, label), rs in budget_rows(rows).items():
        adam = [(r.tokens, r.groups["adamw"]) for r in rs if usable(r.groups.get("adamw"))]
        if len(rs) < 2:
            continue
        names = [r.short for r in rs]
        main = next((r.short for r in rs if r in [x for s in main_series(rows).values() for x in s]), names[0])
        entry: dict[str, Any] = {
            "label": label,
            "scale": f"{main} (budgets: {', '.join(names)})",
            "budgets": [d for d, _ in adam],
            "rows": [],
        }
        out.append(entry)
        if len(adam) < 3:
            entry["reason"] = f"{len(adam)} finished AdamW budget(s) at this scale; an L(D) fit needs 3"
            continue
        D = [float(d) for d, _ in adam]
        means = [g.score.mean for _, g in adam]
        if any(b >= a for a, b in zip(means, means[1:], strict=False)):
            entry["reason"] = (
                "AdamW's loss does not fall with every added budget ("
                + ", ".join(f"{d:,.0f} tokens: {m:.4f}" for d, m in zip(D, means, strict=True))
                + "): no decreasing L(D) to invert, so no speedup"
            )
            continue
        fit = fit_power_law(D, [g.score.mean for _, g in adam])
        if fit is None:
            entry["reason"] = "the AdamW budgets do not pin down an L(D) fit"
            continue
        E, A, beta = fit_power_law_batch(D, t_draws([list(g.score.losses.values()) for _, g in adam], DRAWS))
        entry.update(fit=fit, E_ci=percentile_ci(E), beta_ci=percentile_ci(beta), draws=(E, A, beta))
        for k, r in enumerate(rs):
            for name, g in sorted(r.groups.items()):
                if name == "adamw" or not usable(g):
                    continue
                loss = g.score.mean
                d_adam = fit.inverse(loss)
                ld = _draw_losses(g, seed=1 + k)
                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    dd = np.where((ld > E) & (A > 0), (A / (ld - E)) ** (1.0 / beta), np.inf)
                entry["rows"].append(
                    {
                        "optim": name,
                        "tokens": r.tokens,
                        "loss": loss,
                        "n": len(g.score.losses),
                        "adamw_tokens": d_adam,
                        "speedup": d_adam / r.tokens,
                        "ci": percentile_ci(dd / r.tokens),
                        "extrapolated": not (min(D) <= d_adam <= max(D)),
                        "edge": g.edge,
                    }
                )
    return out


def _vertex(lrs: list[float], losses: list[float]) -> float | None:
    """The LR at the minimum of a parabola in log2(LR) through the grid minimum and its two
    neighbours (a sub-grid estimate of the optimum); None at a grid edge or on a flat/inverted fit."""
    i = int(np.argmin(losses))
    if i == 0 or i == len(lrs) - 1 or not all(math.isfinite(v) for v in losses[i - 1 : i + 2]):
        return None
    x = np.log2(lrs[i - 1 : i + 2])
    a, b, _ = np.polyfit(x, losses[i - 1 : i + 2], 2)
    if a <= 0:
        return None
    return float(2 ** np.clip(-b / (2 * a), x[0], x[2]))


def lr_transfer(rows: list[Row]) -> dict[str, Any]:
    """Best LR against width (d_model) per optimizer over the largest scaling series."""
    series = max(main_series(rows).values(), key=len, default=[])
    per: dict[str, list[dict]] = {}
    for row in series:
        for name, g in sorted(row.groups.items()):
            if g.status.startswith(("LR search", "every LR", "waiting")) or row.d_model is None:
                continue
            line = g.lr_line()  # the matrix LR through the best point (its adamw_lr, or its ratio)
            lrs = [c.lr for c in line]
            losses = [g.selection_loss(c.point) for c in line]
            if not any(math.isfinite(v) for v in losses):
                continue
            v = _vertex(lrs, losses)
            per.setdefault(name, []).append(
                {
                    "scale": row.short,
                    "d_model": row.d_model,
                    "n_layer": row.n_layer,
                    "lrs": lrs,
                    "losses": losses,
                    "best_lr": g.best.lr,
                    "best_adamw_lr": g.best.point[1],
                    "vertex_lr": v,
                    "edge": g.edge,
                    "selection": "search seed" if g.select_seed is not None else "mean over seeds",
                }
            )
    fits = {}
    for name, pts in per.items():
        widths = [p["d_model"] for p in pts]
        est = [p["vertex_lr"] or p["best_lr"] for p in pts]
        slope = ols_slope(np.log2(widths), np.log2(est)) if len(set(widths)) >= 2 else None
        lo, hi = min(pts, key=lambda p: p["d_model"]), max(pts, key=lambda p: p["d_model"])
        fits[name] = {
            "slope": slope,
            "octaves": math.log2(hi["best_lr"] / lo["best_lr"]) if len(pts) >= 2 else None,
            "edges": [p["scale"] for p in pts if p["edge"]],
            "widths": (lo["d_model"], hi["d_model"]),
        }
    return {"points": per, "fits": fits}


def scaling(rows: list[Row], comparisons: dict) -> dict[str, Any]:
    """L(N) fits per optimizer over the largest series, parameter intervals from t-draws of each
    scale's mean; and the gap against each reference at each scale, with its trend in log N."""
    series = max(main_series(rows).values(), key=len, default=[])
    fits: dict[str, dict] = {}
    names = sorted({n for r in series for n in r.groups})
    for name in names:
        pts = [(r.n_params, r.groups[name]) for r in series if r.n_params and usable(r.groups.get(name))]
        entry: dict[str, Any] = {"n": len(pts), "N": [float(n) for n, _ in pts]}
        fits[name] = entry
        if len(pts) < MIN_SCALES:
            entry["reason"] = f"{len(pts)} finished scale(s); L(N) = E + A·N^−α needs ≥ {MIN_SCALES}"
            continue
        N = [float(n) for n, _ in pts]
        fit = fit_power_law(N, [g.score.mean for _, g in pts])
        E, A, alpha = fit_power_law_batch(N, t_draws([list(g.score.losses.values()) for _, g in pts], DRAWS))
        entry.update(fit=fit, E_ci=percentile_ci(E), A_ci=percentile_ci(A), alpha_ci=percentile_ci(alpha))
        entry["draws"] = (E, A, alpha)  # for the figure's band (not in summary.json)
        entry["alpha_edge_share"] = float(np.mean((alpha <= 0.0051) | (alpha >= 2.99)))
    gaps: dict[tuple[str, str], dict] = {}
    for r in series:
        for (rname, a, b), c in comparisons.items():
            if rname == r.name and c is not None and r.n_params:
                gaps.setdefault((a, b), {"N": [], "diff": [], "ci": []})
                gaps[(a, b)]["N"].append(float(r.n_params))
                gaps[(a, b)]["diff"].append(c.diff)
                gaps[(a, b)]["ci"].append(c.ci)
    for gap in gaps.values():
        gap["trend"] = ols_slope(np.log10(gap["N"]), gap["diff"]) if len(gap["N"]) >= 3 else None
    return {"fits": fits, "gaps": gaps, "series": [r.short for r in series]}


def headline(ctx: dict) -> dict[str, Any]:
    rows = ctx["rows"]
    groups = [g for r in rows for g in r.groups.values()]
    return {
        "wins": wins(ctx),
        "speedup": speedup(rows),
        "transfer": lr_transfer(rows),
        "scaling": scaling(rows, ctx["comparisons"]),
        "complete": sum(g.status == "done" for g in groups),
        "total": len(groups) + len(ctx["pending"]),
        "refs": REFS,
    }


def seed_interval(g: Group) -> tuple[float, float, float, int] | None:
    """(mean, lo, hi, df) of a group's scored seeds (t-interval)."""
    return t_interval(list(g.score.losses.values()))
