"""The kit the report's figures are drawn with (report/figures.py draws them): fixed colours per
optimizer (scales are shades of it, lighter = smaller, with their own markers), axes, margins and
saving (matplotlib's Figure + Agg canvas: no pyplot, no display)."""

from __future__ import annotations

import math
import textwrap
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colors as mcolors
from matplotlib import ticker
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from report.fmt import human

COLORS = {"adamw": "#1f77b4", "muon_moonlight": "#ff7f0e", "orscale_lm": "#2ca02c", "orscale_lm_transfer": "#98df8a"}
_OTHER = ["#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
MARKERS = "osD^vP*Xh"
LOSS = "val loss (nats/token)"
LABEL_EVERY_DECADE_ONLY = 3.0
PANEL_TITLE_LINE = 0.17  # inches per line of a panel title (9–10 pt)


def color(name: str) -> str:
    """An optimizer's colour: fixed for the three compared, stable (name-hashed) for the others."""
    return COLORS.get(name.split("#")[0]) or _OTHER[zlib.crc32(name.encode()) % len(_OTHER)]


def shade(name: str, k: int, n: int) -> tuple:
    """The k-th of n scales in the optimizer's colour: the smallest lightest, the largest full."""
    rgb = np.array(mcolors.to_rgb(color(name)))
    t = 0.0 if n <= 1 else 0.45 * (1 - k / (n - 1))  # the lightest stays readable on white
    return tuple(rgb + (1 - rgb) * t)


def figure(n: int, w: float = 4.6, h: float = 3.4, cols: int = 3) -> tuple[Figure, list]:
    cols = min(cols, max(n, 1))
    rows = max(1, math.ceil(n / cols))
    fig = Figure(figsize=(w * cols, h * rows))
    return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(max(n, 1))]


def empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=10, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def save(
    fig: Figure, path: Path, title: str | None = None, right: float = 0.2, bottom: float = 0.6, dpi: int = 90
) -> None:
    """Fixed margins in inches (so they suit any grid) rather than tight_layout, whose text-extent
    passes cost more than the drawing itself; `right`/`bottom` make room for an outside legend. The
    top margin holds the title's lines and the top row's panel titles past their first line."""
    w, h = fig.get_size_inches()
    lines = textwrap.wrap(title, max(30, int(w * 10))) if title else []  # ~10 characters per inch at 11 pt
    top = 0.35 + 0.2 * len(lines) if lines else 0.3
    top += PANEL_TITLE_LINE * max((_title_lines(ax) - 1 for ax in fig.axes if _top_row(ax)), default=0)
    fig.subplots_adjust(left=0.85 / w, right=1 - right / w, bottom=bottom / h, top=1 - top / h, wspace=0.32, hspace=0.5)
    if lines:
        fig.suptitle("\n".join(lines), fontsize=11, y=1 - 0.12 / h, va="top")
    FigureCanvasAgg(fig)
    panels = " | ".join(t.replace("\n", " ") for ax in fig.axes if (t := ax.get_title()))
    fig.savefig(path, dpi=dpi, metadata={"Title": " ".join(lines), "Description": panels})  # the PNG says what it shows


def _title_lines(ax: Any) -> int:
    titles = [ax.get_title(loc) for loc in ("center", "left", "right")]
    return max((t.count("\n") + 1 for t in titles if t), default=1)


def _top_row(ax: Any) -> bool:
    spec = ax.get_subplotspec()
    return spec is None or spec.is_first_row()


def log_axis(axis: Any, decades: float = 0.0) -> None:
    """A log axis labelled at 1, 2 and 5 × each decade as plain numbers (a range shorter than a
    decade still gets labels), no minor labels: the default ones on a short range are most of the
    drawing time and crowd the panel. An axis spanning more than `LABEL_EVERY_DECADE_ONLY` decades
    (its caller says how many) is labelled at each decade only: three labels a decade collide there."""
    subs = (1.0,) if decades > LABEL_EVERY_DECADE_ONLY else (1.0, 2.0, 5.0)
    axis.set_major_locator(ticker.LogLocator(base=10, subs=subs, numticks=12))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.3g}".replace("e+", "e")))
    axis.set_minor_formatter(ticker.NullFormatter())


def n_axis(ax: Any, ns: list[float]) -> None:
    """A log x axis of parameter counts, ticked at the scales plotted (a few scales within one or
    two decades would otherwise get one or two labels)."""
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(ticker.FixedLocator(sorted(set(ns))))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: human(v)))
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.set_xlim(min(ns) / 1.25, max(ns) * 1.25)


def eval_curve(runs: list) -> tuple[np.ndarray, np.ndarray] | None:
    """(tokens, [seeds, points] val loss) on the steps every run evaluated."""
    curves = [{ev["step"]: (ev.get("tokens"), ev.get("val_loss")) for ev in r.evals} for r in runs]
    steps = sorted(set.intersection(*[set(c) for c in curves])) if curves else []
    if not steps:
        return None
    x = np.array([curves[0][s][0] or 0 for s in steps], float)
    y = np.array([[c[s][1] if isinstance(c[s][1], (int, float)) else np.nan for s in steps] for c in curves], float)
    return x, y


def clip_top(ax: Any, ys: list[np.ndarray], xs: list[np.ndarray]) -> bool:
    """Cut the y axis at the highest loss after the first 15% of training, so the end (where the
    optimizers differ) is readable; True when some loss drawn lies above the cut."""
    late = [y[:, x >= 0.15 * x.max()] for x, y in zip(xs, ys, strict=True) if x.size and np.isfinite(y).any()]
    vals = np.concatenate([v.ravel() for v in late]) if late else np.array([])
    vals = vals[np.isfinite(vals)]
    if not vals.size:
        return False
    lo, hi = float(vals.min()), float(vals.max())
    pad = 0.05 * (hi - lo or 0.1)
    ax.set_ylim(lo - pad, hi + pad)
    drawn = np.concatenate([y.ravel() for y in ys]) if ys else np.array([])
    return bool(np.any(drawn[np.isfinite(drawn)] > hi + pad))


def fit_ylim(ax: Any, curves: list[list[float]]) -> bool:
    """Keep the axis on the finite losses near the optima (a diverged or far-off LR would squash the
    rest): up to the 90th percentile. True when some point is off the top."""
    vals = np.array([v for c in curves for v in c if isinstance(v, (int, float)) and math.isfinite(v)])
    if not vals.size:
        return False
    lo, hi = float(vals.min()), float(np.percentile(vals, 90))
    pad = 0.08 * (hi - lo or 0.1)
    ax.set_ylim(lo - pad, hi + pad)
    return bool(np.any(vals > hi + pad)) or len(vals) < sum(len(c) for c in curves)
