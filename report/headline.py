"""The top of report.md: how the LRs were chosen, the four answers (report/analysis.py) and the
protocols side by side, before any detail."""

from __future__ import annotations

import math
from collections import Counter

from records.points import SweepPlan
from report.analysis import Report, Winner
from report.fmt import fmt_point, human, interval, num, opt_name, order, sig, table
from report.runs import Group, usable
from report.stats import Comparison, t_ppf


def _edge(g: Group) -> str:
    return f" ⚠ best at the {g.edge} tried: not tuned" if g.edge else ""


def cell(g: Group | None) -> str:
    """An optimizer's score in a table cell, or why there is none."""
    if g is None:
        return "—"
    if not usable(g):
        return f"*pending: {g.status}*" if g.status != "done" else "diverged"
    s = g.score
    body = f"{num(s.mean)} ± {num(s.std)}" if len(s.runs) > 1 else num(s.mean)
    return f"{body} (n={len(s.runs)}, LR {fmt_point(s.point)}){_edge(g)}"


def selection_line(plan: SweepPlan | None) -> str:
    """The one line that says how LRs were chosen and scored."""
    if plan is None or plan.search is None:
        return (
            "**LR selection:** no LR search in the logs (no `sweep_plan.json` with `lr_search`): each "
            "optimizer's best LR was chosen and scored on the same seeds, so the numbers at the best LR are "
            "biased low by the selection (more so the more LRs were tried)."
        )
    seed = plan.search_seed
    seeds = [s for s in plan.seeds if s != seed]
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
    ratios, rounds = plan.search.get("adamw_ratios") or [], plan.search.get("rounds", 1)
    if ratios:
        line += (
            " **Both** peak LRs were tuned: the hidden matrices' (`optim.lr`) and the AdamW group's "
            "(`optim.adamw_lr`: token embedding = tied head, norm gains), by coordinate search on that seed — the "
            f"LR grid at adamw_lr = lr, then adamw_lr at {', '.join(f'{r:g}' for r in ratios)} × the best LR, then "
            f"the LR at the best adamw_lr (up to {rounds} round{'s' if rounds > 1 else ''}), each line extended past "
            "an edge optimum. The other protocols are in the Protocols section below."
        )
    return line


def render(rep: Report, pngs: dict[str, str]) -> list[str]:
    complete, total = rep.progress
    out = ["## At a glance", "", selection_line(rep.plan), ""]
    out += [
        f"**Progress:** {complete} of {total} (scale, optimizer) groups have final numbers"
        + ("; the others are *pending* (state below), never shown as numbers." if complete < total else "."),
        "",
    ]
    pending = [p.status for p in rep.pending] + [g.status for r in rep.rows for g in r.groups.values()]
    kinds = Counter(s.split(" (")[0] for s in pending if s != "done")  # the states themselves are in table 1
    if kinds:
        out += ["Pending: " + "; ".join(f"{k} ({v})" for k, v in kinds.items()) + ".", ""]
    return out + _wins(rep) + _speedup(rep, pngs) + _transfer(rep, pngs) + _scaling(rep, pngs) + _protocols(rep, pngs)


def _pending(status: str | None) -> str:
    return "—" if status is None else f"*pending: {status}*"


