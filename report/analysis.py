"""Every number of the report, computed once from the rows (report/runs.py) into a `Report` that
report.md, summary.json and the figures only render:

1. who wins at each scale, by how much (paired Δ with a t-interval, p, Holm over the tests);
2. the data-efficiency multiplier over AdamW from AdamW's L(D) at one scale, with an interval;
3. LR transfer across width: the best LR against d_model per optimizer, the fitted log-log slope;
4. L(N) = E + A·N^−α per optimizer with parameter intervals, and the gap at each scale;
then the protocols side by side, downstream accuracies, and the last record of each kind a loop feature
writes of its own (any kind: the report names none).

Intervals on fitted quantities draw each point's mean from its t-distribution and refit
(`stats.t_draws` + `stats.fit_power_law_batch`): with 2–3 seeds a resampling bootstrap has only a
few distinct means per point and is too narrow (see report/stats.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from records.points import SweepPlan
from records.read import RunRecord, finite, read_downstream
from report.fmt import order
from report.runs import REFS, Group, Row, usable
from report.selection import SHARED, TRANSFER, Pending
from report.stats import (
    Comparison,
    PowerFit,
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
PAIRS = (("orscale_lm", "muon_moonlight"), ("orscale_lm", "adamw"), ("muon_moonlight", "adamw"))


@dataclass
class Winner:
    """A row's lowest final loss and the runner-up (Δ = first − second, paired by seed), and the
    optimizers whose best LR sits at an edge of their grid: untuned, so their place is not known."""

    first: str
    second: str
    gap: float
    comparison: Comparison | None
    compared: list[str]  # every optimizer of the row with final numbers
    untuned: list[str]

    @property
    def tuned(self) -> bool:
        """Whether the lowest loss is a tuned result: every other optimizer's best LR is interior (the
        lowest's own edge only means it could do better still)."""
        return not [n for n in self.untuned if n != self.first]

    @property
    def none_tuned(self) -> bool:
        """Every optimizer's best LR at an edge: no comparison in the row is tuned."""
        return set(self.untuned) == set(self.compared)


@dataclass
class Report:
    root: Path
    runs: list[RunRecord]
    rows: list[Row]
    plan: SweepPlan | None
    pending: list[Pending]
    # (row name, optimizer, reference) -> Δ; Holm's p over every test of this family is in each
    comparisons: dict[tuple[str, str, str], Comparison | None] = field(default_factory=dict)
    series: list[Row] = field(default_factory=list)  # the largest scaling series, by N
    ordered: list[Row] = field(default_factory=list)  # the series first, then the other budgets
    winners: dict[str, Winner] = field(default_factory=dict)  # row name -> its lowest loss, when >= 2 groups
    speedup: list[dict[str, Any]] = field(default_factory=list)
    transfer: dict[str, Any] = field(default_factory=dict)
    scaling: dict[str, Any] = field(default_factory=dict)
    protocols: list[dict[str, Any]] = field(default_factory=list)
    downstream: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)  # figure name -> the numbers it plots
    # a loop feature's own kind -> run directory -> the numbers of the run's last record of that kind
    records: dict[str, dict[str, dict[str, float | None]]] = field(default_factory=dict)

    @property
    def n_tests(self) -> int:
        return sum(c is not None and c.p is not None for c in self.comparisons.values())

    @property
    def progress(self) -> tuple[int, int]:
        groups = [g for r in self.rows for g in r.groups.values()]
        return sum(g.status == "done" for g in groups), len(groups) + len(self.pending)


def main_series(rows: list[Row]) -> dict[str, list[Row]]:
    """family -> its rows at the token budget most of its scales share (ties: the larger budget),
    one row per scale: L(N) compares scales at one budget, not each scale's longest run."""
    out = {}
    for family in dict.fromkeys(r.family for r in rows):
        fam = [r for r in rows if r.family == family]
        count = pd.DataFrame({"tokens": [r.tokens for r in fam], "label": [r.label for r in fam]})
        per = count.groupby("tokens")["label"].nunique()
        budget = max(per.index, key=lambda t: (per[t], t))
        out[family] = sorted((r for r in fam if r.tokens == budget), key=lambda r: (r.n_params or 0, r.label))
    return out


