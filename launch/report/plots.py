"""The report's figures (matplotlib's Figure + Agg canvas: no pyplot, no display). Colours are fixed
per optimizer in every figure; scales are shades of it (lighter = smaller) with their own markers.
The five core files are always written (with a note when there is nothing to show) so a report
directory has a fixed set; the others only when they have data. Each figure's numbers go to
summary.json under "figures" (ctx["figures"][kind])."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import ticker

from launch.report import plots_compute, plots_more
from launch.report.analysis import ordered_rows, seed_interval
from launch.report.markdown_util import human, opt_name
from launch.report.plot_kit import (
    COLORS,
    EXTRA,
    FILES,
    LOSS,
    MARKERS,
    clip_top,
    color,
    empty,
    eval_curve,
    figure,
    log_axis,
    n_axis,
    plain_log_y,
    save,
    shade,
)
from launch.report.series import main_series, usable


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
            ax.plot(x, mean, marker=".", color=color(name), label=f"{opt_name(name)}, LR {g.best.lr:.3g}, {n} seeds")
            if n > 1:
                ax.fill_between(x, np.nanmin(y, 0), np.nanmax(y, 0), color=color(name), alpha=0.2, lw=0)
            xs.append(x)
            ys.append(y)
            src.append({"row": row.short, "optim": name, "lr": g.best.lr, "tokens": x.tolist(), "mean": mean.tolist()})
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


def write_all(ctx: dict, out_dir: Path) -> dict[str, str]:
    """Write every figure; returns kind -> file name (relative to out_dir, for report.md)."""
    rows = ordered_rows(ctx["rows"])
    series = max(main_series(ctx["rows"]).values(), key=len, default=[])
    out = dict(FILES)
    plot_curves(ctx, rows, out_dir / FILES["curves"])
    plot_params(ctx, out_dir / FILES["params"])
    plot_lr(ctx, out_dir / FILES["lr"])
    plots_more.plot_diag(ctx, series or rows, out_dir / FILES["diag"])
    plots_compute.plot_throughput(ctx, rows, out_dir / FILES["throughput"])
    extra = {
        "flops": lambda p: plots_compute.plot_flops(ctx, series, p),
        "diag_scales": lambda p: plots_more.plot_diag_scales(ctx, series, p),
        "downstream": lambda p: plots_more.plot_downstream(ctx, p),
        "efficiency": lambda p: plots_more.plot_efficiency(ctx, p),
    }
    for kind, draw in extra.items():
        path = out_dir / EXTRA[kind]
        if draw(path):
            out[kind] = EXTRA[kind]
        elif path.exists():
            path.unlink()  # a figure from an earlier report that has nothing to show now
    return out
