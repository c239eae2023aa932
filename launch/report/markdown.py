"""report.md and summary.json for launch.report (the numbers come from launch/report.py)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

OPT_NAMES = {
    "adamw": "AdamW",
    "muon_moonlight": "Muon+Moonlight",
    "orscale_lm": "OrScale-LM",
    "muon": "Muon",
    "orscale": "OrScale",
    "cbp": "CBP",
    "lamb": "LAMB",
    "lars": "LARS",
}


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def _num(x: Any) -> Any:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def render(ctx: dict, pngs: dict[str, str], fmt: Callable, fmt_lr: Callable, provenance: Callable) -> str:
    rows, runs, root = ctx["rows"], ctx["runs"], ctx["runs_dir"]
    n_fin = sum(r.finished for r in runs)
    out = [
        f"# Sweep report: `{root}`",
        "",
        f"{len(runs)} run directories: {n_fin} finished, {len(runs) - n_fin} unfinished (listed at the end, "
        "never as numbers). Losses are the final validation cross-entropy (nats/token) of each run's last "
        "evaluation at `train.max_steps`. A row is one setting (model, steps × tokens per step, context and every "
        "other option but optimizer, LR and seed); **best LR** = lowest mean final loss over seeds; a diverged "
        "seed (null/NaN) disqualifies its LR. Provenance: each run directory, `@commit` from its run.log and "
        "`cfg:` = first 8 hex digits of `sha256sum config.yaml`.",
        "",
    ]

    # ---- the paper's table
    out += ["## Final validation loss at the best learning rate", ""]
    body = []
    for row in rows:
        ref = row.groups.get("adamw")
        for name, g in sorted(row.groups.items()):
            b = g.best
            paper = ctx["paper"].get(row.paper_scale or "", {}).get(name)
            gap = b.mean - ref.best.mean if ref is not None and name != "adamw" else None
            tokens = sorted({r.final_tokens for r in b.runs})
            vtok = sorted({r.val_tokens for r in b.runs}, key=str)
            body.append(
                [
                    row.label,
                    f"{row.steps} × {row.tokens_per_step:,}",
                    OPT_NAMES.get(name, name),
                    fmt_lr(b.lr),
                    f"{fmt(b.mean)} ± {fmt(b.std)}" if len(b.runs) > 1 else fmt(b.mean),
                    str(len(b.runs)),
                    ", ".join(f"{t:,}" for t in tokens),
                    ", ".join(f"{t:,}" if t else "?" for t in vtok),
                    fmt(gap, sign=True) if gap is not None else "—",
                    f"{paper:.4f} (paper, {row.paper_scale})" if paper is not None else "—",
                    provenance(b.runs, root),
                ]
            )
    out += (
        _table(
            [
                "scale",
                "steps × tokens/step",
                "optimizer",
                "best LR",
                "val loss (mean ± std)",
                "seeds",
                "tokens seen",
                "val tokens",
                "Δ vs AdamW",
                "paper's number (SPEC §4, not ours)",
                "runs (commit, config)",
            ],
            body,
        )
        if body
        else ["No finished runs."]
    )
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
        "in any statistic here.",
        "",
    ]

    # ---- significance
    out += [
        "## Significance",
        "",
        f"Δ = (optimizer − reference) mean final loss, each at its best LR; negative favours the optimizer. "
        f"95% percentile bootstrap interval ({ctx['resamples']:,} resamples, RNG seed 0), resampling seed pairs "
        "when both have the same seeds (else each group on its own); t-test paired by seed (else Welch).",
        "",
    ]
    body = []
    for (row_name, name, ref), c in ctx["comparisons"].items():
        label = f"{OPT_NAMES.get(name, name)} vs {OPT_NAMES.get(ref, ref)}"
        if c is None:
            body.append([row_name, label, "—", "—", "1 seed — no test", "—"])
            continue
        p = "undefined (zero variance)" if c.p is None else f"{c.p:.3g}"
        test = (
            f"paired t (n={c.n}, t={c.t:.3g})"
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
            ]
        )
    out += _table(["row", "comparison", "Δ", "95% CI", "test", "p"], body) if body else ["No comparisons."]
    out += [""]

    # ---- LR sensitivity
    out += ["## Learning-rate sensitivity", "", "Mean final val loss over seeds (seed count); **bold** = best.", ""]
    for row in rows:
        lrs = sorted({lr for g in row.groups.values() for lr in g.cells})
        body = []
        for name, g in sorted(row.groups.items()):
            cells = [
                ("**" if lr == g.best.lr else "")
                + f"{fmt(g.cells[lr].mean)} ({len(g.cells[lr].runs)})"
                + ("**" if lr == g.best.lr else "")
                if lr in g.cells
                else "—"
                for lr in lrs
            ]
            note = (
                "one LR only"
                if len(g.cells) == 1
                else f"best LR at the {g.edge} edge of the grid — extend it"
                if g.edge
                else "interior optimum"
            )
            body.append([OPT_NAMES.get(name, name), *cells, note])
        out += [f"### {row.name}", ""] + _table(["optimizer", *[f"lr {fmt_lr(lr)}" for lr in lrs], "note"], body) + [""]
    out += [f"![loss vs LR]({pngs['lr']})", ""]

    # ---- scaling
    out += [
        "## Scaling",
        "",
        "L(N) = E + A·N^(−α) per optimizer over the scales of a row family (N = non-embedding "
        "parameters; each scale's largest token budget, best LR). Fit: grid over α in [0.005, 3], least squares "
        "for E ≥ 0 and A ≥ 0.",
        "",
    ]
    body = []
    for (family, name), pts in sorted(ctx["points"].items()):
        fit = ctx["fits"].get((family, name))
        where = ", ".join(f"{n:.3g}" for n, _, _ in pts)
        if fit is None:
            body.append(
                [
                    family,
                    OPT_NAMES.get(name, name),
                    str(len(pts)),
                    where,
                    f"too few scales for a fit ({len({n for n, _, _ in pts})} < 3)",
                    "—",
                    "—",
                    "—",
                ]
            )
        else:
            body.append(
                [
                    family,
                    OPT_NAMES.get(name, name),
                    str(len(pts)),
                    where,
                    f"{fit.E:.4f}",
                    f"{fit.A:.4g}",
                    f"{fit.alpha:.4f}" + (" (edge of the α range: unreliable)" if fit.at_edge else ""),
                    f"{fit.rmse:.2g}",
                ]
            )
    out += (
        _table(["family (settings hash)", "optimizer", "scales", "N", "E", "A", "α", "rmse"], body)
        if body
        else ["No points."]
    )
    out += ["", f"![final loss vs parameters]({pngs['params']})", "", "### Data efficiency against AdamW", ""]
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
            "AdamW for the same loss).",
            "",
        ]
        out += _table(
            ["optimizer", "tokens", "loss", "multiplier"],
            [
                [
                    OPT_NAMES.get(n, n),
                    f"{d:,}",
                    fmt(loss),
                    "beyond AdamW's asymptote" if not math.isfinite(m) else f"{m:.3f}",
                ]
                for n, d, loss, m in e["rows"]
            ],
        ) + [""]

    # ---- curves, diagnostics, throughput
    out += [
        "## Curves",
        "",
        f"![val loss vs tokens]({pngs['curves']})",
        "",
        f"![trust ratio and clip fraction]({pngs['diag']})",
        "",
        "## Throughput",
        "",
    ]
    body = []
    for row in rows:
        for name, g in sorted(row.groups.items()):
            rr = [r for c in g.cells.values() for r in c.runs]
            tps = [x["tokens_per_s"] for r in rr for x in r.train if _num(x.get("tokens_per_s"))]
            mfu = [x["mfu"] for r in rr for x in r.train if _num(x.get("mfu"))]
            mem = [x["peak_mem_gib"] for r in rr for x in r.train if _num(x.get("peak_mem_gib"))]
            wait = [x["data_wait_frac"] for r in rr for x in r.train if _num(x.get("data_wait_frac"))]
            body.append(
                [
                    row.name,
                    OPT_NAMES.get(name, name),
                    str(len(rr)),
                    f"{np.median(tps):,.0f}" if tps else "—",
                    f"{np.median(mfu):.3f}" if mfu else "n/a",
                    f"{max(mem):.2f}" if mem else "n/a",
                    f"{np.median(wait):.3f}" if wait else "n/a",
                ]
            )
    out += (
        _table(["row", "optimizer", "runs", "median tokens/s", "median MFU", "peak mem GiB", "data wait"], body)
        if body
        else []
    )
    out += [
        "",
        "Medians over ~64 evenly spaced logged steps per run, all LRs and seeds of the row; MFU and "
        "memory are n/a where the logs do not carry them (MFU is null on CPU).",
    ]
    out += ["", f"![tokens/s and MFU per run]({pngs['throughput']})", ""]

    # ---- unfinished
    bad = [r for r in runs if not r.finished or r.bad_lines]
    out += ["## Unfinished runs", ""]
    if not bad:
        out += ["None.", ""]
    else:
        out += _table(
            ["run directory", "optimizer", "LR", "seed", "state"],
            [
                [
                    f"`{r.path.relative_to(root)}`",
                    str(r.cfg("optim.name", "?")),
                    str(r.cfg("optim.lr", "?")),
                    str(r.cfg("train.seed", "?")),
                    (r.problem or "finished") + (f"; {r.bad_lines} unreadable line(s)" if r.bad_lines else ""),
                ]
                for r in bad
            ],
        ) + [""]
    return "\n".join(out)


def summary_json(ctx: dict) -> dict:
    """The report's numbers, machine-readable (tests and later tooling compare against the logs)."""
    root = ctx["runs_dir"]
    rows = []
    for row in ctx["rows"]:
        groups = {}
        for name, g in row.groups.items():
            groups[name] = {
                "best_lr": g.best.lr,
                "mean": _num(g.best.mean),
                "std": _num(g.best.std),
                "seeds": sorted(g.best.losses),
                "edge": g.edge,
                "runs": [str(r.path.relative_to(root)) for r in g.best.runs],
                "by_lr": {str(lr): {"mean": _num(c.mean), "n": len(c.runs)} for lr, c in g.cells.items()},
            }
        rows.append(
            {
                "name": row.name,
                "label": row.label,
                "steps": row.steps,
                "tokens_per_step": row.tokens_per_step,
                "non_embedding_params": row.n_params,
                "params": row.n_total,
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
            None if c is None else {"diff": c.diff, "ci": list(c.ci), "p": c.p, "t": c.t, "paired": c.paired, "n": c.n}
        )
        for (r, a, b), c in ctx["comparisons"].items()
    }
    return {
        "n_runs": len(ctx["runs"]),
        "n_finished": sum(r.finished for r in ctx["runs"]),
        "rows": rows,
        "fits": fits,
        "comparisons": comps,
        "unfinished": {str(r.path.relative_to(root)): r.problem for r in ctx["runs"] if not r.finished},
    }
