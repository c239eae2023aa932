"""Figures across settings: loss against the peak LR per width (and the best LR against width), the
loss over both LRs at one scale, final loss and the gap to AdamW against N with the L(N) fits, AdamW's
L(D) with the other optimizers' budgets, and downstream accuracy against validation loss."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps, ticker
from matplotlib.lines import Line2D

from report.analysis import MIN_SCALES, Report
from report.fmt import fmt_point, opt_name, order
from report.plots import LOSS, MARKERS, color, empty, figure, fit_ylim, log_axis, n_axis, save, shade
from report.runs import Score, usable
from report.selection import SHARED
from report.stats import t_interval


def _band(ax: Any, xs: np.ndarray, fit: Any, draws: Any, name: str, labels: tuple = (None, None), **line: Any) -> None:
    """A fit's curve and the 95% band of its refits (draws: E, A and the exponent, each [draws])."""
    E, A, a = draws
    band = E[:, None] + A[:, None] * xs[None, :] ** -a[:, None]
    ax.plot(xs, fit(xs), "-", color=color(name), label=labels[0], **line)
    lo, hi = np.percentile(band, [2.5, 97.5], axis=0)
    ax.fill_between(xs, lo, hi, color=color(name), alpha=0.15, lw=0, label=labels[1])


def _t_err(s: Score) -> list[float]:
    """An error bar's (below, above) the mean: the 95% t-interval over seeds (none with one seed)."""
    ti = t_interval(list(s.losses.values()))
    return [s.mean - ti[1], ti[2] - s.mean] if ti else [0.0, 0.0]


def params(rep: Report, path: Path) -> None:
    """(a) final loss against N with the L(N) fits and their 95% bands; (b) the gap to AdamW."""
    sc = rep.scaling
    fig, (ax, ax_gap) = figure(2, w=5.6, h=4.2, cols=2)
    names = order({n for r in rep.series for n in r.groups})
    src: dict[str, Any] = {"points": [], "fits": {}, "gaps": []}
    all_n: list[float] = []
    for j, name in enumerate(names):
        used = [r for r in rep.series if r.n_params and usable(r.groups.get(name))]
        if not used:
            continue
        n = np.array([r.n_params for r in used], float)
        m = np.array([r.groups[name].score.mean for r in used])
        err = np.array([_t_err(r.groups[name].score) for r in used]).T
        all_n += n.tolist()
        e, label = sc["fits"].get(name, {}), opt_name(name)
        if "fit" in e:
            f = e["fit"]
            label += f": E={f.E:.3f}, α={f.alpha:.2f}"
            _band(ax, np.geomspace(n.min() / 1.3, n.max() * 1.3, 60), f, e["draws"], name, alpha=0.8)
            src["fits"][name] = {"E": f.E, "A": f.A, "alpha": f.alpha}
        dodge = 1.03 ** (j - (len(names) - 1) / 2)  # side by side at each N, not on top of each other
        ax.errorbar(n * dodge, m, yerr=err, fmt="o", capsize=3, color=color(name), label=label)
        src["points"] += [{"optim": name, "N": float(a), "mean": float(b)} for a, b in zip(n, m, strict=True)]
    if all_n:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.MaxNLocator(6))  # losses span far less than a decade: plain numbers
        ax.yaxis.set_major_formatter(ticker.ScalarFormatter())
        ax.yaxis.set_minor_locator(ticker.NullLocator())
        n_axis(ax, all_n)
        ax.set_xlabel("non-embedding parameters N")
        ax.set_ylabel("final " + LOSS)
        ax.set_title(_params_title(sc["fits"], names, src["fits"]), fontsize=9)
        ax.errorbar([], [], yerr=[], fmt="o", color="grey", label="bars: 95% t-interval over seeds")
        ax.legend(fontsize=7, loc="upper right")
    else:
        empty(ax, "no scale with final numbers yet")
    for j, ((a, b), gp) in enumerate(sc["gaps"].items()):
        if b != "adamw":
            continue
        diff, ci = np.array(gp["diff"]), np.array(gp["ci"]).reshape(-1, 2)
        gap_err = [diff - ci[:, 0], ci[:, 1] - diff]
        x, label = np.array(gp["N"]) * 1.03 ** (j - 0.5), f"{opt_name(a)} − AdamW"
        ax_gap.errorbar(x, gp["diff"], yerr=gap_err, fmt="o-", capsize=3, color=color(a), label=label)
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
    rep.figures["loss_vs_params"] = src
    save(fig, path, "Scaling with model size")


