"""report.md and summary.json for launch.report (the numbers come from launch/report/rows.py and
analysis.py; the top section is headline.py, the later detail sections are here and in sections.py)."""

from __future__ import annotations

import math
from typing import Any

from launch.report import headline, protocols, sections
from launch.report.markdown_util import OPT_NAMES, fmt, fmt_point, opt_name, provenance, table
from launch.report.series import usable
from launch.report.stats import holm

__all__ = ["OPT_NAMES", "render", "summary_json"]


def _num(x: Any) -> Any:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def render(ctx: dict, pngs: dict[str, str]) -> str:
    runs, root = ctx["runs"], ctx["runs_dir"]
    n_fin = sum(r.finished for r in runs)
    out = [
        f"# Sweep report: `{root}`",
        "",
        f"{len(runs)} run directories: {n_fin} finished, {len(runs) - n_fin} unfinished (listed at the end, "
        "never as numbers). Losses are the final validation cross-entropy (nats/token) of each run's last "
        "evaluation at `train.max_steps`. A row is one setting (model, steps × tokens per step, context and every "
        "other option but optimizer, LR and seed); **best LR** = lowest final loss on the LR-selection seed "
        "(with an LR search), else lowest mean over seeds; a diverged seed (null/NaN) disqualifies its LR. "
        "Provenance: each run directory, `@commit` from its run.log and `cfg:` = first 8 hex digits of "
        "`sha256sum config.yaml`.",
        "",
    ]
    out += headline.render(ctx, pngs)
    out += protocols.render(ctx, pngs)
    out += _paper_table(ctx)
    out += _significance(ctx)
    out += _lr_sensitivity(ctx, pngs)
    out += _scaling(ctx, pngs)
    out += sections.curves(ctx, pngs)
    out += sections.downstream(ctx, pngs)
    out += sections.hyperparameters(ctx)
    out += sections.throughput(ctx, pngs)
    out += sections.unfinished(runs, root)
    return "\n".join(out)


def _paper_table(ctx: dict) -> list[str]:
    rows, runs, root = ctx["rows"], ctx["runs"], ctx["runs_dir"]
    out = ["## Final validation loss at the best learning rate", ""]
    body = []
    for row in rows:
        ref = row.groups.get("adamw")
        for name, g in sorted(row.groups.items()):
            b = g.score
            paper = ctx["paper"].get(row.paper_scale or "", {}).get(name)
            gap = b.mean - ref.score.mean if usable(ref) and usable(g) and name != "adamw" else None
            tokens = sorted({r.final_tokens for r in b.runs})
            vtok = sorted({r.val_tokens for r in b.runs}, key=str)
            loss = f"{fmt(b.mean)} ± {fmt(b.std)}" if len(b.runs) > 1 else fmt(b.mean)
            body.append(
                [
                    row.label,
                    f"{row.steps} × {row.tokens_per_step:,}",
                    opt_name(name),
                    fmt_point(b.point) + (f" ⚠ at the {g.edge} tried" if g.edge else ""),
                    loss if g.status == "done" else f"*pending: {g.status}* (so far {loss})" if b.runs else "*pending*",
                    str(len(b.runs)),
                    ", ".join(f"{t:,}" for t in tokens),
                    ", ".join(f"{t:,}" if t else "?" for t in vtok),
                    fmt(gap, sign=True) if gap is not None else "—",
                    f"{paper:.4f} (paper, {row.paper_scale})" if paper is not None else "—",
                    provenance(b.runs, root),
                ]
            )
    header = ["scale", "steps × tokens/step", "optimizer", "best LR (matrices / AdamW group)", "val loss (mean ± std)"]
    header += ["seeds"]
    header += ["tokens seen", "val tokens", "Δ vs AdamW", "paper's number (SPEC §4, not ours)", "runs (commit, config)"]
    out += table(header, body) if body else ["No finished runs."]
    commits = sorted({c for r in runs if r.finished for c in r.commits})
    if len(commits) > 1:
        out += [
            "",
            f"**Note:** the finished runs come from {len(commits)} different commits "
            f"({', '.join(c[:10] + ('-dirty' if c.endswith('-dirty') else '') for c in commits)}); "
            "compare cells across commits with care.",
        ]
    if any(c.endswith("-dirty") for c in commits):
        out += [
            "",
            "**Note:** `-dirty` runs were started from a work tree with uncommitted changes: the "
            "commit alone does not reproduce them.",
        ]
    out += [
        "",
        "The *paper's number* column is the published one-seed result (SPEC §4), shown only where the row "
        "has the paper's preset, steps, tokens per step and context (configs/<scale>.yaml); it is never used "
        "in any statistic here. Seeds: those scored (with an LR search, the evaluation seeds only).",
        "",
    ]
    return out


