"""Figures of training: validation loss against tokens, and the Muon-family diagnostics per matrix
class over training."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import ticker
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from records.read import CLASSES, diag_series
from report.analysis import Report
from report.fmt import fmt_point, human, opt_name, order
from report.plots import LOSS, clip_top, color, empty, eval_curve, figure, log_axis, save
from report.runs import Row

CLASS_NAMES = {"attn_qkv": "attention QKV", "attn_out": "attention out", "mlp_up": "MLP up", "mlp_down": "MLP down"}
# (row title, [(field, line style, label)], y label, log y)
DIAG_ROWS = [
    ("trust ratio", [("r", "-", "r (clipped)"), ("r_raw", "--", "r_raw (before the clip)")], "trust ratio r", True),
    (
        "clipping",
        [("cum_frac_rmax", "-", "at r_max"), ("cum_frac_rmin", "--", "at r_min")],
        "share of steps at the clip (cumulative)",
        False,
    ),
    ("weight norm", [("w_norm", "-", "‖W‖_F")], "‖W‖_F (mean over matrices)", True),
    ("update size", [("update_ratio", "-", "‖ΔW‖/‖W‖")], "update / weight norm ratio", True),
]


def curves(rep: Report, path: Path) -> None:
    """Val loss against tokens per row, mean over the scored seeds at the best LR, min–max band."""
    drawable = [r for r in rep.ordered if any(g.score.runs and g.status == "done" for g in r.groups.values())]
    fig, axes = figure(len(drawable), w=5.4, h=4.0)
    src = []
    for ax, row in zip(axes, drawable, strict=False):
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: human(v)))
        ax.xaxis.set_major_locator(ticker.MaxNLocator(5))
        xs, ys = [], []
        for name in order(row.groups):
            g = row.groups[name]
            cur = eval_curve(g.score.runs) if g.status == "done" else None
            if cur is None or g.best is None:
                continue
            x, y = cur
            mean = np.nanmean(y, 0) if np.isfinite(y).any() else y[0]
            label = f"{opt_name(name)}, LR {fmt_point(g.best)}, {y.shape[0]} seeds"
            ax.plot(x, mean, marker=".", color=color(name), label=label)
            if y.shape[0] > 1:
                ax.fill_between(x, np.nanmin(y, 0), np.nanmax(y, 0), color=color(name), alpha=0.2, lw=0)
            xs.append(x)
            ys.append(y)
            src.append({"row": row.short, "optim": name, "lr": g.best[0], "adamw_lr": g.best[1]})
            src[-1].update(tokens=x.tolist(), mean=mean.tolist())
        cut = clip_top(ax, ys, xs)
        ax.set_title(row.title + ("\n(y axis cut: the early losses are off the top)" if cut else ""), fontsize=9)
        ax.set_xlabel("training tokens")
        ax.set_ylabel(LOSS)
        ax.fill_between([], [], [], color="grey", alpha=0.2, label="band: min–max over seeds")
        ax.legend(fontsize=7, loc="upper right")
    if not drawable:
        empty(axes[0], "no group with final numbers yet")
    rep.figures["val_loss_vs_tokens"] = src
    save(fig, path, "Validation loss during training at each optimizer's best LR")


def _values(series: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [(s["step"], s[key]) for s in series if isinstance(s.get(key), (int, float)) and math.isfinite(s[key])]
    return np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)


def _diag_runs(row: Row) -> dict[str, list[tuple[int, list[dict]]]]:
    """optimizer -> [(seed, diag series)] for every run at the best LR of a finished group."""
    out = {}
    for name in order(row.groups):
        g = row.groups[name]
        if g.status != "done":
            continue
        at = g.runs_at(g.best)
        got = [(int(s), diag_series(r)) for s, r in zip(at["seed"], at["run"], strict=True)]
        got = [(s, d) for s, d in got if d and any(f"diag/{CLASSES[0]}/r" in x for x in d)]
        if got:
            out[name] = sorted(got, key=lambda sd: sd[0])
    return out


def _varies(runs: dict[str, list[tuple[int, list[dict]]]], field: str) -> bool:
    for lst in runs.values():
        for _, d in lst:
            for c in CLASSES:
                y = _values(d, f"diag/{c}/{field}")[1]
                if y.size and np.ptp(y) > 0:
                    return True
    return False


def _panels(fig: Figure, n_rows: int, ylabels: list[str], logy: list[bool], xlabel: str) -> list[list[Any]]:
    """A grid of panels, a row per quantity and a column per matrix class: one y scale per row (the
    classes side by side compare), one x for all; inner tick labels off, which also halves the
    drawing time."""
    grid: list[list[Any]] = []
    first = None
    for i in range(n_rows):
        row_ax = None
        grid.append([])
        for j in range(len(CLASSES)):
            ax = fig.add_subplot(n_rows, len(CLASSES), i * len(CLASSES) + j + 1, sharex=first, sharey=row_ax)
            first, row_ax = first or ax, row_ax or ax
            ax.tick_params(labelleft=j == 0, labelbottom=i == n_rows - 1)
            grid[-1].append(ax)
    for i, row_axes in enumerate(grid):
        for j, ax in enumerate(row_axes):
            if logy[i]:
                ax.set_yscale("log")
                log_axis(ax.yaxis)
            if i == 0:
                ax.set_title(CLASS_NAMES[CLASSES[j]], fontsize=10)
            if j == 0:
                ax.set_ylabel(ylabels[i], fontsize=8)
            if i == n_rows - 1:
                ax.set_xlabel(xlabel)
    return grid


def diagnostics(rep: Report, path: Path) -> None:
    """Diagnostics over training per matrix class (columns) for every seed at the best LR, at the
    largest scale that has them; rows: trust ratio, clip shares, ‖W‖, update/weight ratio."""
    chosen, runs = None, {}
    for row in sorted(rep.series or rep.ordered, key=lambda r: -(r.n_params or 0)):
        if runs := _diag_runs(row):
            chosen = row
            break
    if chosen is None:
        fig = Figure(figsize=(8, 3))
        empty(fig.add_subplot(1, 1, 1), "no Muon-family diagnostics (diag/<class>/*) at a finished best LR")
        rep.figures["muon_diagnostics"] = []
        save(fig, path)
        return
    # A row of panels only when some optimizer logs a non-constant value there (Muon+Moonlight's r ≡ 1).
    keep = [spec for spec in DIAG_ROWS if any(_varies(runs, f) for f, _, _ in spec[1])]
    fig = Figure(figsize=(4.2 * len(CLASSES), 3.0 * len(keep) + 1.0))
    grid = _panels(fig, len(keep), [s[2] for s in keep], [s[3] for s in keep], "step")
    src = []
    for (_title, fields, _, _), row_axes in zip(keep, grid, strict=True):
        for cls, ax in zip(CLASSES, row_axes, strict=True):
            for name, lst in runs.items():
                for seed, d in lst:
                    for f, style, _ in fields:
                        x, y = _values(d, f"diag/{cls}/{f}")
                        if y.size:
                            ax.plot(x, y, style, color=color(name), lw=0.9, alpha=0.75)
                            src.append({"optim": name, "seed": seed, "class": cls, "field": f})
                            src[-1].update(steps=x.tolist(), values=y.tolist())
        if len(fields) > 1:  # outside the panel: inside, it covered r_raw's plateau
            handles = [Line2D([], [], ls=st, color="grey") for _, st, _ in fields]
            where = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "borderaxespad": 0}
            row_axes[-1].legend(handles, [lb for _, _, lb in fields], fontsize=7, **where)
    handles = [Line2D([], [], color=color(n)) for n in runs]
    labels = [f"{opt_name(n)}: seeds {', '.join(str(s) for s, _ in lst)} (one line each)" for n, lst in runs.items()]
    omitted = [spec[0] for spec in DIAG_ROWS if spec not in keep]
    if omitted:
        handles.append(Line2D([], [], ls="none"))
        labels.append(f"not shown (constant for every optimizer, e.g. never clipped): {', '.join(omitted)}")
    fig.legend(handles, labels, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    rep.figures["muon_diagnostics"] = src
    title = f"Muon-family diagnostics per matrix class at the best LR, {chosen.short} (N={chosen.n_params:,.0f})"
    save(fig, path, title + ", every seed", bottom=1.0, right=1.6, dpi=80)
