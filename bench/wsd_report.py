"""The comparison of bench/wsd_budgets.py: cosine runs per budget against wsd cooldown branches.

    python -m bench.wsd_budgets report [--runs runs/wsd_budgets] [--ladder runs/cpu_ladder] [--out DIR]

Writes report.md, summary.json and val_loss_vs_tokens.png to --out. Every statistic is the report
package's (report.stats.compare, report.analysis.adamw_curve): WSD - cosine per optimizer and budget
paired by seed; each protocol's comparison of the optimizers (paired by seed, Holm over each
protocol's tests); and each protocol's data-efficiency multiplier over AdamW from its own L(D).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  # after the backend is chosen
import pandas as pd  # noqa: E402

from bench.wsd_budgets import BUDGETS, FRACTIONS, LADDER_BUDGETS, SEEDS, TUNED, WSD_TOTAL, _tag, wsd_dir  # noqa: E402
from records.read import read_run, strict_json  # noqa: E402
from report.analysis import adamw_curve  # noqa: E402
from report.stats import compare, holm  # noqa: E402

TOKENS_PER_STEP = 1024
NAMES = {"adamw": "AdamW", "muon_moonlight": "Muon+Moonlight", "orscale_lm": "OrScale-LM"}
PAIRS = [("orscale_lm", "muon_moonlight"), ("muon_moonlight", "adamw"), ("orscale_lm", "adamw")]
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


def _seconds(run_dir: Path) -> float:
    """Wall seconds of the run's launches (run.log: each launch's first line to its "done" line)."""
    total, start = 0.0, None
    for line in (run_dir / "run.log").read_text().splitlines():
        found = _STAMP.match(line)
        if not found:
            continue
        when = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S")
        if " run dir " in line:
            start = when
        elif (" done at step " in line or "stopped by a signal" in line) and start is not None:
            total, start = total + (when - start).total_seconds(), None
    return total


def protocol_name(fraction: float) -> str:
    return f"wsd {fraction:.0%}"


def collect(runs: Path, ladder: Path) -> pd.DataFrame:
    """One row per (protocol, optimizer, budget, seed): the final validation loss, the steps this run
    trained itself, its wall seconds, its validation curve."""
    rows = []
    for optim in TUNED:
        for seed in SEEDS:
            tag = _tag(optim, seed)
            for budget in BUDGETS:
                cosine = (
                    ladder / LADDER_BUDGETS[budget] / tag
                    if budget in LADDER_BUDGETS
                    else runs / f"cosine-{budget}" / tag
                )
                dirs = [("cosine", cosine)]
                for fraction in FRACTIONS:
                    parent = runs / wsd_dir(fraction) / tag
                    if (runs / wsd_dir(fraction)).is_dir():  # this cooldown share was run
                        branch = parent.with_name(parent.name + "-branches") / f"budget_{budget}"
                        dirs.append((protocol_name(fraction), parent if budget == WSD_TOTAL else branch))
                for protocol, run_dir in dirs:
                    root = ladder if run_dir.is_relative_to(ladder) else runs
                    run = read_run(run_dir, expected_steps=budget)
                    if run.problem is not None:
                        raise SystemExit(
                            f"error: {run_dir}: {run.problem}; run `python -m bench.wsd_budgets run` first"
                        )
                    start = run.cfg("run.init_from")  # a branch trains from its parent's checkpoint on
                    first = int(Path(start).name.split("_")[1]) if start else 0
                    rows.append(
                        dict(protocol=protocol, optim=optim, budget=budget, seed=seed, val=run.final_val)
                        | dict(steps=budget - first, seconds=_seconds(run_dir), run=str(run_dir.relative_to(root)))
                        | dict(curve=[(e["tokens"], e["val_loss"]) for e in run.evals if "val_loss" in e])
                    )
    return pd.DataFrame(rows)


def analyse(df: pd.DataFrame) -> dict[str, Any]:
    by = {k: dict(zip(g.seed, g.val, strict=True)) for k, g in df.groupby(["protocol", "optim", "budget"])}
    protocols = list(dict.fromkeys(df.protocol))  # cosine, then each cooldown share run
    gaps = []  # wsd - cosine, per cooldown share, optimizer and budget
    for wsd in protocols[1:]:
        for optim in TUNED:
            for budget in BUDGETS:
                c = compare(by[(wsd, optim, budget)], by[("cosine", optim, budget)])
                gaps.append(dict(protocol=wsd, optim=optim, budget=budget, comparison=c))
    answers: dict[str, Any] = {}
    for protocol in protocols:
        tests = [
            dict(budget=b, a=a, b_=o, comparison=compare(by[(protocol, a, b)], by[(protocol, o, b)]))
            for b in BUDGETS
            for a, o in PAIRS
        ]
        for t, p in zip(tests, holm([t["comparison"].p for t in tests]), strict=True):
            t["p_holm"] = p
        D = [float(b * TOKENS_PER_STEP) for b in BUDGETS]
        curve = adamw_curve(D, [list(by[(protocol, "adamw", b)].values()) for b in BUDGETS])
        gains = []
        if not isinstance(curve, str):
            for k, b in enumerate(BUDGETS):
                for optim in ("muon_moonlight", "orscale_lm"):
                    gain = curve.speedup(list(by[(protocol, optim, b)].values()), b * TOKENS_PER_STEP, seed=1 + k)
                    gains.append(dict(optim=optim, budget=b, **gain))
        answers[protocol] = dict(tests=tests, curve=curve, gains=gains)
    cost = df.groupby("protocol").agg(runs=("run", "nunique"), steps=("steps", "sum"), seconds=("seconds", "sum"))
    # A branch directory counts as one run per budget; its parent (the 768 budget) is the one full run.
    return dict(gaps=gaps, answers=answers, cost=cost)


def _ci(c: Any) -> str:
    return f"{c.diff:+.4f} [{c.ci[0]:+.4f}, {c.ci[1]:+.4f}]"


def markdown(df: pd.DataFrame, res: dict[str, Any]) -> str:
    mean = df.groupby(["protocol", "optim", "budget"]).val.agg(["mean", "std"])
    protocols = list(res["answers"])
    out = ["# Budgets from one run: WSD cooldown branches against separate cosine runs", ""]
    out += [
        "s2 of the CPU ladder (0.33M non-embedding parameters, 1,024 tokens a step), each optimizer at its",
        "tuned point (docs/results/cpu_ladder, tuned under cosine), seeds 1-3, five budgets:",
        "`python -m bench.wsd_budgets run [--decay-fraction 0.5]`, then `python -m bench.wsd_budgets report`.",
        "**cosine**: one run per budget, warmup 10% of it (96 / 192 / 384 steps: the ladder's own runs).",
        "**wsd 20%** / **wsd 50%**: one 768-step run per optimizer and seed (warmup 19 steps, the peak, a",
        "1-sqrt cooldown over the last 20% / 50% to 0.1x, the floor cosine ends at); each shorter budget a",
        "cooldown branch from its checkpoint at that budget's cooldown start (`python -m launch.branch`).",
        "",
        "## Final validation loss (mean ± sd over 3 seeds) and WSD − cosine (paired by seed, 95% t interval)",
        "",
        "| optimizer | budget (steps) | "
        + " | ".join(protocols)
        + " | "
        + " | ".join(f"{p} − cosine" for p in protocols[1:])
        + " |",
        "|---" * (2 + 2 * len(protocols) - 1) + "|",
    ]
    gap = {(g["protocol"], g["optim"], g["budget"]): g["comparison"] for g in res["gaps"]}
    for o in TUNED:
        for b in BUDGETS:
            cells = [f"{mean.loc[(p, o, b), 'mean']:.4f} ± {mean.loc[(p, o, b), 'std']:.4f}" for p in protocols]
            diffs = [_ci(gap[(p, o, b)]) for p in protocols[1:]]
            out.append(
                f"| {NAMES[o]} | {b}{' (wsd: the parent)' if b == WSD_TOTAL else ''} | "
                + " | ".join(cells + diffs)
                + " |"
            )
    cost = res["cost"]
    out += ["", "## What each protocol cost", ""]
    out += ["| protocol | runs (a branch counts as one) | steps trained | wall seconds (1 thread each, 2 at a time) |"]
    out += ["|---|---|---|---|"]
    for protocol, r in cost.iterrows():
        out.append(f"| {protocol} | {int(r.runs)} | {int(r.steps):,} | {r.seconds:,.0f} |")
    out += ["", "## The comparison's answer under each protocol", ""]
    for protocol, ans in res["answers"].items():
        out += [f"### {protocol}", "", "| budget | comparison | Δ loss [95% CI] | p (Holm) |", "|---|---|---|---|"]
        for t in ans["tests"]:
            c, p = t["comparison"], t["p_holm"]
            out.append(f"| {t['budget']} | {NAMES[t['a']]} − {NAMES[t['b_']]} | {_ci(c)} | {p:.3f} |")
        curve = ans["curve"]
        if isinstance(curve, str):
            out += ["", f"No data-efficiency multiplier: {curve}.", ""]
            continue
        out += [
            "",
            "Data efficiency over AdamW (the tokens AdamW needs for the same loss, over the budget; AdamW's "
            f"L(D) = {curve.fit.E:.3f} + {curve.fit.A:.3g}·D^−{curve.fit.alpha:.3f}):",
            "",
            "| budget | optimizer | multiplier [95% CI] |",
            "|---|---|---|",
        ]
        for g in ans["gains"]:
            flag = " (extrapolated)" if g["extrapolated"] else ""
            out.append(
                f"| {g['budget']} | {NAMES[g['optim']]} | {g['speedup']:.2f}× "
                f"[{g['ci'][0]:.2f}, {g['ci'][1]:.2f}]{flag} |"
            )
        out.append("")
    return "\n".join(out) + "\n"


def figure(df: pd.DataFrame, path: Path) -> None:
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4), sharey=True)
    styles = ["-o", "--s", ":^"]
    for ax, optim in zip(axes, TUNED, strict=True):
        for protocol, style in zip(dict.fromkeys(df.protocol), styles, strict=False):
            sub = df[(df.optim == optim) & (df.protocol == protocol)].groupby("budget").val.mean()
            ax.plot(sub.index * TOKENS_PER_STEP, sub.values, style, label=f"{protocol}: final loss, mean of 3 seeds")
        parent = df[(df.optim == optim) & (df.protocol == "wsd 20%") & (df.budget == WSD_TOTAL) & (df.seed == SEEDS[0])]
        tokens, vals = zip(*parent.curve.iloc[0], strict=True)
        ax.plot(
            tokens,
            vals,
            color="grey",
            alpha=0.5,
            lw=1,
            label=f"the wsd 20% parent's validation curve (seed {SEEDS[0]})",
        )
        ax.set_xscale("log")
        ticks = [b * TOKENS_PER_STEP for b in BUDGETS]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticklabels([f"{t / 1000:.0f}k" for t in ticks])
        ax.set_title(NAMES[optim])
        ax.set_xlabel("training tokens (budgets: 48-768 steps)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation loss")
    axes[0].legend(fontsize=7.5)
    fig.suptitle("CPU ladder s2: one cosine run per budget vs cooldown branches of one wsd run")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(runs: Path, ladder: Path, out: Path) -> None:
    df = collect(runs, ladder)
    res = analyse(df)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(markdown(df, res))
    figure(df, out / "val_loss_vs_tokens.png")
    summary = {
        "runs": df.drop(columns=["curve"]).to_dict("records"),
        "gaps": [{**vars(g["comparison"]), **{k: g[k] for k in ("protocol", "optim", "budget")}} for g in res["gaps"]],
        "cost": res["cost"].reset_index().to_dict("records"),
        "answers": {
            p: dict(
                tests=[
                    {**vars(t["comparison"]), "budget": t["budget"], "a": t["a"], "b": t["b_"], "p_holm": t["p_holm"]}
                    for t in a["tests"]
                ],
                gains=a["gains"],
            )
            for p, a in res["answers"].items()
        },
    }
    (out / "summary.json").write_text(json.dumps(strict_json(summary), indent=1, default=float, allow_nan=False) + "\n")
    print(f"wrote {out / 'report.md'}, summary.json, val_loss_vs_tokens.png")