def analyse(
    root: Path, runs: list[RunRecord], rows: list[Row], plan: SweepPlan | None, pending: list[Pending]
) -> Report:
    rep = Report(root, runs, rows, plan, pending)
    for row in rows:
        for name, g in row.groups.items():
            for ref in REFS:
                # AdamW vs Muon+Moonlight is Muon+Moonlight vs AdamW with the sign flipped: listed once.
                if ref != name and ref in row.groups and not (name in REFS and REFS.index(name) < REFS.index(ref)):
                    both = usable(g) and usable(row.groups[ref])
                    rep.comparisons[(row.name, name, ref)] = (
                        compare(g.score.losses, row.groups[ref].score.losses) if both else None
                    )
    tested = [c for c in rep.comparisons.values() if c is not None and c.p is not None]
    for c, adjusted in zip(tested, holm([c.p for c in tested]), strict=True):
        c.p_holm = adjusted
    series = main_series(rows)
    family = max(series, key=lambda f: len(series[f]), default=None)
    rep.series = series[family] if family is not None else []
    rep.ordered = rep.series + sorted(
        (r for r in rows if r not in rep.series), key=lambda r: (r.n_params or 0, r.tokens)
    )
    for row in rep.ordered:
        good = {n: g for n, g in row.groups.items() if usable(g)}
        if len(good) >= 2:
            first, second = sorted(good, key=lambda n: good[n].score.mean)[:2]
            a, b = good[first].score, good[second].score
            untuned = [n for n in order(good) if good[n].edge]
            comparison = compare(a.losses, b.losses)
            rep.winners[row.name] = Winner(first, second, a.mean - b.mean, comparison, order(good), untuned)
    rep.speedup = _speedup(rows, rep.series)
    rep.transfer = _lr_transfer(rep.series)
    rep.scaling = _scaling(rep)
    rep.protocols = _protocols(rows)
    rep.downstream = _downstream(rows)
    rep.records = other_records(root, runs)
    return rep


def other_records(root: Path, runs: list[RunRecord]) -> dict[str, dict[str, dict[str, float | None]]]:
    """kind -> run directory (under `root`) -> the numbers (null: non-finite) of the run's last record
    of that kind, for every kind a loop feature writes of its own (`RunRecord.other_kinds`)."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for run in runs:
        for kind, record in run.other_kinds.items():
            numbers = {k: v for k, v in record.items() if v is None or (isinstance(v, int | float) and k != "kind")}
            out.setdefault(kind, {})[str(run.path.relative_to(root))] = numbers
    return {kind: out[kind] for kind in sorted(out)}


def _speedup(rows: list[Row], series: list[Row]) -> list[dict[str, Any]]:
    """Per scale with >= 3 AdamW budgets: AdamW's L(D) fit (and draws of it), then for each other
    optimizer and budget: D_AdamW(L_opt) / D_opt with a 95% interval."""
    by_scale: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        by_scale.setdefault((row.family, row.label), []).append(row)
    out = []
    for (_, label), rs in by_scale.items():
        rs = sorted(rs, key=lambda r: r.tokens)
        if len(rs) < 2:
            continue
        adam = [(r.tokens, r.groups["adamw"]) for r in rs if usable(r.groups.get("adamw"))]
        main = next((r.short for r in rs if r in series), rs[0].short)
        scale = f"{main} (budgets: {', '.join(r.short for r in rs)})"
        entry: dict[str, Any] = {"label": label, "scale": scale, "budgets": [d for d, _ in adam], "rows": []}
        out.append(entry)
        curve = adamw_curve([float(d) for d, _ in adam], [list(g.score.losses.values()) for _, g in adam])
        if isinstance(curve, str):
            entry["reason"] = curve
            continue
        E, _, beta = curve.draws
        entry.update(fit=curve.fit, E_ci=percentile_ci(E), alpha_ci=percentile_ci(beta), draws=curve.draws)
        for k, r in enumerate(rs):
            for name, g in ((n, r.groups[n]) for n in order(r.groups) if n != "adamw" and usable(r.groups[n])):
                gain = curve.speedup(list(g.score.losses.values()), r.tokens, seed=1 + k)
                entry["rows"].append(dict(optim=name, tokens=r.tokens, **gain, edge=g.edge))
    return out


@dataclass
class AdamwCurve:
    """AdamW's L(D) at one scale: the fit of its per-budget mean losses, and fits of t draws of them."""

    D: list[float]
    fit: PowerFit
    draws: tuple[np.ndarray, np.ndarray, np.ndarray]  # (E, A, alpha), each [DRAWS]

    def speedup(self, losses: list[float], tokens: float, seed: int) -> dict[str, Any]:
        """The data-efficiency multiplier over AdamW of a point scored `losses` (one per seed) at
        `tokens`: the tokens AdamW needs to reach its mean loss, over `tokens`, with a 95% interval
        from t draws of that mean against the curve's draws (`seed`: the draws' generator)."""
        E, A, beta = self.draws
        loss = float(np.mean(losses))
        d_adam = self.fit.inverse(loss)
        ld = t_draws([losses], DRAWS, seed=seed)[:, 0]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            dd = np.where((ld > E) & (A > 0), (A / (ld - E)) ** (1.0 / beta), np.inf)
        return dict(loss=loss, n=len(losses), adamw_tokens=d_adam, speedup=d_adam / tokens) | dict(
            ci=percentile_ci(dd / tokens), extrapolated=not (min(self.D) <= d_adam <= max(self.D))
        )


