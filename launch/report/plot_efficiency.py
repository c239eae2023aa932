"""AdamW's L(D) with its band and the other optimizers' budgets: the data-efficiency picture."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from launch.report.markdown_util import opt_name
from launch.report.plot_kit import LOSS, color, figure, log_axis, save
from launch.report.series import usable
from launch.report.stats import t_interval


def plot_efficiency(ctx: dict, path: Path) -> bool:
    """AdamW's final loss at each budget with its L(D) fit and 95% band, and the other optimizers'
    points: how far right AdamW would have to go to match them is the speedup."""
    entries = [e for e in ctx["headline"]["speedup"] if "fit" in e]
    if not entries:
        return False
    fig, axes = figure(len(entries), w=6.0, h=4.4, cols=2)
    src = []
    for ax, e in zip(axes, entries, strict=False):
        f = e["fit"]
        rows = [r for r in ctx["rows"] if r.label == e["label"]]
        d_all = [r.tokens for r in rows]
        reach = [x["adamw_tokens"] for x in e["rows"] if math.isfinite(x["adamw_tokens"])]
        xs = np.geomspace(min(d_all) / 1.3, max(d_all + reach) * 1.3, 80)
        E, A, beta = e["draws"]
        band = E[:, None] + A[:, None] * xs[None, :] ** -beta[:, None]
        ax.plot(xs, f(xs), "-", color=color("adamw"), label=f"AdamW L(D) = {f.E:.3f} + {f.A:.3g}·D^−{f.alpha:.3f}")
        ax.fill_between(
            xs,
            *np.percentile(band, [2.5, 97.5], axis=0),
            color=color("adamw"),
            alpha=0.15,
            lw=0,
            label="95% band of the fit",
        )
        for r in rows:
            for name, g in sorted(r.groups.items()):
                if not usable(g):
                    continue
                ti = t_interval(list(g.score.losses.values()))
                m = g.score.mean
                err = [[m - ti[1]], [ti[2] - m]] if ti else None
                ax.errorbar([r.tokens], [m], yerr=err, fmt="o", capsize=3, color=color(name))
                src.append({"scale": e["scale"], "optim": name, "tokens": r.tokens, "mean": m})
        for x in e["rows"]:
            if math.isfinite(x["adamw_tokens"]):
                ax.annotate(
                    "",
                    xy=(x["adamw_tokens"], x["loss"]),
                    xytext=(x["tokens"], x["loss"]),
                    arrowprops={"arrowstyle": "->", "color": color(x["optim"]), "lw": 0.8},
                )
                ax.text(
                    x["tokens"], x["loss"], f" {x['speedup']:.2g}×", fontsize=7, color=color(x["optim"]), va="bottom"
                )
        for name in sorted({n for r in rows for n in r.groups}):
            ax.plot([], [], "o", color=color(name), label=f"{opt_name(name)} (95% t-interval)")
        ax.set_xscale("log")
        log_axis(ax.xaxis)
        ax.set_xlabel("training tokens D")
        ax.set_ylabel("final " + LOSS)
        ax.set_title(f"{e['scale']}: arrows go to the AdamW tokens for the same loss", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    ctx["figures"]["data_efficiency"] = src
    save(fig, path, "Data efficiency over AdamW")
    return True
