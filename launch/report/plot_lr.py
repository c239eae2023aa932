"""Loss against the peak LR per width (and the best LR against width), and the loss over both LRs
(the matrices' and the AdamW group's) at one scale."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import ticker

from launch.report.markdown_util import fmt_point, opt_name
from launch.report.plot_kit import (
    COLORS,
    LOSS,
    MARKERS,
    color,
    empty,
    figure,
    log_axis,
    save,
    shade,
)


def plot_lr(ctx: dict, path: Path) -> None:
    """One panel per optimizer: final loss against LR, one curve per width; then best LR vs width."""
    t = ctx["headline"]["transfer"]
    names = sorted(t["points"], key=lambda n: (n not in COLORS, list(COLORS).index(n) if n in COLORS else 0, n))
    # The best-LR-against-width panel only once some optimizer has two widths (else one dot per colour).
    transfer = any(len({p["d_model"] for p in t["points"][n]}) >= 2 for n in names)
    fig, axes = figure(len(names) + int(transfer), w=5.4, h=4.2, cols=2)
    src = []
    for ax, name in zip(axes, names, strict=False):
        pts = sorted(t["points"][name], key=lambda p: p["d_model"])
        for k, p in enumerate(pts):
            c = shade(name, k, len(pts))
            ax.plot(
                p["lrs"],
                p["losses"],
                marker=MARKERS[k % len(MARKERS)],
                color=c,
                ms=4,
                label=f"d={p['d_model']} ({p['scale']})",
            )
            i = p["lrs"].index(p["best_lr"])
            ax.plot([p["best_lr"]], [p["losses"][i]], "*", ms=13, color=c, mec="black", mew=0.6)
            src.append({"optim": name, **{k2: p[k2] for k2 in ("scale", "d_model", "lrs", "losses", "best_lr")}})
        ax.plot([], [], "*", ms=11, color="white", mec="black", label="★ best LR")
        ax.set_xscale("log")
        log_axis(ax.xaxis)
        ax.set_xlabel("peak LR")
        ax.set_ylabel("final " + LOSS + f" ({pts[0]['selection']})" if pts else LOSS)
        cut = _fit_finite_ylim(ax, [p["losses"] for p in pts])
        ax.set_title(
            opt_name(name) + (" (axis cut: the worst LRs are off the top)" if cut else ""),
            fontsize=9,
            color=color(name),
        )
        ax.legend(fontsize=7, loc="best")
    if transfer:
        ax = axes[len(names)]
        for name in names:
            pts = sorted(t["points"][name], key=lambda p: p["d_model"])
            d = np.array([p["d_model"] for p in pts], float)
            lr = np.array([p["vertex_lr"] or p["best_lr"] for p in pts])
            s = t["fits"][name]["slope"]
            lab = opt_name(name) + ("" if s is None else f": slope {s.slope:+.2f}")
            edge = np.array([bool(p["edge"]) for p in pts])
            ax.plot(d[~edge], lr[~edge], "o", color=color(name), label=lab)
            if edge.any():  # a grid-edge optimum is a bound, not an estimate: drawn open
                ax.plot(
                    d[edge], lr[edge], "o", mfc="none", color=color(name), label=f"{opt_name(name)}: at a grid edge"
                )
            if s is not None:
                ax.plot(d, 2 ** (s.intercept + s.slope * np.log2(d)), "-", color=color(name), alpha=0.7)
        ax.set_xscale("log", base=2)
        best = {p["vertex_lr"] or p["best_lr"] for pts in t["points"].values() for p in pts}
        if len(best) == 1:  # every optimum at one LR: give the axis an octave each way, not a zero span
            ax.set_ylim(min(best) / 2, min(best) * 2)
        ax.set_yscale("log")
        widths = sorted({p["d_model"] for pts in t["points"].values() for p in pts})
        ax.xaxis.set_major_locator(ticker.FixedLocator(widths))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_locator(ticker.NullLocator())
        log_axis(ax.yaxis)
        ax.set_xlabel("width d_model")
        ax.set_ylabel("best peak LR (parabola optimum, else grid best)")
        ax.set_title("LR transfer: best LR against width", fontsize=10)
        ax.legend(fontsize=7, loc="best")
    if not names:
        empty(axes[0], "no finished LR search yet")
    ctx["figures"]["loss_vs_lr"] = src
    save(fig, path, "Final validation loss against peak LR, per width")


def _fit_finite_ylim(ax: Any, curves: list[list[float]]) -> bool:
    """Keep the axis on the finite losses near the optima (a diverged or far-off LR would squash the
    rest): up to the 90th percentile. True when some point is off the top."""
    vals = np.array([v for c in curves for v in c if isinstance(v, (int, float)) and math.isfinite(v)])
    if not vals.size:
        return False
    lo, hi = float(vals.min()), float(np.percentile(vals, 90))
    pad = 0.08 * (hi - lo or 0.1)
    ax.set_ylim(lo - pad, hi + pad)
    return bool(np.any(vals > hi + pad)) or len(vals) < sum(len(c) for c in curves)


def _grid_row(rows: list) -> Any:
    """The scale of the 2-D picture: the row whose groups tried the most points with their own
    AdamW-group LR (the middle one of the ties, in the report's order); None when no group searched
    both LRs."""
    scored = [(sum(len(g.cells) for g in r.groups.values() if g.two_lrs), r) for r in rows]
    scored = [(n, r) for n, r in scored if n]
    if not scored:
        return None
    top = max(n for n, _ in scored)
    tied = [r for n, r in scored if n == top]
    return tied[len(tied) // 2]


def plot_lr_grid(ctx: dict, rows: list, path: Path) -> bool:
    """One panel per optimizer at one scale: every point the search tried, placed at (LR, AdamW-group
    LR) on log axes, coloured and labelled by its loss on the search seed; ★ the tuned point, ◆ the
    shared protocol's (on the diagonal adamw_lr = lr). False when no group searched both LRs."""
    from matplotlib import colormaps

    row = _grid_row(rows)
    if row is None:
        return False
    shared = row.protocols.get("shared", {})
    names = [n for n in sorted(row.groups, key=lambda n: (n not in COLORS, n)) if row.groups[n].two_lrs]
    fig, axes = figure(len(names), w=4.8, h=4.2, cols=3)
    src = []
    for ax, name in zip(axes, names, strict=False):
        g = row.groups[name]
        pts = sorted(g.cells)
        loss = np.array([g.selection_loss(p) for p in pts])
        finite = np.isfinite(loss)
        x, y = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
        lo, hi = (float(loss[finite].min()), float(np.percentile(loss[finite], 90))) if finite.any() else (0, 1)
        sc = ax.scatter(x[finite], y[finite], c=loss[finite], cmap=colormaps["viridis_r"], vmin=lo, vmax=hi, s=70)
        if not finite.all():
            ax.scatter(x[~finite], y[~finite], marker="x", color="red", label="diverged")
        for xi, yi, v in zip(x, y, loss, strict=True):
            ax.annotate(
                f"{v:.3f}" if math.isfinite(v) else "div.",
                (xi, yi),
                fontsize=6,
                xytext=(4, 4),
                textcoords="offset points",
            )
        edge = [min(x.min(), y.min()) / 1.5, max(x.max(), y.max()) * 1.5]
        ax.plot(edge, edge, "--", color="gray", lw=0.8, label="adamw_lr = lr (shared)")
        b = g.best.point
        ax.plot([b[0]], [b[1]], "*", ms=16, mfc="none", mec="black", mew=1.2, label=f"tuned {fmt_point(b)}")
        if name in shared and shared[name].cells:
            s = shared[name].best.point
            ax.plot([s[0]], [s[1]], "D", ms=10, mfc="none", mec="red", mew=1.2, label=f"shared {fmt_point(s)}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        decades = math.log10(edge[1] / edge[0])  # both axes span at most this (the diagonal is drawn over it)
        log_axis(ax.xaxis, decades)
        log_axis(ax.yaxis, decades)
        ax.set_xlabel("peak LR of the hidden matrices (optim.lr)")
        ax.set_ylabel("peak LR of the AdamW group (optim.adamw_lr)")
        ax.set_title(opt_name(name), fontsize=10, color=color(name))
        fig.colorbar(sc, ax=ax, shrink=0.8, label="final " + LOSS + ", search seed")
        ax.legend(fontsize=6, loc="lower right")
        src.append(
            {
                "optim": name,
                "scale": row.short,
                "points": [list(p) for p in pts],
                "losses": loss.tolist(),
                "best": list(b),
            }
        )
    ctx["figures"]["loss_vs_both_lrs"] = src
    save(fig, path, f"Final validation loss over both peak LRs at {row.short} (the search seed's runs)", right=0.3)
    return True