def adamw_curve(D: list[float], losses: list[list[float]]) -> AdamwCurve | str:
    """AdamW's L(D) from each budget's per-seed losses (budgets `D` in tokens, increasing), or why
    there is none (one line)."""
    means = [float(np.mean(v)) for v in losses]
    if len(D) < 3:
        return f"{len(D)} finished AdamW budget(s) at this scale; an L(D) fit needs 3"
    if any(b >= a for a, b in zip(means, means[1:], strict=False)):
        return (
            "AdamW's loss does not fall with every added budget ("
            + ", ".join(f"{d:,.0f} tokens: {m:.4f}" for d, m in zip(D, means, strict=True))
            + "): no decreasing L(D) to invert, so no speedup"
        )
    if (fit := fit_power_law(D, means)) is None:
        return "the AdamW budgets do not pin down an L(D) fit"
    return AdamwCurve(D, fit, fit_power_law_batch(D, t_draws(losses, DRAWS)))


def _vertex(lrs: list[float], losses: list[float]) -> float | None:
    """The LR at the minimum of a parabola in log2(LR) through the grid minimum and its two
    neighbours (a sub-grid estimate of the optimum); None at a grid edge or on a flat/inverted fit."""
    i = int(np.argmin(losses))
    if i == 0 or i == len(lrs) - 1 or not all(math.isfinite(v) for v in losses[i - 1 : i + 2]):
        return None
    x = np.log2(lrs[i - 1 : i + 2])
    a, b, _ = np.polyfit(x, losses[i - 1 : i + 2], 2)
    return None if a <= 0 else float(2 ** np.clip(-b / (2 * a), x[0], x[2]))


def _lr_transfer(series: list[Row]) -> dict[str, Any]:
    """Best LR against width (d_model) per optimizer over the largest scaling series."""
    per: dict[str, list[dict]] = {}
    for row in series:
        for name in order(row.groups):
            g = row.groups[name]
            if g.status.startswith(("LR search", "every LR", "waiting")) or row.d_model is None or g.best is None:
                continue
            line = g.lr_line()  # the matrix LR through the best point (its adamw_lr, or its ratio)
            lrs, losses = [p[0] for p in line], [g.selection_loss(p) for p in line]
            if any(math.isfinite(v) for v in losses):
                sel = "search seed" if g.select_seed is not None else "mean over seeds"
                point = dict(scale=row.short, d_model=row.d_model, n_layer=row.n_layer, lrs=lrs, losses=losses)
                point |= dict(best_lr=g.best[0], best_adamw_lr=g.best[1], vertex_lr=_vertex(lrs, losses))
                per.setdefault(name, []).append(point | dict(edge=g.edge, selection=sel))
    fits = {}
    for name, pts in per.items():
        widths = [p["d_model"] for p in pts]
        est = [p["vertex_lr"] or p["best_lr"] for p in pts]
        lo, hi = min(pts, key=lambda p: p["d_model"]), max(pts, key=lambda p: p["d_model"])
        fits[name] = {
            "slope": ols_slope(np.log2(widths), np.log2(est)) if len(set(widths)) >= 2 else None,
            "octaves": math.log2(hi["best_lr"] / lo["best_lr"]) if len(pts) >= 2 else None,
            "edges": [p["scale"] for p in pts if p["edge"]],
            "widths": (lo["d_model"], hi["d_model"]),
        }
    return {"points": per, "fits": fits}


def _scaling(rep: Report) -> dict[str, Any]:
    """L(N) fits per optimizer over the largest series, parameter intervals from t-draws of each
    scale's mean; and the gap against each reference at each scale, with its trend in log N."""
    fits: dict[str, dict] = {}
    for name in sorted({n for r in rep.series for n in r.groups}):
        used = [r for r in rep.series if r.n_params and usable(r.groups.get(name))]
        N, groups = [float(r.n_params or 0) for r in used], [r.groups[name] for r in used]
        entry: dict[str, Any] = {"n": len(groups), "N": N}
        fits[name] = entry
        if len(groups) < MIN_SCALES:
            entry["reason"] = f"{len(groups)} finished scale(s); L(N) = E + A·N^−α needs ≥ {MIN_SCALES}"
            continue
        E, A, alpha = fit_power_law_batch(N, t_draws([list(g.score.losses.values()) for g in groups], DRAWS))
        fit = fit_power_law(N, [g.score.mean for g in groups])
        entry.update(fit=fit, E_ci=percentile_ci(E), A_ci=percentile_ci(A))
        entry.update(alpha_ci=percentile_ci(alpha), draws=(E, A, alpha))  # draws: the figure's band
        entry["alpha_edge_share"] = float(np.mean((alpha <= 0.0051) | (alpha >= 2.99)))
    gaps: dict[tuple[str, str], dict] = {}
    for r in rep.series:
        for (rname, a, b), c in rep.comparisons.items():
            if rname == r.name and c is not None and r.n_params:
                gap = gaps.setdefault((a, b), {"N": [], "diff": [], "ci": []})
                gap["N"].append(float(r.n_params))
                gap["diff"].append(c.diff)
                gap["ci"].append(c.ci)
    for gap in gaps.values():
        gap["trend"] = ols_slope(np.log10(gap["N"]), gap["diff"]) if len(gap["N"]) >= 3 else None
    return {"fits": fits, "gaps": gaps, "series": [r.short for r in rep.series]}