def _wins(rep: Report) -> list[str]:
    pend = {p.sweep_id: p.status for p in rep.pending}  # groups with no finished run yet
    names = order({n for r in rep.ordered for n in r.groups} | {gid.split("/")[1] for gid in pend})
    out = [
        "### 1. Which optimizer wins at each scale, and by how much",
        "",
        "Final validation loss (nats/token) at each optimizer's best LR: mean ± std over the scored seeds (n), "
        "the LR in brackets. ⚠: the best LR sits at an edge of its LR grid, so that optimizer is not tuned and "
        "its Δ is not a tuned comparison; the last column names a winner only where every other optimizer's best "
        'LR is inside its grid ("untuned: no winner" otherwise).',
        "",
    ]
    body = []
    for row in rep.ordered:
        verdict = "—"
        if row.name in rep.winners:
            verdict = _verdict(rep.winners[row.name])
            known = [k for k in names if k in row.groups or f"{row.short}/{k}" in pend]
            waiting = [opt_name(k) for k in known if not usable(row.groups.get(k))]
            if waiting:
                verdict += f"; not yet compared: {', '.join(waiting)} (pending)"
        cells = [cell(row.groups[k]) if k in row.groups else _pending(pend.get(f"{row.short}/{k}")) for k in names]
        body.append([row.short, f"{row.n_params:,.0f}" if row.n_params else "—", f"{row.tokens:,}", *cells, verdict])
    seen = {r.short for r in rep.ordered}
    for scale in dict.fromkeys(gid.split("/")[0] for gid in pend if gid.split("/")[0] not in seen):
        body.append([scale, "—", "—", *[_pending(pend.get(f"{scale}/{k}")) for k in names], "—"])
    header = ["scale", "N (non-emb.)", "tokens", *[opt_name(k) for k in names], "lowest loss"]
    out += (table(header, body) if body else ["No finished runs yet."]) + [""]
    n = rep.n_tests
    out += [
        "Δ = optimizer − reference (negative: lower loss than the reference), paired by seed; 95% t-interval "
        "mean ± t₀.₉₇₅,df·s/√n with df = n − 1 (not a bootstrap: 2–3 seeds are too few to resample); p from the "
        f"two-sided paired t-test (Welch's where the seeds differ), and Holm-adjusted over the **{n} "
        f"test{'' if n == 1 else 's'}** of this table (every Δ listed). *Within seed noise*: the interval includes 0.",
        "",
    ]
    body = []
    for row in rep.ordered:
        for (rname, a, b), c in rep.comparisons.items():
            if rname != row.name:
                continue
            ga, gb = row.groups.get(a), row.groups.get(b)
            flags = [f"⚠ {opt_name(x)} best at the {g.edge} tried" for x, g in ((a, ga), (b, gb)) if g and g.edge]
            label = [row.short, f"{opt_name(a)} − {opt_name(b)}"]
            if c is None:
                why = "pending" if not (usable(ga) and usable(gb)) else "1 seed — no test"
                body.append([*label, "—", "—", "—", "—", "—", why])
                continue
            holds = c.p_holm is not None and c.p_holm < 0.05
            note = f"favours {opt_name(a if c.diff < 0 else b)}" + ("" if holds else " by its interval, not after Holm")
            note = "; ".join(["within seed noise" if c.within_noise else note, *flags])
            test = f"{c.n} ({'paired' if c.paired else 'Welch'}), df {c.df:.3g}" if c.df is not None else f"{c.n}"
            p, holm = "undefined" if c.p is None else f"{c.p:.2g}", "—" if c.p_holm is None else f"{c.p_holm:.2g}"
            body.append([*label, f"**{num(c.diff, sign=True)}**", interval(*c.ci), test, p, holm, note])
    if body:
        out += table(["scale", "Δ", "mean", "95% interval", "seeds (test), df", "p", "Holm p", "reading"], body) + [""]
    return out


def _verdict(w: Winner) -> str:
    """The "lowest loss" cell: a winner only where the comparison is tuned (every other optimizer's best
    LR inside its grid); otherwise the lowest loss, said to be untuned."""
    if w.none_tuned:
        return "untuned: no winner (every best LR at an edge of its grid; extend the grids)"
    c = w.comparison
    noise = " (within seed noise)" if c is not None and c.within_noise else (" (1 seed)" if c is None else "")
    margin = f"by {num(-w.gap)} over {opt_name(w.second)}{noise}"
    if not w.tuned:
        edges = ", ".join(opt_name(n) for n in w.untuned)
        return f"untuned: no winner; lowest {opt_name(w.first)}, {margin}; ⚠ best LR at a grid edge: {edges}"
    flag = "; ⚠ its best LR at a grid edge: it may do better still" if w.untuned else ""
    return f"**{opt_name(w.first)}**, {margin}{flag}"


