"""The top of report.md: four answers from launch/report/analysis.py, before any detail."""

from __future__ import annotations

import math

from launch.report.markdown_util import OPT_NAMES, fmt_point, human, opt_name, table
from launch.report.rows import Group
from launch.report.selection import selection_line
from launch.report.series import usable


def _x(v: float | None, nd: int = 4, sign: bool = False) -> str:
    if v is None or not isinstance(v, (int, float)):
        return "—"
    if not math.isfinite(v):
        return "∞" if v > 0 else "−∞" if v < 0 else "diverged"
    s = f"{v:+.{nd}f}" if sign else f"{v:.{nd}f}"
    return s.replace("-", "−")


def _g(v: float | None, nd: int = 3) -> str:
    if v is None or not isinstance(v, (int, float)):
        return "—"
    return "∞" if math.isinf(v) else f"{v:.{nd}g}"


def _edge(g: Group) -> str:
    return f" ⚠ best at the {g.edge} tried: not tuned" if g.edge else ""


def cell(g: Group | None) -> str:
    """An optimizer's score in a table cell, or why there is none."""
    if g is None:
        return "—"
    if not usable(g):
        return f"*pending: {g.status}*" if g.status != "done" else "diverged"
    s = g.score
    n = len(s.runs)
    body = f"{_x(s.mean)} ± {_x(s.std)}" if n > 1 else _x(s.mean)
    return f"{body} (n={n}, LR {fmt_point(s.point)}){_edge(g)}"


def _order(names: set[str]) -> list[str]:
    return sorted(names, key=lambda n: (list(OPT_NAMES).index(n) if n in OPT_NAMES else 99, n))


def render(ctx: dict, pngs: dict[str, str]) -> list[str]:
    h = ctx["headline"]
    out = ["## At a glance", "", selection_line(ctx["plan"]), ""]
    pending = [(p.sweep_id, p.status) for p in ctx["pending"]]
    pending += [(g.sweep_id or f"{r.short}/{n}", g.status) for r in ctx["rows"] for n, g in r.groups.items()]
    pending = [(gid, status) for gid, status in pending if status != "done"]
    out += [
        f"**Progress:** {h['complete']} of {h['total']} (scale, optimizer) groups have final numbers"
        + ("; the others are *pending* (state below), never shown as numbers." if h["complete"] < h["total"] else "."),
        "",
    ]
    if pending:  # the states themselves are in table 1; here how many wait for what
        kinds: dict[str, int] = {}
        for _, status in pending:
            key = status.split(" (")[0]
            kinds[key] = kinds.get(key, 0) + 1
        out += ["Pending: " + "; ".join(f"{k} ({v})" for k, v in kinds.items()) + ".", ""]
    out += _wins(ctx, h) + _speedup(h) + _transfer(h, pngs) + _scaling(h, pngs)
    return out


