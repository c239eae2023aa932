"""Median tokens/s per (scale, optimizer), with the caveat that concurrent runs share the machine."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from launch.report.markdown_util import opt_name
from launch.report.plot_kit import (
    COLORS,
    color,
    empty,
    figure,
    save,
)


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
