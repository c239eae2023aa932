"""The Muon-family diagnostics per matrix class over training, and at the end of training against N."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from launch.report.logs import CLASS_NAMES, CLASSES, diag_series
from launch.report.markdown_util import opt_name
from launch.report.plot_kit import color, empty, log_axis, n_axis, save

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


def _values(series: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [(s["step"], s[key]) for s in series if isinstance(s.get(key), (int, float)) and math.isfinite(s[key])]
    return np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)


def _diag_runs(row) -> dict[str, list]:
    """optimizer -> [(seed, diag series)] for every run at the best LR of a finished group."""
    out = {}
    for name, g in sorted(row.groups.items()):
        if g.status != "done":
            continue
        got = [(int(r.cfg("train.seed", 0)), diag_series(r)) for r in g.best.runs]
        got = [(s, d) for s, d in got if d and any(f"diag/{CLASSES[0]}/r" in x for x in d)]
        if got:
            out[name] = sorted(got)
    return out


def plot_diag(ctx: dict, rows: list, path: Path) -> None:
    """Diagnostics over training per matrix class (columns) for every seed at the best LR, at the
    largest scale that has them; rows: trust ratio, clip shares, ‖W‖, update/weight ratio."""
    chosen, runs = None, {}
    for row in sorted(rows, key=lambda r: -(r.n_params or 0)):
        runs = _diag_runs(row)
        if runs:
            chosen = row
            break
    if chosen is None:
        fig = Figure(figsize=(8, 3))
        empty(fig.add_subplot(1, 1, 1), "no Muon-family diagnostics (diag/<class>/*) at a finished best LR")
        ctx["figures"]["muon_diagnostics"] = []
        save(fig, path)
        return
    # A row of panels only when some optimizer logs a non-constant value there (Muon+Moonlight's r ≡ 1).
    keep = [
        spec
        for spec in DIAG_ROWS
        if any(
            np.ptp(_values(d, f"diag/{c}/{f}")[1]) > 0 if _values(d, f"diag/{c}/{f}")[1].size else False
            for lst in runs.values()
            for _, d in lst
            for c in CLASSES
            for f, _, _ in spec[1]
        )
    ]
    fig = Figure(figsize=(4.2 * len(CLASSES), 3.0 * len(keep) + 1.0))
    src = []
    omitted = [spec[0] for spec in DIAG_ROWS if spec not in keep]
    first = None
    for i, (_title, fields, ylabel, logy) in enumerate(keep):
        row_ax = None
        for j, cls in enumerate(CLASSES):
            # One y scale per row (the classes side by side compare), one x (steps) for all; inner
            # tick labels off, which also halves the drawing time.
            ax = fig.add_subplot(len(keep), len(CLASSES), i * len(CLASSES) + j + 1, sharex=first, sharey=row_ax)
            first, row_ax = first or ax, row_ax or ax
            ax.tick_params(labelleft=j == 0, labelbottom=i == len(keep) - 1)
            for name, lst in runs.items():
                for seed, d in lst:
                    for f, style, _ in fields:
                        x, y = _values(d, f"diag/{cls}/{f}")
                        if not y.size:
                            continue
                        ax.plot(x, y, style, color=color(name), lw=0.9, alpha=0.75)
                        src.append(
                            {
                                "optim": name,
                                "seed": seed,
                                "class": cls,
                                "field": f,
                                "steps": x.tolist(),
                                "values": y.tolist(),
                            }
                        )
            if logy:
                ax.set_yscale("log")
                log_axis(ax.yaxis)
            if i == 0:
                ax.set_title(CLASS_NAMES[cls], fontsize=10)
            if j == 0:
                ax.set_ylabel(ylabel, fontsize=8)
            if i == len(keep) - 1:
                ax.set_xlabel("step")
            if j == len(CLASSES) - 1 and len(fields) > 1:
                ax.legend(
                    [Line2D([], [], ls=st, color="grey") for _, st, _ in fields],
                    [lb for _, _, lb in fields],
                    fontsize=7,
                    loc="upper left",  # outside the panel: inside, it covered r_raw's plateau
                    bbox_to_anchor=(1.02, 1.0),
                    borderaxespad=0,
                )
    handles = [Line2D([], [], color=color(n)) for n in runs]
    labels = [f"{opt_name(n)}: seeds {', '.join(str(s) for s, _ in lst)} (one line each)" for n, lst in runs.items()]
    if omitted:
        handles.append(Line2D([], [], ls="none"))
        labels.append(f"not shown (constant for every optimizer, e.g. never clipped): {', '.join(omitted)}")
    fig.legend(handles, labels, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    ctx["figures"]["muon_diagnostics"] = src
    title = (
        f"Muon-family diagnostics per matrix class at the best LR, {chosen.short} (N={chosen.n_params:,.0f}), "
        "every seed"
    )
    save(fig, path, title, bottom=1.0, right=1.6, dpi=80)


def plot_diag_scales(ctx: dict, series: list, path: Path) -> bool:
    """The last quarter of training's mean diagnostic per class against N (bars: min–max over seeds)."""
    per = [(row, _diag_runs(row)) for row in series if row.n_params]
    per = [(row, runs) for row, runs in per if runs]
    if len(per) < 2:
        return False
    fields = [
        ("r", "trust ratio r (clipped)", True),
        ("cum_frac_rmax", "share at r_max", False),
        ("update_ratio", "update / weight norm ratio", True),
    ]
    fig = Figure(figsize=(4.2 * len(CLASSES), 3.0 * len(fields) + 0.6))
    src = []
    first = None
    for i, (f, ylabel, logy) in enumerate(fields):
        row_ax = None
        for j, cls in enumerate(CLASSES):
            ax = fig.add_subplot(len(fields), len(CLASSES), i * len(CLASSES) + j + 1, sharex=first, sharey=row_ax)
            first, row_ax = first or ax, row_ax or ax
            ax.tick_params(labelleft=j == 0, labelbottom=i == len(fields) - 1)
            names = sorted({n for _, runs in per for n in runs})
            for name in names:
                xs, ms, lo, hi = [], [], [], []
                for row, runs in per:
                    vals = []
                    for _, d in runs.get(name, []):
                        x, y = _values(d, f"diag/{cls}/{f}")
                        if y.size:
                            vals.append(float(np.mean(y[x >= 0.75 * x.max()])))
                    if vals:
                        xs.append(row.n_params)
                        ms.append(float(np.mean(vals)))
                        lo.append(ms[-1] - min(vals))
                        hi.append(max(vals) - ms[-1])
                        src.append({"optim": name, "N": row.n_params, "class": cls, "field": f, "seeds": vals})
                if xs:
                    ax.errorbar(xs, ms, yerr=[lo, hi], fmt="o-", capsize=3, color=color(name))
            n_axis(ax, [float(r.n_params) for r, _ in per])
            if logy:
                ax.set_yscale("log")
                log_axis(ax.yaxis)
            if i == 0:
                ax.set_title(CLASS_NAMES[cls], fontsize=10)
            if j == 0:
                ax.set_ylabel(ylabel, fontsize=8)
            if i == len(fields) - 1:
                ax.set_xlabel("non-embedding parameters N")
    names = sorted({n for _, runs in per for n in runs})
    fig.legend(
        [Line2D([], [], color=color(n), marker="o") for n in names],
        [opt_name(n) for n in names],
        loc="lower center",
        ncol=len(names),
        fontsize=8,
        frameon=False,
        title="bars: min–max over seeds",
        title_fontsize=8,
    )
    ctx["figures"]["muon_diagnostics_vs_params"] = src
    save(fig, path, "Muon-family diagnostics in the last quarter of training against model size", bottom=1.0, dpi=80)
    return True
