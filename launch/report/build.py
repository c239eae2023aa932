"""The sweep report: tables, significance, LR sensitivity, scaling fits and plots from run logs.

    python -m launch.report RUNS_DIR --out REPORT_DIR

Every run directory under RUNS_DIR (config.yaml + metrics.jsonl) is read; report.md, summary.json
and PNGs go to REPORT_DIR. Runs are grouped into *rows* (same model, context, tokens per step,
steps and every other setting that changes the result) and, within a row, by optimizer and LR;
seeds are the repeats. Only finished runs (a final evaluation at train.max_steps) give numbers;
the others are listed under "Unfinished runs".
"""

from __future__ import annotations

import json
from pathlib import Path

from launch.report import analysis, figures, markdown, protocols, sections, selection
from launch.report.markdown_util import strict_json
from launch.report.rows import PAPER, REFS, build_rows
from launch.report.series import data_efficiency, scaling_points, usable
from launch.report.stats import BOOT_RESAMPLES, PowerFit, compare, fit_power_law
from launch.run.records import find_run_dirs, read_run


def build_report(runs_dir: Path, out_dir: Path) -> dict:
    """Read every run under runs_dir, write report.md, summary.json and the PNGs; return the summary."""
    runs = [read_run(p) for p in find_run_dirs(runs_dir)]
    plan = selection.read_plan(runs_dir)
    rows = build_rows(runs, selection.group_names(runs, runs_dir, plan))
    pending = selection.apply_plan(rows, runs_dir, plan)
    points = scaling_points(rows)
    fits: dict[tuple[str, str], PowerFit | None] = {
        k: fit_power_law([n for n, _, _ in v], [loss for _, loss, _ in v]) for k, v in points.items()
    }
    efficiency = data_efficiency(rows)
    comparisons = {}
    for row in rows:
        for name, g in row.groups.items():
            for ref in REFS:
                # AdamW vs Muon+Moonlight is Muon+Moonlight vs AdamW with the sign flipped: listed once.
                if ref != name and ref in row.groups and not (name in REFS and REFS.index(name) < REFS.index(ref)):
                    both = usable(g) and usable(row.groups[ref])
                    comparisons[(row.name, name, ref)] = (
                        compare(g.score.losses, row.groups[ref].score.losses) if both else None
                    )
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = dict(
        runs_dir=runs_dir,
        runs=runs,
        rows=rows,
        plan=plan,
        pending=pending,
        points=points,
        fits=fits,
        efficiency=efficiency,
        comparisons=comparisons,
        paper=PAPER,
        resamples=BOOT_RESAMPLES,
    )
    ctx["headline"] = analysis.headline(ctx)
    ctx["protocols"] = protocols.analyse(rows)
    ctx["downstream"] = sections.downstream_table(ctx)  # the table and its figure
    ctx["figures"] = {}  # figure name -> the numbers it plots (summary.json)
    pngs = figures.write_all(ctx, out_dir)
    (out_dir / "report.md").write_text(markdown.render(ctx, pngs))
    summary = markdown.summary_json(ctx)
    (out_dir / "summary.json").write_text(json.dumps(strict_json(summary), indent=1, default=str, allow_nan=False))
    return summary