def _params_title(fits: dict[str, Any], names: list[str], drawn: dict[str, Any]) -> str:
    """The panel's title says which curves are drawn: L(N) needs MIN_SCALES finished scales."""
    if not drawn:
        return f"Final loss at the best LR (no L(N) fit: it needs ≥ {MIN_SCALES} scales)"
    missing = [opt_name(n) for n in names if n in fits and n not in drawn]
    tail = f"\nno fit for {', '.join(missing)} (< {MIN_SCALES} scales)" if missing else ""
    return "Final loss at the best LR; lines: L(N) fits, shading: their 95% band" + tail


def lr(rep: Report, path: Path) -> None:
    """One panel per optimizer: final loss against LR, one curve per width; then best LR vs width."""
    t = rep.transfer
    names = order(t["points"])
    # The best-LR-against-width panel only once some optimizer has two widths (else one dot per colour).
    transfer = any(len({p["d_model"] for p in t["points"][n]}) >= 2 for n in names)
    fig, axes = figure(len(names) + int(transfer), w=5.4, h=4.2, cols=2)
    src = []
    for ax, name in zip(axes, names, strict=False):
        pts = sorted(t["points"][name], key=lambda p: p["d_model"])
        for k, p in enumerate(pts):
            c = shade(name, k, len(pts))
            label = f"d={p['d_model']} ({p['scale']})"
            ax.plot(p["lrs"], p["losses"], marker=MARKERS[k % len(MARKERS)], color=c, ms=4, label=label)
            best_loss = p["losses"][p["lrs"].index(p["best_lr"])]
            ax.plot([p["best_lr"]], [best_loss], "*", ms=13, color=c, mec="black", mew=0.6)
            src.append({"optim": name, **{k2: p[k2] for k2 in ("scale", "d_model", "lrs", "losses", "best_lr")}})
        ax.plot([], [], "*", ms=11, color="white", mec="black", label="best LR")
        ax.set_xscale("log")
        log_axis(ax.xaxis)
        ax.set_xlabel("peak LR")
        ax.set_ylabel("final " + LOSS + f" ({pts[0]['selection']})" if pts else LOSS)
        cut = fit_ylim(ax, [p["losses"] for p in pts])
        title = opt_name(name) + (" (axis cut: the worst LRs are off the top)" if cut else "")
        ax.set_title(title, fontsize=9, color=color(name))
        ax.legend(fontsize=7, loc="best")
    if transfer:
        best_vs_width(axes[len(names)], t, names)
    if not names:
        empty(axes[0], "no finished LR search yet")
    rep.figures["loss_vs_lr"] = src
    save(fig, path, "Final validation loss against peak LR, per width")


FIT_STYLES = ("-", "--", ":", "-.")


def best_vs_width(ax: Any, t: dict[str, Any], names: list[str]) -> None:
    """Each optimizer's best LR against width and its fitted line. Optimizers often share a grid LR:
    each gets its own marker and line style, and its points sit a little (3% of the axis) to the side
    of the width, so coinciding ones stay visible."""
    handles: list[Line2D] = []
    labels: list[str] = []
    widths = [p["d_model"] for pts in t["points"].values() for p in pts]
    step = (max(widths) / min(widths)) ** 0.03 if widths and max(widths) > min(widths) else 1.04  # 3% of the axis
    for j, name in enumerate(names):
        pts = sorted(t["points"][name], key=lambda p: p["d_model"])
        d = np.array([p["d_model"] for p in pts], float)
        dodged = d * step ** (j - (len(names) - 1) / 2)
        best = np.array([p["vertex_lr"] or p["best_lr"] for p in pts])
        s = t["fits"][name]["slope"]
        edge = np.array([bool(p["edge"]) for p in pts])
        label = opt_name(name) + ("" if s is None else f": slope {s.slope:+.2f}")
        mark: dict[str, Any] = {"marker": MARKERS[j % len(MARKERS)], "color": color(name), "mec": "black", "mew": 0.5}
        style = FIT_STYLES[j % len(FIT_STYLES)] if s is not None else "none"
        ax.plot(dodged[~edge], best[~edge], ls="none", **mark)
        handles.append(Line2D([], [], ls=style, **mark))  # the legend shows marker and fit line together
        labels.append(label)
        if edge.any():  # a grid-edge optimum is a bound, not an estimate: drawn open
            open_mark = mark | {"mfc": "none", "mec": color(name), "mew": 1.2}
            handles.append(ax.plot(dodged[edge], best[edge], ls="none", **open_mark)[0])
            labels.append(f"{opt_name(name)}: at a grid edge")
        if s is not None:
            fit = 2 ** (s.intercept + s.slope * np.log2(d))
            ax.plot(d, fit, style, color=color(name), alpha=0.8, lw=1.4)
    ax.set_xscale("log", base=2)
    optima = {p["vertex_lr"] or p["best_lr"] for pts in t["points"].values() for p in pts}
    if len(optima) == 1:  # every optimum at one LR: give the axis an octave each way, not a zero span
        ax.set_ylim(min(optima) / 2, min(optima) * 2)
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(ticker.FixedLocator(sorted({p["d_model"] for pts in t["points"].values() for p in pts})))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    log_axis(ax.yaxis)
    ax.set_xlabel("width d_model")
    ax.set_ylabel("best peak LR (parabola optimum, else grid best)")
    ax.set_title("LR transfer: best LR against width", fontsize=10)
    ax.legend(handles, labels, fontsize=7, loc="best")


