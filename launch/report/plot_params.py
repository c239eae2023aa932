"""Final loss against non-embedding parameters N with the L(N) fits and their bands, and the gap to AdamW."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from launch.report.analysis import ordered_rows, seed_interval
from launch.report.markdown_util import opt_name
from launch.report.plot_kit import (
    LOSS,
    color,
    empty,
    figure,
    n_axis,
    plain_log_y,
    save,
)
from launch.report.series import usable


def plot_params(ctx: dict, path: Path) -> None:
    """(a) final loss against N with the L(N) fits and their 95% bands; (b) the gap to AdamW."""

    sc = ctx["headline"]["scaling"]
    fig, axes = figure(2, w=5.6, h=4.2, cols=2)
    ax, ax_gap = axes
    series = [r for r in ordered_rows(ctx["rows"]) if r.short in sc["series"]]
    src: dict[str, Any] = {"points": [], "fits": {}, "gaps": []}
    drawn = False
    names = sorted({n for r in series for n in r.groups})
    all_n: list[float] = []
    for j, name in enumerate(names):
        dodge = 1.03 ** (j - (len(names) - 1) / 2)  # side by side at each N, not on top of each other
        pts = [
            (r.n_params, seed_interval(r.groups[name]), r.groups[name].score.mean)
            for r in series
            if r.n_params and usable(r.groups.get(name))
        ]
        if not pts:
            continue
        n = np.array([p[0] for p in pts], float)
        all_n += n.tolist()
        m = np.array([p[2] for p in pts])
        err = np.array([[m[i] - p[1][1], p[1][2] - m[i]] if p[1] else [0.0, 0.0] for i, p in enumerate(pts)]).T
        e = sc["fits"].get(name, {})
        label = opt_name(name)
        if "fit" in e:
            f = e["fit"]
            label += f": E={f.E:.3f}, α={f.alpha:.2f}"
            xs = np.geomspace(n.min() / 1.3, n.max() * 1.3, 60)
            E, A, al = e["draws"]
            band = E[:, None] + A[:, None] * xs[None, :] ** -al[:, None]
            ax.plot(xs, f(xs), "-", color=color(name), alpha=0.8)
            ax.fill_between(xs, *np.percentile(band, [2.5, 97.5], axis=0), color=color(name), alpha=0.15, lw=0)
            src["fits"][name] = {"E": f.E, "A": f.A, "alpha": f.alpha}
        ax.errorbar(n * dodge, m, yerr=err, fmt="o", capsize=3, color=color(name), label=label)
        src["points"] += [{"optim": name, "N": float(a), "mean": float(b)} for a, b in zip(n, m, strict=True)]
        drawn = True
    if drawn:
        ax.set_yscale("log")
        plain_log_y(ax)
        n_axis(ax, all_n)
        ax.set_xlabel("non-embedding parameters N")
        ax.set_ylabel("final " + LOSS)
        ax.set_title("Final loss at the best LR; lines: L(N) fits, shading: their 95% band", fontsize=9)
        ax.errorbar([], [], yerr=[], fmt="o", color="grey", label="bars: 95% t-interval over seeds")
        ax.legend(fontsize=7, loc="upper right")
    else:
        empty(ax, "no scale with final numbers yet")
    gaps = sc["gaps"]
    for j, ((a, b), gp) in enumerate(gaps.items()):
        if b != "adamw":
            continue
        lo = [d - c[0] for d, c in zip(gp["diff"], gp["ci"], strict=True)]
        hi = [c[1] - d for d, c in zip(gp["diff"], gp["ci"], strict=True)]
        ax_gap.errorbar(
            np.array(gp["N"]) * 1.03 ** (j - 0.5),
            gp["diff"],
            yerr=[lo, hi],
            fmt="o-",
            capsize=3,
            color=color(a),
            label=f"{opt_name(a)} − AdamW",
        )
        src["gaps"].append({"optim": a, "ref": b, "N": gp["N"], "diff": gp["diff"], "ci": gp["ci"]})
    if src["gaps"]:
        ax_gap.axhline(0, color="black", lw=0.8)
        n_axis(ax_gap, [n for g in src["gaps"] for n in g["N"]])
        ax_gap.set_xlabel("non-embedding parameters N")
        ax_gap.set_ylabel("Δ final val loss vs AdamW (nats/token)")
        ax_gap.set_title("Gap to AdamW per scale (95% t-interval, paired seeds)", fontsize=9)
        ax_gap.legend(fontsize=7, loc="best")
    else:
        fig.delaxes(ax_gap)
    ctx["figures"]["loss_vs_params"] = src
    save(fig, path, "Scaling with model size")
