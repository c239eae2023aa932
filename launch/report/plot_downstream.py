"""Downstream accuracy against final validation loss, per task."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from launch.report.markdown_util import opt_name
from launch.report.plot_kit import LOSS, MARKERS, color, figure, save, shade
from launch.report.stats import t_interval


def plot_downstream(ctx: dict, path: Path) -> bool:
    """Per task: primary accuracy against final val loss, one point per scale × optimizer (bars:
    95% t-interval over seeds, or the Wilson interval of one seed), chance as a dashed line."""
    data = ctx.get("downstream") or {}
    if not data:
        return False
    tasks = sorted(data)
    fig, axes = figure(len(tasks), w=4.6, h=3.6)
    scales = list(dict.fromkeys(e["row"].short for items in data.values() for e in items))
    src = []
    for ax, task in zip(axes, tasks, strict=False):
        for e in data[task]:
            vals = list(e["values"].values())
            if not vals:
                continue
            ti = t_interval(vals)
            m = float(np.mean(vals))
            lo, hi = (ti[1], ti[2]) if ti else (e["ci_one"] or (m, m))
            k = scales.index(e["row"].short)
            ax.errorbar(
                [e["loss"]],
                [m],
                yerr=[[m - lo], [hi - m]],
                fmt=MARKERS[k % len(MARKERS)],
                color=shade(e["optim"], k, len(scales)),
                capsize=3,
            )
            src.append(
                {
                    "task": task,
                    "scale": e["row"].short,
                    "optim": e["optim"],
                    "loss": e["loss"],
                    "metric": e["metric"],
                    "mean": m,
                    "ci": [lo, hi],
                }
            )
        chance = next((e["chance"] for e in data[task] if isinstance(e.get("chance"), (int, float))), None)
        if chance is not None:
            ax.axhline(chance, ls="--", color="black", lw=0.8, label=f"chance {chance:.3f}")
        ax.invert_xaxis()  # better models to the right
        ax.set_xlabel("final " + LOSS + " (lower →)")
        ax.set_ylabel(f"{data[task][0]['metric']} (fraction correct)")
        ax.set_title(task, fontsize=10)
        for name in sorted({e["optim"] for e in data[task]}):
            ax.plot([], [], "o", color=color(name), label=opt_name(name))
        ax.legend(fontsize=7, loc="best")
    ctx["figures"]["accuracy_vs_val_loss"] = src
    save(fig, path, "Downstream accuracy against validation loss (markers: scales, lighter = smaller)")
    return True