def lr_grid(rep: Report, path: Path) -> bool:
    """One panel per optimizer at one scale: every point the search tried, placed at (LR, AdamW-group
    LR) on log axes, coloured and labelled by its loss on the search seed; ★ the tuned point, ◆ the
    shared protocol's (on the diagonal adamw_lr = lr). False when no group searched both LRs."""
    two = [r for r in rep.ordered if any(g.two_lrs for g in r.groups.values())]
    if not two:
        return False
    row = max(two, key=lambda r: (r.n_params or 0, r.tokens))  # the largest scale that searched both LRs
    shared = row.protocols.get(SHARED, {})
    names = [n for n in order(row.groups) if row.groups[n].two_lrs]
    fig, axes = figure(len(names), w=4.8, h=4.2, cols=3)
    src = []
    for ax, name in zip(axes, names, strict=False):
        g = row.groups[name]
        pts = sorted(g.points)
        loss = np.array([g.selection_loss(p) for p in pts])
        ok = np.isfinite(loss)
        x, y = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
        lo, hi = (float(loss[ok].min()), float(np.percentile(loss[ok], 90))) if ok.any() else (0, 1)
        sc = ax.scatter(x[ok], y[ok], c=loss[ok], cmap=colormaps["viridis_r"], vmin=lo, vmax=hi, s=70)
        if not ok.all():
            ax.scatter(x[~ok], y[~ok], marker="x", color="red", label="diverged")
        for xi, yi, v in zip(x, y, loss, strict=True):
            text = f"{v:.3f}" if math.isfinite(v) else "div."
            ax.annotate(text, (xi, yi), fontsize=6, xytext=(4, 4), textcoords="offset points")
        edge = [min(x.min(), y.min()) / 1.5, max(x.max(), y.max()) * 1.5]
        ax.plot(edge, edge, "--", color="gray", lw=0.8, label="adamw_lr = lr (shared)")
        b = g.best or (math.nan, math.nan)
        ax.plot([b[0]], [b[1]], "*", ms=16, mfc="none", mec="black", mew=1.2, label=f"tuned {fmt_point(b)}")
        if name in shared and (s := shared[name].best) is not None:
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
        points = [list(p) for p in pts]
        src.append({"optim": name, "scale": row.short, "points": points, "losses": loss.tolist(), "best": list(b)})
    rep.figures["loss_vs_both_lrs"] = src
    save(fig, path, f"Final validation loss over both peak LRs at {row.short} (the search seed's runs)", right=0.3)
    return True


