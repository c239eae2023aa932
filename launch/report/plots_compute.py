"""Compute and throughput figures: validation loss against training FLOPs over the scaling series,
and tokens/s per scale × optimizer (helpers and colours from launch/report/plot_kit.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from launch.report.markdown_util import human, opt_name
from launch.report.plot_kit import (
    COLORS,
    LOSS,
    MARKERS,
    clip_top,
    color,
    empty,
    eval_curve,
    figure,
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


def plot_throughput(ctx: dict, rows: list, path: Path) -> None:
    """Median tokens/s per (scale, optimizer) over its runs, whiskers min–max of the run medians;
    MFU only when logged (never on CPU)."""
    names = sorted({n for r in rows for n in r.groups}, key=lambda n: (n not in COLORS, n))
    table: list[dict] = []
    for row in rows:
        for name in names:
            g = row.groups.get(name)
            if g is None:
                continue
            med = [
                np.median(v)
                for r in (x for c in g.cells.values() for x in c.runs)
                if (v := [t["tokens_per_s"] for t in r.train if isinstance(t.get("tokens_per_s"), (int, float))])
            ]
            mfu = [
                np.median(v)
                for r in (x for c in g.cells.values() for x in c.runs)
                if (v := [t["mfu"] for t in r.train if isinstance(t.get("mfu"), (int, float))])
            ]
            if med:
                table.append(
                    {
                        "row": row.short,
                        "optim": name,
                        "runs": len(med),
                        "median": float(np.median(med)),
                        "min": float(min(med)),
                        "max": float(max(med)),
                        "mfu": float(np.median(mfu)) if mfu else None,
                    }
                )
    has_mfu = any(e["mfu"] is not None for e in table)
    fig, axes = figure(2 if has_mfu else 1, w=max(9.0, 0.5 * len(rows) * len(names) + 2), h=3.8, cols=1)
    labels = list(dict.fromkeys(e["row"] for e in table))
    width = 0.8 / max(len(names), 1)
    for j, name in enumerate(names):
        es = [e for e in table if e["optim"] == name]
        x = np.array([labels.index(e["row"]) for e in es]) + (j - (len(names) - 1) / 2) * width
        h = np.array([e["median"] for e in es])
        err = np.array([[e["median"] - e["min"], e["max"] - e["median"]] for e in es]).T.reshape(2, -1)
        axes[0].bar(x, h, width, yerr=err, capsize=2, color=color(name), label=opt_name(name))
        if has_mfu:
            axes[1].bar(x, [e["mfu"] or 0 for e in es], width, color=color(name))
    if table:
        for ax in axes:
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, fontsize=8)
            ax.set_xlabel("scale")
        axes[0].set_ylabel("training tokens/s (median per run)")
        axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        if has_mfu:
            axes[1].set_ylabel("MFU (median)")
    else:
        empty(axes[0], "no training lines with tokens/s")
    ctx["figures"]["throughput"] = table
    axes[0].set_title("bars: median over runs, whiskers: min–max", fontsize=8)
    save(fig, path, "Training throughput per scale: runs shared the machine, so not optimizer speed", right=1.9)
