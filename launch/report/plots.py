"""The report's figures (matplotlib, Agg backend: no display needed). One figure per kind, few points
each, so 200 runs plot in a couple of seconds. Every figure is always written (with a note when
there is nothing to show), so a report directory has a fixed set of files."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend choice)
import numpy as np  # noqa: E402
from matplotlib import ticker  # noqa: E402

FILES = {
    "curves": "val_loss_vs_tokens.png",
    "params": "loss_vs_params.png",
    "lr": "loss_vs_lr.png",
    "diag": "muon_diagnostics.png",
    "throughput": "throughput.png",
}
COLORS = {"adamw": "tab:blue", "muon_moonlight": "tab:orange", "orscale_lm": "tab:green"}


def _color(name: str, i: int) -> str:
    return COLORS.get(name.split("#")[0], f"C{(i + 3) % 10}")


def _grid(n: int, w: float = 4.2, h: float = 3.2) -> tuple:
    cols = min(3, max(n, 1))
    rows = max(1, math.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(w * cols, h * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])


def _save(fig, path: Path) -> None:
    # Fixed margins (in inches, so they suit any grid) rather than tight_layout, whose text-extent
    # passes cost more than the drawing itself.
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=0.8 / w, right=1 - 0.2 / w, bottom=0.6 / h, top=1 - 0.35 / h, wspace=0.35, hspace=0.6)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_curves(rows: list, path: Path) -> None:
    """Val loss against tokens per row: mean over seeds at the best LR, band = min..max over seeds."""
    fig, axes = _grid(len(rows))
    for ax, row in zip(axes, rows, strict=False):
        for i, (name, g) in enumerate(sorted(row.groups.items())):
            curves = [{ev["step"]: (ev.get("tokens"), ev.get("val_loss")) for ev in r.evals} for r in g.best.runs]
            steps = sorted(set.intersection(*[set(c) for c in curves]))
            if not steps:
                continue
            x = np.array([curves[0][s][0] or 0 for s in steps], float)
            y = np.array(
                [[c[s][1] if isinstance(c[s][1], (int, float)) else np.nan for s in steps] for c in curves], float
            )
            ax.plot(
                x,
                np.nanmean(y, 0) if np.isfinite(y).any() else y[0],
                marker=".",
                color=_color(name, i),
                label=f"{name} lr {g.best.lr:.3g}",
            )
            if len(curves) > 1:
                ax.fill_between(x, np.nanmin(y, 0), np.nanmax(y, 0), color=_color(name, i), alpha=0.2)
        ax.set_title(row.name, fontsize=9)
        ax.set_xlabel("tokens")
        ax.set_ylabel("val loss")
        ax.legend(fontsize=7)
    if not rows:
        _empty(axes[0], "no finished runs")
    _save(fig, path)


def plot_params(points: dict, fits: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for i, ((family, name), pts) in enumerate(sorted(points.items())):
        n = np.array([p[0] for p in pts])
        l_ = np.array([p[1] for p in pts])
        ax.plot(n, l_, "o", color=_color(name, i), label=f"{name} ({family})")
        fit = fits.get((family, name))
        if fit is not None:
            xs = np.geomspace(n.min() / 1.5, n.max() * 1.5, 50)
            ax.plot(xs, fit(xs), "-", color=_color(name, i), alpha=0.7, label=f"fit E={fit.E:.3f} α={fit.alpha:.3f}")
    if points:
        ax.set_xscale("log")
        ax.set_yscale("log")
        # Losses span far less than a decade: plain numbers at evenly spaced ticks, not 10^x labels.
        ax.yaxis.set_major_locator(ticker.MaxNLocator(6))
        ax.yaxis.set_major_formatter(ticker.ScalarFormatter())
        ax.yaxis.set_minor_locator(ticker.NullLocator())
        ax.set_xlabel("non-embedding parameters N")
        ax.set_ylabel("final val loss (best LR)")
        ax.legend(fontsize=7)
        if not any(f is not None for f in fits.values()):
            ax.set_title("too few scales for a fit (< 3)", fontsize=9)
    else:
        _empty(ax, "no finished runs with a parameter count")
    _save(fig, path)


def plot_lr(rows: list, path: Path) -> None:
    fig, axes = _grid(len(rows))
    for ax, row in zip(axes, rows, strict=False):
        for i, (name, g) in enumerate(sorted(row.groups.items())):
            lrs = sorted(g.cells)
            means = [g.cells[lr].mean for lr in lrs]
            errs = [g.cells[lr].std if math.isfinite(g.cells[lr].std) else 0.0 for lr in lrs]
            ax.errorbar(lrs, means, yerr=errs, marker="o", capsize=3, color=_color(name, i), label=name)
            if math.isfinite(g.best.mean):
                ax.plot([g.best.lr], [g.best.mean], "*", ms=12, color=_color(name, i))
        ax.set_xscale("log")
        ax.set_title(row.name, fontsize=9)
        ax.set_xlabel("peak LR")
        ax.set_ylabel("final val loss")
        ax.legend(fontsize=7)
    if not rows:
        _empty(axes[0], "no finished runs")
    _save(fig, path)


def plot_diag(rows: list, path: Path) -> None:
    """Trust ratio and cumulative r_max clip fraction over steps, Muon family at the best LR."""
    fig, (ax_r, ax_c) = plt.subplots(1, 2, figsize=(11, 4))
    drawn = 0
    for row in rows:
        for name, g in sorted(row.groups.items()):
            run = g.best.runs[0]
            pts = [
                (x["step"], x.get("diag/all/r"), x.get("diag/all/cum_frac_rmax"))
                for x in run.train
                if "diag/all/r" in x
            ]
            if not pts:
                continue
            steps = [p[0] for p in pts]
            r = [p[1] if isinstance(p[1], (int, float)) else np.nan for p in pts]
            c = [p[2] if isinstance(p[2], (int, float)) else np.nan for p in pts]
            label = f"{row.label} {name}"
            ax_r.plot(steps, r, label=label, lw=1)
            ax_c.plot(steps, c, label=label, lw=1)
            drawn += 1
    if drawn:
        ax_r.set_title("trust ratio diag/all/r (first seed, best LR)", fontsize=9)
        ax_c.set_title("clip fraction diag/all/cum_frac_rmax", fontsize=9)
        for ax in (ax_r, ax_c):
            ax.set_xlabel("step")
            ax.legend(fontsize=6)
    else:
        _empty(ax_r, "no Muon-family diagnostics (diag/all/r) in the logs")
        _empty(ax_c, "no diag/all/cum_frac_rmax in the logs")
    _save(fig, path)


def plot_throughput(runs: list, root: Path, path: Path) -> None:
    """Median tokens/s and MFU per run (sampled training lines; MFU is null on CPU). Up to 40 runs
    each bar is labelled; beyond that, bars are labelled by their parent directory (scale/optimizer),
    since 200 rotated labels are both unreadable and most of the plotting time."""
    items = []
    for r in sorted(runs, key=lambda r: str(r.path)):
        tps = [
            x["tokens_per_s"]
            for x in r.train
            if isinstance(x.get("tokens_per_s"), (int, float)) and math.isfinite(x["tokens_per_s"])
        ]
        mfu = [x["mfu"] for x in r.train if isinstance(x.get("mfu"), (int, float)) and math.isfinite(x["mfu"])]
        if tps:
            rel = r.path.relative_to(root)
            items.append((str(rel), str(rel.parent), float(np.median(tps)), float(np.median(mfu)) if mfu else None))
    n = max(len(items), 1)
    per_run = n <= 40
    if per_run:
        ticks, labels = list(range(len(items))), [i[0] for i in items]
    else:
        groups: dict[str, list[int]] = {}
        for k, i in enumerate(items):
            groups.setdefault(i[1], []).append(k)
        ticks, labels = [float(np.mean(v)) for v in groups.values()], list(groups)
    group_ids = {g: k for k, g in enumerate(dict.fromkeys(i[1] for i in items))}
    colors = [f"C{group_ids[i[1]] % 10}" for i in items]
    longest = max((len(t) for t in labels), default=10)
    fontsize = 7 if per_run or len(labels) <= 60 else 5
    label_in = longest * fontsize * 0.6 / 72 + 0.3
    height = 6 + label_in
    fig, (ax_t, ax_m) = plt.subplots(
        2, 1, figsize=(min(30, max(6, 0.25 * len(labels) + 0.02 * n + 3)), height), sharex=True
    )
    fig.subplots_adjust(left=0.08, right=0.98, top=0.96, bottom=label_in / height, hspace=0.15)
    if items:
        x = np.arange(len(items))
        ax_t.bar(x, [i[2] for i in items], color=colors)
        ax_t.set_ylabel("tokens/s (median)")
        if any(i[3] is not None for i in items):
            ax_m.bar(x, [i[3] or 0.0 for i in items], color=colors)
            ax_m.set_ylabel("MFU (median)")
        else:
            ax_m.text(0.5, 0.5, "MFU not logged (null on CPU)", ha="center", va="center", transform=ax_m.transAxes)
            ax_m.set_yticks([])
        ax_m.set_xticks(ticks)
        ax_m.set_xticklabels(labels, rotation=90, fontsize=fontsize)
    else:
        _empty(ax_t, "no training lines")
        _empty(ax_m, "no training lines")
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_all(ctx: dict, out_dir: Path) -> dict[str, str]:
    """Write every figure; returns kind -> file name (relative to out_dir, for report.md)."""
    plot_curves(ctx["rows"], out_dir / FILES["curves"])
    plot_params(ctx["points"], ctx["fits"], out_dir / FILES["params"])
    plot_lr(ctx["rows"], out_dir / FILES["lr"])
    plot_diag(ctx["rows"], out_dir / FILES["diag"])
    plot_throughput(ctx["runs"], ctx["runs_dir"], out_dir / FILES["throughput"])
    return dict(FILES)