def _speedup(rep: Report, pngs: dict[str, str]) -> list[str]:
    out = [
        "### 2. Data efficiency over AdamW",
        "",
        "Speedup = D_AdamW(L) / D: the tokens AdamW needs to reach an optimizer's loss L (from AdamW's "
        "L(D) = E + B·D^−β fitted on ≥ 3 token budgets at one scale), divided by the tokens the optimizer "
        "used. > 1: fewer tokens than AdamW for the same loss. 95% interval: 4,000 refits, each budget's "
        "mean (AdamW's and the optimizer's) drawn from its t-distribution x̄ + s/√n·T_{n−1}.",
        "",
    ]
    if not rep.speedup:
        return out + ["No scale has finished runs at several token budgets yet: no L(D) fit, no speedup.", ""]
    for e in rep.speedup:
        if "fit" not in e:
            out += [f"- {e['scale']}: {e.get('reason', 'no fit')}.", ""]
            continue
        f, (elo, ehi), (blo, bhi) = e["fit"], e["E_ci"], e["alpha_ci"]
        line = f"{e['scale']} (AdamW at {', '.join(f'{d:,}' for d in e['budgets'])} tokens): L(D) = {f.E:.4f} + "
        line += f"{f.A:.4g}·D^−{f.alpha:.4f}; E ∈ [{elo:.3f}, {ehi:.3f}], β ∈ [{blo:.3f}, {bhi:.3f}]"
        if len(e["budgets"]) == 3:
            line += " (3 parameters on 3 budgets: the curve passes through the points; its uncertainty is the seeds')"
        edge = "; ⚠ β at the edge of its search range: the budgets do not pin the curve down."
        out += [line + (edge if f.at_edge else "."), ""]
        body = []
        for r in e["rows"]:
            lo, hi = r["ci"]
            note = ["extrapolated beyond AdamW's budgets"] if r["extrapolated"] else []
            note += [f"⚠ LR at the {r['edge']} grid edge"] if r["edge"] else []
            note += ["upper end unbounded: some draws fall below AdamW's asymptote E"] if math.isinf(hi) else []
            tokens = "beyond AdamW's asymptote" if math.isinf(r["adamw_tokens"]) else f"{r['adamw_tokens']:,.0f}"
            speed = f"**{sig(r['speedup'])}×** [{sig(lo)}, {sig(hi)}]"
            cells = [opt_name(r["optim"]), f"{r['tokens']:,}", f"{num(r['loss'])} (n={r['n']})", tokens, speed]
            body.append([*cells, "; ".join(note)])
        out += table(["optimizer", "tokens D", "val loss", "AdamW tokens for it", "speedup [95%]", "note"], body) + [""]
    if "efficiency" in pngs:
        out += [f"![AdamW L(D) and the other optimizers' budgets]({pngs['efficiency']})", ""]
    return out


def _transfer(rep: Report, pngs: dict[str, str]) -> list[str]:
    t = rep.transfer
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
    for name in order(t["points"]):
        pts = {p["d_model"]: p for p in t["points"][name]}
        f, s = t["fits"][name], t["fits"][name]["slope"]
        slope = "—" if s is None else num(s.slope, 2, True)
        slope += (
            "" if s is None else f" {interval(s.ci[0], s.ci[1], 2)} (df={s.df})" if s.ci else " (2 widths: no interval)"
        )
        cells = [_best_lr(pts.get(d)) for d in widths]
        body.append([opt_name(name), *cells, slope, "—" if f["octaves"] is None else num(f["octaves"], 1, True)])
    out += table(["optimizer", *[f"d={d}" for d in widths], "slope log₂LR*/log₂d", "octaves moved"], body)
    return out + ["", _transfer_verdict(t), "", f"![loss against LR per width]({pngs['lr']})", ""]


