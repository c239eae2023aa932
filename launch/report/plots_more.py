"""More figures: Muon-family diagnostics per matrix class, the same at the end of training against
N, downstream accuracy against validation loss, and AdamW's L(D) with the other optimizers'
budgets (the data-efficiency picture). Helpers and colours come from launch/report/plot_kit.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from launch.report.logs import CLASS_NAMES, CLASSES, diag_series
from launch.report.markdown_util import opt_name
from launch.report.plot_kit import LOSS, MARKERS, color, empty, figure, log_axis, n_axis, save, shade
from launch.report.series import usable
from launch.report.stats import t_interval

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


def plot_efficiency(ctx: dict, path: Path) -> bool:
    """AdamW's final loss at each budget with its L(D) fit and 95% band, and the other optimizers'
    points: how far right AdamW would have to go to match them is the speedup."""
    entries = [e for e in ctx["headline"]["speedup"] if "fit" in e]
    if not entries:
        return False
    fig, axes = figure(len(entries), w=6.0, h=4.4, cols=2)
    src = []
    for ax, e in zip(axes, entries, strict=False):
        f = e["fit"]
        rows = [r for r in ctx["rows"] if r.label == e["label"]]
        d_all = [r.tokens for r in rows]
        reach = [x["adamw_tokens"] for x in e["rows"] if math.isfinite(x["adamw_tokens"])]
        xs = np.geomspace(min(d_all) / 1.3, max(d_all + reach) * 1.3, 80)
        E, A, beta = e["draws"]
        band = E[:, None] + A[:, None] * xs[None, :] ** -beta[:, None]
        ax.plot(xs, f(xs), "-", color=color("adamw"), label=f"AdamW L(D) = {f.E:.3f} + {f.A:.3g}·D^−{f.alpha:.3f}")
        ax.fill_between(
            xs,
            *np.percentile(band, [2.5, 97.5], axis=0),
            color=color("adamw"),
            alpha=0.15,
            lw=0,
            label="95% band of the fit",
        )
        for r in rows:
            for name, g in sorted(r.groups.items()):
                if not usable(g):
                    continue
                ti = t_interval(list(g.score.losses.values()))
                m = g.score.mean
                err = [[m - ti[1]], [ti[2] - m]] if ti else None
                ax.errorbar([r.tokens], [m], yerr=err, fmt="o", capsize=3, color=color(name))
                src.append({"scale": e["scale"], "optim": name, "tokens": r.tokens, "mean": m})
        for x in e["rows"]:
            if math.isfinite(x["adamw_tokens"]):
                ax.annotate(
                    "",
                    xy=(x["adamw_tokens"], x["loss"]),
                    xytext=(x["tokens"], x["loss"]),
                    arrowprops={"arrowstyle": "->", "color": color(x["optim"]), "lw": 0.8},
                )
                ax.text(
                    x["tokens"], x["loss"], f" {x['speedup']:.2g}×", fontsize=7, color=color(x["optim"]), va="bottom"
                )
        for name in sorted({n for r in rows for n in r.groups}):
            ax.plot([], [], "o", color=color(name), label=f"{opt_name(name)} (95% t-interval)")
        ax.set_xscale("log")
        log_axis(ax.xaxis)
        ax.set_xlabel("training tokens D")
        ax.set_ylabel("final " + LOSS)
        ax.set_title(f"{e['scale']}: arrows go to the AdamW tokens for the same loss", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    ctx["figures"]["data_efficiency"] = src
    save(fig, path, "Data efficiency over AdamW")
    return True