def _gap(a: Group | None, b: Group | None) -> Comparison | None:
    return compare(a.score.losses, b.score.losses) if a and b and usable(a) and usable(b) else None


def _protocols(rows: list[Row]) -> list[dict[str, Any]]:
    """Per row with protocols: each optimizer under each protocol, each pair's gaps, and the
    protocol's part of a gap, gap(shared) − gap(tuned), paired by seed (a t-interval)."""
    out = []
    for row in (r for r in rows if r.protocols):
        shared, transfer = row.protocols.get(SHARED, {}), row.protocols.get(TRANSFER, {})
        entry: dict[str, Any] = {"row": row, "optims": {}, "gaps": {}, "transfer": {}}
        for name in order(row.groups):
            g, sh = row.groups[name], shared.get(name)
            entry["optims"][name] = {"tuned": g, "shared": sh, "tuned_vs_shared": _gap(g, sh)}
        for a, b in PAIRS:
            ta, tb, sa, sb = row.groups.get(a), row.groups.get(b), shared.get(a), shared.get(b)
            part = None
            if ta and tb and sa and sb and all(usable(g) for g in (ta, tb, sa, sb)):
                losses = [g.score.losses for g in (ta, tb, sa, sb)]
                seeds = sorted(set.intersection(*(set(x) for x in losses)))
                ti = t_interval([(losses[2][s] - losses[3][s]) - (losses[0][s] - losses[1][s]) for s in seeds])
                part = None if ti is None else ti[:3]
            entry["gaps"][(a, b)] = {"tuned": _gap(ta, tb), "shared": _gap(sa, sb), "protocol_part": part}
        for label in order(transfer):
            g = transfer[label]
            entry["transfer"][label] = {
                "group": g,
                "vs_own_tuned": _gap(g, row.groups.get(label.removesuffix("_transfer"))),
                "vs_source": {ref: _gap(g, row.groups.get(ref)) for ref in ("muon_moonlight", "adamw")},
            }
        out.append(entry)
    return out


def _primary(task: str, s: dict) -> str:
    metric = s.get("primary_metric")
    if isinstance(metric, str) and metric in s:
        return metric
    try:  # the task's OLMES primary metric; evals imports torch, so only when a task is shown
        from evals.task_data import TASKS

        return TASKS[task].primary if task in TASKS else "acc"
    except ImportError:
        return "acc"


def _downstream(rows: list[Row]) -> dict[str, list[dict[str, Any]]]:
    """task -> [{row, optim, metric, per-seed values, chance, n, loss}] for the scored runs."""
    out: dict[str, list[dict]] = {}
    for row in rows:
        for name in order(n for n, g in row.groups.items() if usable(g)):
            g = row.groups[name]
            per_seed: dict[str, dict[int, dict]] = {}
            for r in g.score.runs:
                for task, s in read_downstream(r).items():
                    per_seed.setdefault(task, {})[int(r.cfg("train.seed", 0))] = s
            for task, by_seed in per_seed.items():
                first = next(iter(by_seed.values()))
                metric = _primary(task, first)
                values = {s: v[metric] for s, v in by_seed.items() if finite(v.get(metric))}
                ci = _accuracy_ci(list(values.values()), first.get(f"{metric}_ci"))
                entry = dict(row=row, optim=name, metric=metric, values=values, chance=first.get("chance"))
                out.setdefault(task, []).append(entry | dict(n=first.get("n"), ci=ci, loss=g.score.mean))
    return out


def _accuracy_ci(vals: list[float], one_seed: Any) -> tuple[float, float]:
    """95% t-interval over seeds; with one seed, the task's own (Wilson) interval over examples."""
    ti = t_interval(vals)
    if ti is not None:
        return ti[1], ti[2]
    return (float(one_seed[0]), float(one_seed[1])) if one_seed else (math.nan, math.nan)