def _wins(ctx: dict, h: dict) -> list[str]:
    w = h["wins"]
    names = _order({n for e in w["rows"] for n in e["groups"]} | {p.sweep_id.split("/")[1] for p in ctx["pending"]})
    out = [
        "### 1. Which optimizer wins at each scale, and by how much",
        "",
        "Final validation loss (nats/token) at each optimizer's best LR: mean ± std over the scored seeds (n), "
        "the LR in brackets. ⚠: the best LR sits at an edge of its LR grid, so that optimizer is not tuned and "
        "its Δ is not a tuned comparison.",
        "",
    ]
    body = []
    pend = {p.sweep_id: p.status for p in ctx["pending"]}  # groups with no finished run yet
    for e in w["rows"]:
        row = e["row"]
        win = e["winner"]
        if win is None:
            verdict = "—"
        else:
            first, second, gap, c = win
            noise = " (within seed noise)" if c is not None and c.within_noise else (" (1 seed)" if c is None else "")
            verdict = f"**{opt_name(first)}**, by {_x(-gap)} over {opt_name(second)}{noise}"
            waiting = [
                opt_name(k)
                for k in names
                if not usable(row.groups.get(k)) and (k in row.groups or f"{row.short}/{k}" in pend)
            ]
            if waiting:
                verdict += f"; not yet compared: {', '.join(waiting)} (pending)"
        n = f"{row.n_params:,.0f}" if row.n_params else "—"
        cells = [
            cell(row.groups[k])
            if k in row.groups
            else f"*pending: {pend[f'{row.short}/{k}']}*"
            if f"{row.short}/{k}" in pend
            else "—"
            for k in names
        ]
        body.append([row.short, n, f"{row.tokens:,}", *cells, verdict])
    seen = {e["row"].short for e in w["rows"]}
    waiting: dict[str, dict[str, str]] = {}
    for p in ctx["pending"]:
        scale, name = p.sweep_id.split("/", 1)
        if scale not in seen:
            waiting.setdefault(scale, {})[name] = p.status
    for scale, by in waiting.items():
        body.append([scale, "—", "—", *[f"*pending: {by[k]}*" if k in by else "—" for k in names], "—"])
    header = ["scale", "N (non-emb.)", "tokens", *[opt_name(k) for k in names], "lowest loss"]
    out += (table(header, body) if body else ["No finished runs yet."]) + [""]
    out += [
        "Δ = optimizer − reference (negative: lower loss than the reference), paired by seed; 95% t-interval "
        "mean ± t₀.₉₇₅,df·s/√n with df = n − 1 (not a bootstrap: 2–3 seeds are too few to resample); p from the "
        f"two-sided paired t-test, and Holm-adjusted over the **{w['n_tests']} test{'' if w['n_tests'] == 1 else 's'}"
        "** of this table "
        "(every Δ listed; the Significance section below is the same family). *Within seed noise*: the "
        "interval includes 0.",
        "",
    ]
    body = []
    for e in w["rows"]:
        for (a, b), (c, adj) in e["deltas"].items():
            ga, gb = e["groups"].get(a), e["groups"].get(b)
            edges = ((a, ga), (b, gb))
            flag = "; ".join(f"⚠ {opt_name(x)} best at the {g.edge} tried" for x, g in edges if g and g.edge)
            if c is None:
                why = "pending" if not (usable(ga) and usable(gb)) else "1 seed — no test"
                body.append([e["row"].short, f"{opt_name(a)} − {opt_name(b)}", "—", "—", "—", "—", "—", why])
                continue
            p = "undefined" if c.p is None else f"{c.p:.2g}"
            if c.within_noise:
                note = "within seed noise"
            else:
                better = opt_name(a if c.diff < 0 else b)
                holds = adj is not None and adj < 0.05
                note = f"favours {better}" + ("" if holds else " by its interval, not after Holm")
            body.append(
                [
                    e["row"].short,
                    f"{opt_name(a)} − {opt_name(b)}",
                    f"**{_x(c.diff, sign=True)}**",
                    f"[{_x(c.ci[0], sign=True)}, {_x(c.ci[1], sign=True)}]",
                    f"{c.n} ({'paired' if c.paired else 'Welch'}), df {c.df:.3g}",
                    p,
                    "—" if adj is None else f"{adj:.2g}",
                    note + (f"; {flag}" if flag else ""),
                ]
            )
    if body:
        header = ["scale", "Δ", "mean", "95% interval", "seeds (test), df", "p", "Holm p", "reading"]
        out += table(header, body) + [""]
    return out


