"""Validation loss against tokens per row: mean over the scored seeds at the best LR, min–max band."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import ticker

from launch.report.markdown_util import fmt_point, human, opt_name
from launch.report.plot_kit import (
    LOSS,
    clip_top,
    color,
    empty,
    eval_curve,
    figure,
    save,
)


def plot_curves(ctx: dict, rows: list, path: Path) -> None:
    """Val loss against tokens per row, mean over the scored seeds at the best LR, min–max band."""
    drawable = [r for r in rows if any(g.score.runs and g.status == "done" for g in r.groups.values())]
    fig, axes = figure(len(drawable), w=5.4, h=4.0)
    src = []
    for ax, row in zip(axes, drawable, strict=False):
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: human(v)))
        ax.xaxis.set_major_locator(ticker.MaxNLocator(5))
        xs, ys = [], []
        for name, g in sorted(row.groups.items()):
            cur = eval_curve(g.score.runs) if g.status == "done" else None
            if cur is None:
                continue
            x, y = cur
            n = y.shape[0]
            mean = np.nanmean(y, 0) if np.isfinite(y).any() else y[0]
            ax.plot(
                x,
                mean,
                marker=".",
                color=color(name),
                label=f"{opt_name(name)}, LR {fmt_point(g.best.point)}, {n} seeds",
            )
            if n > 1:
                ax.fill_between(x, np.nanmin(y, 0), np.nanmax(y, 0), color=color(name), alpha=0.2, lw=0)
            xs.append(x)
            ys.append(y)
            src.append(
                {
                    "row": row.short,
                    "optim": name,
                    "lr": g.best.lr,
                    "adamw_lr": g.best.point[1],
                    "tokens": x.tolist(),
                    "mean": mean.tolist(),
                }
            )
        cut = clip_top(ax, ys, xs)
        title = f"{row.short}: L{row.n_layer} d{row.d_model}, {row.steps} steps × {row.tokens_per_step:,} tokens"
        ax.set_title(title + ("\n(y axis cut: the early losses are off the top)" if cut else ""), fontsize=9)
        ax.set_xlabel("training tokens")
        ax.set_ylabel(LOSS)
        ax.fill_between([], [], [], color="grey", alpha=0.2, label="band: min–max over seeds")
        ax.legend(fontsize=7, loc="upper right")
    if not drawable:
        empty(axes[0], "no group with final numbers yet")
    ctx["figures"]["val_loss_vs_tokens"] = src
    save(fig, path, "Validation loss during training at each optimizer's best LR")