def _best_lr(p: dict | None) -> str:
    """A best LR, the parabola's optimum in brackets, and its grid-edge flag."""
    if p is None:
        return "—"
    vertex, edge = f" ({p['vertex_lr']:.3g})" if p["vertex_lr"] else "", f" ⚠ {p['edge']} edge" if p["edge"] else ""
    return f"{p['best_lr']:.3g}{vertex}{edge}"


def _transfer_verdict(t: dict) -> str:
    f = t["fits"]
    if "orscale_lm" not in f or "adamw" not in f or f["orscale_lm"]["slope"] is None or f["adamw"]["slope"] is None:
        return "Verdict: needs OrScale-LM and AdamW at ≥ 2 widths."
    o, a = f["orscale_lm"], f["adamw"]
    so, sa = o["slope"], a["slope"]
    by_slope = abs(so.slope) < abs(sa.slope)
    oo, oa = round(abs(o["octaves"]), 2), round(abs(a["octaves"]), 2)  # grid LRs: equal moves compare equal
    tail = ""
    if by_slope and oo < oa:
        words = "moves less than"
    elif by_slope and oo == oa:
        words, tail = "has a flatter fitted slope than", ", though both moved the same number of grid octaves"
    elif not by_slope and not oo < oa:
        words = "does not move less than"
    else:
        words, tail = "is not clearly flatter than", ": slope and grid octaves disagree"
    line = (
        f"Verdict: OrScale-LM's best LR {words} AdamW's across d = {o['widths'][0]}–{o['widths'][1]}{tail} "
        f"(slope {num(so.slope, 2, True)} vs {num(sa.slope, 2, True)}; {num(o['octaves'], 1, True)} vs "
        f"{num(a['octaves'], 1, True)} octaves)"
    )
    if so.se is not None and sa.se is not None:
        df = min(so.df, sa.df)
        diff, half = so.slope - sa.slope, t_ppf(0.975, df) * math.hypot(so.se, sa.se)
        inside = diff - half <= 0 <= diff + half
        line += f"; slope difference {num(diff, 2, True)} {interval(diff - half, diff + half, 2)} (df={df}, "
        line += "conservative): the ladder cannot tell them apart." if inside else "conservative)."
    else:
        line += "; too few widths for an interval."
    edges = sorted(set(o["edges"]) | set(a["edges"]))
    if edges:
        line += f" ⚠ best LR at a grid edge at {', '.join(edges)}: the slope there is a bound, not an estimate."
    return line


def _scaling(rep: Report, pngs: dict[str, str]) -> list[str]:
    s = rep.scaling
    out = [
        "### 4. How the gap changes with scale",
        "",
        f"L(N) = E + A·N^−α per optimizer over the scales {', '.join(s['series']) or '—'} (N = non-embedding "
        "parameters, one token budget), fitted to each scale's mean at the best LR (a grid over α in [0.005, 3], "
        "least squares for E ≥ 0 and A ≥ 0); 95% intervals from 4,000 refits with each scale's mean drawn from "
        "its t-distribution. Gap = Δ at each scale (section 1); trend "
        "= least-squares slope of Δ against log₁₀ N (per decade of N), 95% t-interval.",
        "",
    ]
    body = []
    for name in order(s["fits"]):
        e = s["fits"][name]
        if "fit" not in e:
            body.append([opt_name(name), str(e["n"]), e["reason"], "—", "—", "—"])
            continue
        f = e["fit"]
        notes = ["α at the edge of its search range in the point fit: unreliable"] if f.at_edge else []
        cis = {"E": (f.E, e["E_ci"]), "A": (f.A, e["A_ci"]), "α": (f.alpha, e["alpha_ci"])}
        outside = [k for k, (v, (lo, hi)) in cis.items() if not lo <= v <= hi]
        if outside:
            notes.append(f"degenerate fit: the point {', '.join(outside)} lies outside its refits' interval")
        if e["alpha_edge_share"] > 0.05:
            notes.append(f"{e['alpha_edge_share']:.0%} of refits put α at its range's edge")
        specs = zip(cis.values(), (".3f", ".3g", ".3f"), strict=True)
        cells = [f"{v:{spec}} [{lo:{spec}}, {hi:{spec}}]" for (v, (lo, hi)), spec in specs]
        body.append([opt_name(name), str(e["n"]), *cells, "; ".join(notes)])
    out += table(["optimizer", "scales", "E [95%]", "A [95%]", "α [95%]", "note"], body) + [""]
    for (a, b), gap in s["gaps"].items():
        parts = [
            f"{num(d, sign=True)} {interval(lo, hi)} at N={human(n)}"
            for n, d, (lo, hi) in zip(gap["N"], gap["diff"], gap["ci"], strict=True)
        ]
        tr = gap["trend"]
        trend = "trend: too few scales" if tr is None else f"trend {num(tr.slope, sign=True)} per decade of N"
        trend += f" {interval(*tr.ci)} (df={tr.df})" if tr is not None and tr.ci else ""
        out += [f"- Gap {opt_name(a)} − {opt_name(b)}: " + "; ".join(parts) + f"; {trend}."]
    return out + ["", f"![final loss and gap against parameters]({pngs['params']})", ""]