def _speedup(h: dict) -> list[str]:
    out = [
        "### 2. Data efficiency over AdamW",
        "",
        "Speedup = D_AdamW(L) / D: the tokens AdamW needs to reach an optimizer's loss L (from AdamW's "
        "L(D) = E + B·D^−β fitted on ≥ 3 token budgets at one scale), divided by the tokens the optimizer "
        "used. > 1: fewer tokens than AdamW for the same loss. 95% interval: 4,000 refits, each budget's "
        "mean (AdamW's and the optimizer's) drawn from its t-distribution x̄ + s/√n·T_{n−1}.",
        "",
    ]
    if not h["speedup"]:
        return out + ["No scale has finished runs at several token budgets yet: no L(D) fit, no speedup.", ""]
    for e in h["speedup"]:
        if "fit" not in e:
            out += [f"- {e['scale']}: {e.get('reason', 'no fit')}.", ""]
            continue
        f = e["fit"]
        out += [
            f"{e['scale']} (AdamW at {', '.join(f'{d:,}' for d in e['budgets'])} tokens): L(D) = {f.E:.4f} + "
            f"{f.A:.4g}·D^−{f.alpha:.4f}; E ∈ [{e['E_ci'][0]:.3f}, {e['E_ci'][1]:.3f}], β ∈ "
            f"[{e['beta_ci'][0]:.3f}, {e['beta_ci'][1]:.3f}]"
            + (
                " (3 parameters on 3 budgets: the curve passes through the points; its uncertainty is the seeds')"
                if len(e["budgets"]) == 3
                else ""
            )
            + ("; ⚠ β at the edge of its search range: the budgets do not pin the curve down." if f.at_edge else "."),
            "",
        ]
        body = []
        for r in e["rows"]:
            lo, hi = r["ci"]
            note = []
            if r["extrapolated"]:
                note.append("extrapolated beyond AdamW's budgets")
            if r["edge"]:
                note.append(f"⚠ LR at the {r['edge']} grid edge")
            if math.isinf(hi):
                note.append("upper end unbounded: some draws fall below AdamW's asymptote E")
            body.append(
                [
                    opt_name(r["optim"]),
                    f"{r['tokens']:,}",
                    f"{_x(r['loss'])} (n={r['n']})",
                    "beyond AdamW's asymptote" if math.isinf(r["adamw_tokens"]) else f"{r['adamw_tokens']:,.0f}",
                    f"**{_g(r['speedup'])}×** [{_g(lo)}, {_g(hi)}]",
                    "; ".join(note) or "",
                ]
            )
        out += table(["optimizer", "tokens D", "val loss", "AdamW tokens for it", "speedup [95%]", "note"], body)
        out += [""]
    return out


def _transfer(h: dict, pngs: dict[str, str]) -> list[str]:
    t = h["transfer"]
    out = [
        "### 3. Does the best LR transfer across width?",
        "",
        "Best LR (lowest final loss on the LR-selection seed) at each width d_model of the scaling series "
        "(depth grows with it, see the scales); in brackets the optimum of a parabola in log₂ LR through the "
        "grid minimum and its neighbours. Slope = least-squares slope of log₂ LR* against log₂ d (0: the LR "
        "transfers; −1: LR ∝ 1/width), 95% t-interval with df = widths − 2; octaves = log₂ of the best "
        "LR's change from the narrowest to the widest model (grid LRs).",
        "",
    ]
    if not t["points"]:
        return out + ["No finished LR search yet.", ""]
    widths = sorted({p["d_model"] for pts in t["points"].values() for p in pts})
    body = []
    for name in _order(set(t["points"])):
        pts = {p["d_model"]: p for p in t["points"][name]}
        f = t["fits"][name]
        s = f["slope"]
        slope = (
            "—"
            if s is None
            else f"{_x(s.slope, 2, True)}"
            + (f" [{_x(s.ci[0], 2, True)}, {_x(s.ci[1], 2, True)}] (df={s.df})" if s.ci else " (2 widths: no interval)")
        )
        cells = [
            "—"
            if d not in pts
            else f"{pts[d]['best_lr']:.3g}"
            + (f" ({pts[d]['vertex_lr']:.3g})" if pts[d]["vertex_lr"] else "")
            + (f" ⚠ {pts[d]['edge']} edge" if pts[d]["edge"] else "")
            for d in widths
        ]
        oct_ = "—" if f["octaves"] is None else _x(f["octaves"], 1, True)
        body.append([opt_name(name), *cells, slope, oct_])
    out += table(["optimizer", *[f"d={d}" for d in widths], "slope log₂LR*/log₂d", "octaves moved"], body)
    out += ["", _transfer_verdict(t), "", f"![loss against LR per width]({pngs['lr']})", ""]
    return out