def _significance(ctx: dict) -> list[str]:
    comps = ctx["comparisons"]
    keys = [k for k, c in comps.items() if c is not None and c.p is not None]
    adjusted = dict(zip(keys, holm([comps[k].p for k in keys]), strict=True))
    out = [
        "## Significance",
        "",
        "Δ = (optimizer − reference) mean final loss, each at its best LR; negative favours the optimizer. "
        "95% t-interval (mean ± t₀.₉₇₅,df·s/√n) of the seed-paired differences when both have the same seeds, "
        "else Welch's interval; t-test paired by seed (else Welch). Not a percentile bootstrap: over 2–3 seeds it "
        f"is too narrow. Holm-adjusted p over the {len(keys)} tests of this table beside the raw p.",
        "",
    ]
    body = []
    groups = {(r.name, n): g for r in ctx["rows"] for n, g in r.groups.items()}
    for (row_name, name, ref), c in comps.items():
        label = f"{opt_name(name)} vs {opt_name(ref)}"
        if c is None:
            a, b = groups[(row_name, name)], groups[(row_name, ref)]
            if not (usable(a) and usable(b)):
                why = "pending" if a.status != "done" or b.status != "done" else "diverged"
                body.append([row_name, label, "—", "—", why, "—", "—", ""])
            else:
                body.append([row_name, label, "—", "—", "1 seed — no test", "—", "—", ""])
            continue
        p = "undefined (zero variance)" if c.p is None else f"{c.p:.3g}"
        adj = adjusted.get((row_name, name, ref))
        test = (
            f"paired t (n={c.n}, t={c.t:.3g}, df={c.df:.3g})"
            if c.paired and c.t is not None
            else f"Welch t (df={c.df:.3g})"
            if c.t is not None
            else ("paired" if c.paired else "unpaired")
        )
        body.append(
            [
                row_name,
                label,
                fmt(c.diff, sign=True),
                f"[{fmt(c.ci[0], sign=True)}, {fmt(c.ci[1], sign=True)}]",
                test,
                p,
                "—" if adj is None else f"{adj:.3g}",
                "within seed noise" if c.within_noise else "",
            ]
        )
    header = ["row", "comparison", "Δ", "95% CI", "test", "p", "Holm p", "note"]
    return out + (table(header, body) if body else ["No comparisons."]) + [""]


def _lr_sensitivity(ctx: dict, pngs: dict[str, str]) -> list[str]:
    out = [
        "## Learning-rate sensitivity",
        "",
        "Final val loss per point tried: on the LR-selection seed (with an LR search: the only seed run at every "
        "point), else the mean over seeds; (runs at that point). **Bold** = best. A point is the matrices' peak "
        "LR, or `LR / AdamW-group LR` where the AdamW group (embedding, tied head, norm gains) ran at its own.",
        "",
    ]
    for row in ctx["rows"]:
        if all(len(g.cells) < 2 for g in row.groups.values()) and any(g.fixed for g in row.groups.values()):
            continue  # a budget run at another scale's best point (lr_from): nothing to compare
        body = []
        for name, g in sorted(row.groups.items()):
            cells = []
            for pt in sorted(g.cells):
                text = f"{fmt_point(pt)}: {fmt(g.selection_loss(pt))} ({len(g.cells[pt].runs)})"
                cells.append(f"**{text}**" if pt == g.best.point else text)
            note = (
                "one point only"
                if len(g.cells) == 1
                else f"best at the {g.edge} tried — extend the search"
                if g.edge
                else "interior optimum"
            )
            if g.status != "done":
                note = f"{note}; {g.status}"
            body.append([opt_name(name), "; ".join(cells), note])
        out += [f"### {row.name}", ""] + table(["optimizer", "points tried (loss, runs)", "note"], body) + [""]
    out += [f"![loss vs LR]({pngs['lr']})", ""]
    return out


