"""Validation loss against training FLOPs over the scaling series: the compute view of the curves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from launch.report.markdown_util import human, opt_name
from launch.report.plot_kit import (
    LOSS,
    MARKERS,
    clip_top,
    eval_curve,
    log_axis,
    save,
    shade,
)


def plot_flops(ctx: dict, series: list, path: Path) -> bool:
    """Val loss against training FLOPs over the scaling series: the compute view of the curves."""
    rows = [r for r in series if r.flops_per_token]
    if not rows:
        return False
    fig = Figure(figsize=(10, 5.2))
    ax = fig.add_subplot(1, 1, 1)
    src, xs, ys = [], [], []
    names = sorted({n for r in rows for n in r.groups})
    for k, row in enumerate(rows):
        for name in names:
            g = row.groups.get(name)
            cur = eval_curve(g.score.runs) if g is not None and g.status == "done" else None
            if cur is None:
                continue
            x, y = cur
            f = x * row.flops_per_token
            mean = np.nanmean(y, 0)
            ax.plot(
                f,
                mean,
                color=shade(name, k, len(rows)),
                marker=MARKERS[k % len(MARKERS)],
                ms=3,
                lw=1.2,
                label=f"{opt_name(name)} {row.short} (N={human(row.n_params or 0)})",
            )
            xs.append(f)
            ys.append(y)
            src.append({"row": row.short, "optim": name, "flops": f.tolist(), "mean": mean.tolist()})
    if not src:
        return False
    ax.set_xscale("log")
    log_axis(ax.xaxis)
    cut = clip_top(ax, ys, xs)
    ax.set_xlabel("training FLOPs (tokens × (6·params + 12·L·d·T))")
    ax.set_ylabel(LOSS + (" (early losses off the top)" if cut else ""))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ctx["figures"]["val_loss_vs_flops"] = src
    save(fig, path, "Validation loss against training compute, per scale (mean over scored seeds)", right=3.0)
    return True
