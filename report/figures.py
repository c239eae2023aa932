"""The report's figures: `write_all` draws each one (report/figures_training.py: curves, compute,
diagnostics; report/figures_scaling.py: LR, both LRs, scaling, data efficiency, downstream) with the
kit of report/plots.py, and each records the numbers it plots in `Report.figures` (summary.json)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from report import figures_scaling as sc
from report import figures_training as tr

FILES = {  # kind -> file; the last three are drawn only when the logs have something to show
    "curves": "val_loss_vs_tokens.png",
    "params": "loss_vs_params.png",
    "lr": "loss_vs_lr.png",
    "diag": "muon_diagnostics.png",
    "downstream": "accuracy_vs_val_loss.png",
    "efficiency": "data_efficiency.png",
    "lr_grid": "loss_vs_both_lrs.png",
}


def write_all(rep: Any, out_dir: Path) -> dict[str, str]:
    """Draw every figure into out_dir; returns kind -> file name (relative to out_dir, for report.md)."""
    drawers: dict[str, Callable[[Any, Path], Any]] = {
        "curves": tr.curves,
        "params": sc.params,
        "lr": sc.lr,
        "diag": tr.diagnostics,
        "downstream": sc.downstream,
        "efficiency": sc.efficiency,
        "lr_grid": sc.lr_grid,
    }
    out = {}
    for kind, draw in drawers.items():
        if draw(rep, out_dir / FILES[kind]) is False:
            (out_dir / FILES[kind]).unlink(missing_ok=True)  # an earlier report's figure with nothing to show now
        else:
            out[kind] = FILES[kind]
    return out