def _scaling(ctx: dict, pngs: dict[str, str]) -> list[str]:
    out = [
        "## Scaling",
        "",
        "L(N) = E + A·N^(−α) per optimizer over the scales of a row family (N = non-embedding "
        "parameters; the token budget most scales share, best LR, scored seeds). Fit: grid over α in "
        "[0.005, 3], least squares for E ≥ 0 and A ≥ 0; intervals in the headline's section 4.",
        "",
    ]
    body = []
    for (family, name), pts in sorted(ctx["points"].items()):
        fit = ctx["fits"].get((family, name))
        where = ", ".join(f"{n:.3g}" for n, _, _ in pts)
        head = [family, opt_name(name), str(len(pts)), where]
        if fit is None:
            body.append(head + [f"too few scales for a fit ({len({n for n, _, _ in pts})} < 3)", "—", "—", "—"])
        else:
            alpha = f"{fit.alpha:.4f}" + (" (edge of the α range: unreliable)" if fit.at_edge else "")
            body.append(head + [f"{fit.E:.4f}", f"{fit.A:.4g}", alpha, f"{fit.rmse:.2g}"])
    header = ["family (settings hash)", "optimizer", "scales", "N", "E", "A", "α", "rmse"]
    out += table(header, body) if body else ["No points."]
    out += ["", "### Data efficiency against AdamW", ""]
    if not ctx["efficiency"]:
        out += ["No scale has AdamW runs at several token budgets: no L(D) fit, no data-efficiency multiplier.", ""]
    for e in ctx["efficiency"]:
        fit = e["fit"]
        if fit is None:
            out += [f"- {e['scale']}: too few AdamW token budgets for an L(D) fit ({len(e['adamw_budgets'])} < 3).", ""]
            continue
        out += [
            f"{e['scale']}: AdamW L(D) = {fit.E:.4f} + {fit.A:.4g}·D^(−{fit.alpha:.4f}) over "
            f"{len(e['adamw_budgets'])} budgets. Multiplier = D_AdamW(loss) / D_opt (> 1: fewer tokens than "
            "AdamW for the same loss); intervals in the headline's section 2.",
            "",
        ]
        body = [
            [opt_name(n), f"{d:,}", fmt(loss), "beyond AdamW's asymptote" if not math.isfinite(m) else f"{m:.3f}"]
            for n, d, loss, m in e["rows"]
        ]
        out += table(["optimizer", "tokens", "loss", "multiplier"], body) + [""]
    if "efficiency" in pngs:
        out += [f"![AdamW L(D) and the other optimizers' budgets]({pngs['efficiency']})", ""]
    return out


def summary_json(ctx: dict) -> dict:
    """The report's numbers, machine-readable (tests and later tooling compare against the logs)."""
    root = ctx["runs_dir"]
    rows = []
    for row in ctx["rows"]:
        groups = {}
        for name, g in row.groups.items():
            s = g.score
            groups[name] = {
                "best_lr": g.best.lr,
                "best_adamw_lr": g.best.point[1],
                "mean": _num(s.mean),
                "std": _num(s.std),
                "seeds": sorted(s.losses),
                "edge": g.edge,
                "status": g.status,
                "select_seed": g.select_seed,
                "sweep_id": g.sweep_id,
                "runs": [str(r.path.relative_to(root)) for r in s.runs],
                "by_point": [
                    {"lr": pt[0], "adamw_lr": pt[1], "mean": _num(c.mean), "n": len(c.runs)}
                    for pt, c in g.cells.items()
                ],
            }
        rows.append(
            {
                "name": row.name,
                "label": row.label,
                "scale": row.sweep_scale,
                "steps": row.steps,
                "tokens_per_step": row.tokens_per_step,
                "tokens": row.tokens,
                "non_embedding_params": row.n_params,
                "params": row.n_total,
                "flops_per_token": row.flops_per_token,
                "paper_scale": row.paper_scale,
                "family": row.family,
                "groups": groups,
            }
        )
    fits = {
        f"{fam}/{name}": (None if f is None else {"E": f.E, "A": f.A, "alpha": f.alpha, "rmse": f.rmse})
        for (fam, name), f in ctx["fits"].items()
    }
    comps = {
        f"{r}|{a}|{b}": (
            None
            if c is None
            else {
                "diff": c.diff,
                "ci": list(c.ci),
                "ci_method": c.ci_method,
                "p": c.p,
                "t": c.t,
                "df": c.df,
                "paired": c.paired,
                "n": c.n,
            }
        )
        for (r, a, b), c in ctx["comparisons"].items()
    }
    return {
        "n_runs": len(ctx["runs"]),
        "n_finished": sum(r.finished for r in ctx["runs"]),
        "selection": "search seed" if ctx["plan"] and ctx["plan"].get("lr_search") else "same seeds",
        "rows": rows,
        "fits": fits,
        "comparisons": comps,
        "headline": sections.headline_json(ctx),
        "protocols": protocols.summary(ctx["protocols"]),
        "figures": ctx["figures"],
        "pending": {p.sweep_id: p.status for p in ctx["pending"]},
        "unfinished": {str(r.path.relative_to(root)): r.problem for r in ctx["runs"] if not r.finished},
    }
