"""Every figure of the report, written by `write_all`: one module per figure, named after it
(plot_curves, plot_params, plot_lr, plot_diagnostics, plot_throughput, plot_flops, plot_downstream,
plot_efficiency); the shared kit (colours, axes, saving) is plot_kit.py."""

from __future__ import annotations

from pathlib import Path

from launch.report import (
    plot_curves,
    plot_diagnostics,
    plot_downstream,
    plot_efficiency,
    plot_flops,
    plot_lr,
    plot_params,
    plot_throughput,
)
from launch.report.analysis import ordered_rows
from launch.report.plot_kit import EXTRA, FILES
from launch.report.series import main_series


def write_all(ctx: dict, out_dir: Path) -> dict[str, str]:
    """Write every figure; returns kind -> file name (relative to out_dir, for report.md)."""
    rows = ordered_rows(ctx["rows"])
    series = max(main_series(ctx["rows"]).values(), key=len, default=[])
    out = dict(FILES)
    plot_curves.plot_curves(ctx, rows, out_dir / FILES["curves"])
    plot_params.plot_params(ctx, out_dir / FILES["params"])
    plot_lr.plot_lr(ctx, out_dir / FILES["lr"])
    plot_diagnostics.plot_diag(ctx, series or rows, out_dir / FILES["diag"])
    plot_throughput.plot_throughput(ctx, rows, out_dir / FILES["throughput"])
    extra = {
        "flops": lambda p: plot_flops.plot_flops(ctx, series, p),
        "diag_scales": lambda p: plot_diagnostics.plot_diag_scales(ctx, series, p),
        "downstream": lambda p: plot_downstream.plot_downstream(ctx, p),
        "efficiency": lambda p: plot_efficiency.plot_efficiency(ctx, p),
        "lr_grid": lambda p: plot_lr.plot_lr_grid(ctx, rows, p),
    }
    for kind, draw in extra.items():
        path = out_dir / EXTRA[kind]
        if draw(path):
            out[kind] = EXTRA[kind]
        elif path.exists():
            path.unlink()  # a figure from an earlier report that has nothing to show now
    return out
