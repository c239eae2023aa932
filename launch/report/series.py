"""Which rows form a series: the usable groups, the scaling series at one token budget, the token
budgets of one scale, and AdamW's L(D) with the data-efficiency multiplier (point estimates; the
intervals are launch/report/analysis.py's)."""

from __future__ import annotations

import math
from typing import Any

from launch.report.rows import Group, Row
from launch.report.stats import fit_power_law


def usable(g: Group | None) -> bool:
    """A group whose numbers count: its plan is done and its score is finite."""
    return g is not None and g.status == "done" and bool(g.score.runs) and math.isfinite(g.score.mean)


def main_series(rows: list[Row]) -> dict[str, list[Row]]:
    """family -> its rows at the token budget most of its scales share (ties: the larger budget),
    one row per scale: L(N) compares scales at one budget, not each scale's longest run."""
    out = {}
    for family in dict.fromkeys(r.family for r in rows):
        fam = [r for r in rows if r.family == family]
        count: dict[int, set] = {}
        for r in fam:
            count.setdefault(r.tokens, set()).add(r.label)
        budget = max(count, key=lambda t: (len(count[t]), t))
        out[family] = sorted((r for r in fam if r.tokens == budget), key=lambda r: (r.n_params or 0, r.label))
    return out


def scaling_points(rows: list[Row]) -> dict[tuple[str, str], list[tuple[float, float, str]]]:
    """(family, optimizer) -> [(N, mean loss at the best LR, row name)], one point per scale at the
    family's main budget (`main_series`)."""
    out: dict[tuple[str, str], list] = {}
    for family, series in main_series(rows).items():
        for row in series:
            for name, g in row.groups.items():
                if row.n_params and usable(g):
                    out.setdefault((family, name), []).append((float(row.n_params), g.score.mean, row.name))
    return {k: sorted(v) for k, v in out.items()}


def budget_rows(rows: list[Row]) -> dict[tuple[str, str], list[Row]]:
    """(family, scale label) -> its rows at different token budgets, by tokens."""
    by_scale: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        by_scale.setdefault((row.family, row.label), []).append(row)
    return {k: sorted(v, key=lambda r: r.tokens) for k, v in by_scale.items()}


def data_efficiency(rows: list[Row]) -> list[dict]:
    """Per scale with >= 3 AdamW token budgets: fit AdamW's L(D) = E + B D^-beta, then for each
    optimizer and budget D_opt, the AdamW tokens that reach its loss, divided by D_opt."""
    out = []
    for (_, label), group_rows in budget_rows(rows).items():
        pts = [(row.tokens, row.groups["adamw"].score.mean) for row in group_rows if usable(row.groups.get("adamw"))]
        if len({d for d, _ in pts}) < 2:
            continue
        fit = fit_power_law([d for d, _ in pts], [loss for _, loss in pts])
        entry: dict[str, Any] = {
            "scale": group_rows[0].short if len(group_rows) == 1 else label,
            "label": label,
            "adamw_budgets": sorted({d for d, _ in pts}),
            "fit": fit,
            "rows": [],
        }
        if fit is not None:
            for row in group_rows:
                for name, g in row.groups.items():
                    if name != "adamw" and usable(g):
                        entry["rows"].append((name, row.tokens, g.score.mean, fit.inverse(g.score.mean) / row.tokens))
        out.append(entry)
    return out