def _ci(c: Comparison | None) -> str:
    if c is None:
        return "—"
    return f"{num(c.diff, sign=True)} {interval(*c.ci)}" + (" (within seed noise)" if c.within_noise else "")


def _protocols(rep: Report, pngs: dict[str, str]) -> list[str]:
    if not rep.protocols:
        return []
    out = [
        "## Protocols: how much of each result is the way the LRs were chosen",
        "",
        "**tuned** (the headline above): each optimizer's two peak LRs — the matrices' and the AdamW group's "
        "(token embedding = tied head, norm gains) — chosen on the search seed. **shared**: one LR for both groups "
        "(`optim.adamw_lr` unset), chosen on the same seed from the same search's adamw_lr = lr line. **transfer**: "
        "OrScale-LM at Muon+Moonlight's tuned LRs, no re-tuning (the paper's claim that Moonlight's LRs carry over). "
        "All scored on the same evaluation seeds; Δ paired by seed, 95% t-interval.",
        "",
        "### Each optimizer under the tuned and the shared protocol",
        "",
    ]
    body = [
        [e["row"].short, opt_name(n), cell(o["tuned"]), cell(o["shared"]), _ci(o["tuned_vs_shared"])]
        for e in rep.protocols
        for n, o in e["optims"].items()
    ]
    out += table(["row", "optimizer", "tuned", "shared", "tuned − shared"], body) + [""]
    out += [
        "### Gaps between optimizers under each protocol",
        "",
        "The protocol's part = gap(shared) − gap(tuned): how much of the shared protocol's gap came from tying "
        "the AdamW group's LR to the matrices'.",
        "",
    ]
    body = []
    for e in rep.protocols:
        for (a, b), gp in e["gaps"].items():
            part = gp["protocol_part"]
            part_text = "—" if part is None else f"{num(part[0], sign=True)} {interval(part[1], part[2])}"
            body.append(
                [e["row"].short, f"{opt_name(a)} − {opt_name(b)}", _ci(gp["tuned"]), _ci(gp["shared"]), part_text]
            )
    out += table(["row", "gap", "tuned", "shared", "the protocol's part"], body) + [""]
    if any(e["transfer"] for e in rep.protocols):
        out += ["### Transfer: OrScale-LM at Muon+Moonlight's tuned LRs", ""]
        body = [
            [e["row"].short, cell(t["group"]), _ci(t["vs_own_tuned"]), *(_ci(c) for c in t["vs_source"].values())]
            for e in rep.protocols
            for t in e["transfer"].values()
        ]
        header = ["row", "OrScale-LM at Moonlight's LRs", "− OrScale-LM tuned", "− Muon+Moonlight tuned"]
        out += table([*header, "− AdamW tuned"], body) + [""]
    if "lr_grid" in pngs:
        out += [f"![loss over both LRs]({pngs['lr_grid']})", ""]
    return out