def _transfer_verdict(t: dict) -> str:
    f = t["fits"]
    if "orscale_lm" not in f or "adamw" not in f or f["orscale_lm"]["slope"] is None or f["adamw"]["slope"] is None:
        return "Verdict: needs OrScale-LM and AdamW at ≥ 2 widths."
    o, a = f["orscale_lm"], f["adamw"]
    so, sa = o["slope"], a["slope"]
    by_slope = abs(so.slope) < abs(sa.slope)
    oo, oa = round(abs(o["octaves"]), 2), round(abs(a["octaves"]), 2)  # grid LRs: equal moves compare equal
    by_oct, same_oct = oo < oa, oo == oa
    tail = ""
    if by_slope and by_oct:
        words = "moves less than"
    elif by_slope and same_oct:
        words, tail = "has a flatter fitted slope than", ", though both moved the same number of grid octaves"
    elif not by_slope and not by_oct:
        words = "does not move less than"
    else:
        words, tail = "is not clearly flatter than", ": slope and grid octaves disagree"
    line = (
        f"Verdict: OrScale-LM's best LR {words} AdamW's across d = {o['widths'][0]}–{o['widths'][1]}{tail} "
        f"(slope {_x(so.slope, 2, True)} vs {_x(sa.slope, 2, True)}; {_x(o['octaves'], 1, True)} vs "
        f"{_x(a['octaves'], 1, True)} octaves)"
    )
    if so.se is not None and sa.se is not None:
        from launch.report.stats import t_ppf

        df = min(so.df, sa.df)
        diff, se = so.slope - sa.slope, math.hypot(so.se, sa.se)
        half = t_ppf(0.975, df) * se
        inside = diff - half <= 0 <= diff + half
        line += (
            f"; slope difference {_x(diff, 2, True)} [{_x(diff - half, 2, True)}, {_x(diff + half, 2, True)}] "
            f"(df={df}, conservative)" + (": the ladder cannot tell them apart." if inside else ".")
        )
    else:
        line += "; too few widths for an interval."
    edges = sorted(set(o["edges"]) | set(a["edges"]))
    if edges:
        line += f" ⚠ best LR at a grid edge at {', '.join(edges)}: the slope there is a bound, not an estimate."
    return line


def _scaling(h: dict, pngs: dict[str, str]) -> list[str]:
    s = h["scaling"]
    out = [
        "### 4. How the gap changes with scale",
        "",
        f"L(N) = E + A·N^−α per optimizer over the scales {', '.join(s['series']) or '—'} (N = non-embedding "
        "parameters, one token budget), fitted to each scale's mean at the best LR; 95% intervals from 4,000 "
        "refits with each scale's mean drawn from its t-distribution. Gap = Δ at each scale (section 1); trend "
        "= least-squares slope of Δ against log₁₀ N (per decade of N), 95% t-interval.",
        "",
    ]
    body = []
    for name in _order(set(s["fits"])):
        e = s["fits"][name]
        if "fit" not in e:
            body.append([opt_name(name), str(e["n"]), e["reason"], "—", "—", "—"])
            continue
        f = e["fit"]
        note = "α at the edge of its search range in the point fit: unreliable" if f.at_edge else ""
        cis = {"E": (f.E, e["E_ci"]), "A": (f.A, e["A_ci"]), "α": (f.alpha, e["alpha_ci"])}
        outside = [k for k, (v, (lo, hi)) in cis.items() if not lo <= v <= hi]
        if outside:
            note = (
                note + "; " if note else ""
            ) + f"degenerate fit: the point {', '.join(outside)} lies outside its refits' interval"
        if e["alpha_edge_share"] > 0.05:
            note = (note + "; " if note else "") + f"{e['alpha_edge_share']:.0%} of refits put α at its range's edge"
        body.append(
            [
                opt_name(name),
                str(e["n"]),
                f"{f.E:.3f} [{e['E_ci'][0]:.3f}, {e['E_ci'][1]:.3f}]",
                f"{f.A:.3g} [{e['A_ci'][0]:.3g}, {e['A_ci'][1]:.3g}]",
                f"{f.alpha:.3f} [{e['alpha_ci'][0]:.3f}, {e['alpha_ci'][1]:.3f}]",
                note,
            ]
        )
    out += table(["optimizer", "scales", "E [95%]", "A [95%]", "α [95%]", "note"], body) + [""]
    for (a, b), gap in s["gaps"].items():
        parts = [
            f"{_x(d, sign=True)} [{_x(lo, sign=True)}, {_x(hi, sign=True)}] at N={human(n)}"
            for n, d, (lo, hi) in zip(gap["N"], gap["diff"], gap["ci"], strict=True)
        ]
        tr = gap["trend"]
        trend = (
            "trend: too few scales"
            if tr is None
            else f"trend {_x(tr.slope, sign=True)} per decade of N"
            + (f" [{_x(tr.ci[0], sign=True)}, {_x(tr.ci[1], sign=True)}] (df={tr.df})" if tr.ci else "")
        )
        out += [f"- Gap {opt_name(a)} − {opt_name(b)}: " + "; ".join(parts) + f"; {trend}."]
    out += ["", f"![final loss and gap against parameters]({pngs['params']})", ""]
    return out