def efficiency(rep: Report, path: Path) -> bool:
    """AdamW's final loss at each budget with its L(D) fit and 95% band, and the other optimizers'
    points: how far right AdamW would have to go to match them is the speedup."""
    entries = [e for e in rep.speedup if "fit" in e]
    if not entries:
        return False
    fig, axes = figure(len(entries), w=6.0, h=4.4, cols=2)
    src = []
    for ax, e in zip(axes, entries, strict=False):
        f = e["fit"]
        rows = [r for r in rep.rows if r.label == e["label"]]
        reach = [x["adamw_tokens"] for x in e["rows"] if math.isfinite(x["adamw_tokens"])]
        xs = np.geomspace(min(r.tokens for r in rows) / 1.3, max([r.tokens for r in rows] + reach) * 1.3, 80)
        labels = (f"AdamW L(D) = {f.E:.3f} + {f.A:.3g}·D^−{f.alpha:.3f}", "95% band of the fit")
        _band(ax, xs, f, e["draws"], "adamw", labels)
        for r in rows:
            for name in order(n for n, g in r.groups.items() if usable(g)):
                s = r.groups[name].score
                ax.errorbar([r.tokens], [s.mean], yerr=np.c_[_t_err(s)], fmt="o", capsize=3, color=color(name))
                src.append({"scale": e["scale"], "optim": name, "tokens": r.tokens, "mean": s.mean})
        others = order({x["optim"] for x in e["rows"]})
        for x in (x for x in e["rows"] if math.isfinite(x["adamw_tokens"])):
            arrow = {"arrowstyle": "->", "color": color(x["optim"]), "lw": 0.8}
            ax.annotate("", xy=(x["adamw_tokens"], x["loss"]), xytext=(x["tokens"], x["loss"]), arrowprops=arrow)
            above = 4 + 10 * others.index(x["optim"])  # points: one line per optimizer, clear of the markers
            where = {"xytext": (-6, above), "textcoords": "offset points", "ha": "right", "va": "bottom"}
            ax.annotate(f"{x['speedup']:.2g}×", (x["tokens"], x["loss"]), fontsize=7, color=color(x["optim"]), **where)
        for name in order({n for r in rows for n in r.groups}):
            ax.plot([], [], "o", color=color(name), label=f"{opt_name(name)} (95% t-interval)")
        ax.set_xscale("log")
        log_axis(ax.xaxis)
        ax.set_xlabel("training tokens D")
        ax.set_ylabel("final " + LOSS)
        ax.set_title(f"{e['scale']}: arrows go to the AdamW tokens for the same loss", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    rep.figures["data_efficiency"] = src
    save(fig, path, "Data efficiency over AdamW")
    return True


def downstream(rep: Report, path: Path) -> bool:
    """Per task: primary accuracy against final val loss, one point per scale × optimizer (bars:
    95% t-interval over seeds, or the Wilson interval of one seed), chance as a dashed line."""
    data = rep.downstream
    if not data:
        return False
    tasks = sorted(data)
    fig, axes = figure(len(tasks), w=4.6, h=3.6)
    scales = list(dict.fromkeys(e["row"].short for items in data.values() for e in items))
    src = []
    for ax, task in zip(axes, tasks, strict=False):
        for e in (e for e in data[task] if e["values"]):
            m = float(np.mean(list(e["values"].values())))
            lo, hi = e["ci"] if all(map(math.isfinite, e["ci"])) else (m, m)
            k = scales.index(e["row"].short)
            marker, shade_k = MARKERS[k % len(MARKERS)], shade(e["optim"], k, len(scales))
            ax.errorbar([e["loss"]], [m], yerr=[[m - lo], [hi - m]], fmt=marker, color=shade_k, capsize=3)
            src.append({"task": task, "scale": e["row"].short, "optim": e["optim"], "loss": e["loss"]})
            src[-1].update(metric=e["metric"], mean=m, ci=[lo, hi])
        chance = next((e["chance"] for e in data[task] if isinstance(e.get("chance"), (int, float))), None)
        if chance is not None:
            ax.axhline(chance, ls="--", color="black", lw=0.8, label=f"chance {chance:.3f}")
        ax.invert_xaxis()  # better models to the right
        ax.set_xlabel("final " + LOSS + " (lower →)")
        ax.set_ylabel(f"{data[task][0]['metric']} (fraction correct)")
        ax.set_title(task, fontsize=10)
        for name in order({e["optim"] for e in data[task]}):
            ax.plot([], [], "o", color=color(name), label=opt_name(name))
        ax.legend(fontsize=7, loc="best")
    rep.figures["accuracy_vs_val_loss"] = src
    save(fig, path, "Downstream accuracy against validation loss (markers: scales, lighter = smaller)")
    return True
