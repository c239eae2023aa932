"""The report from a runs directory: read every run, group, apply the sweep plan, compute every number
once, draw the figures, write report.md and summary.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from records.points import SweepPlan
from records.read import find_run_dirs, read_run, strict_json
from report import figures, markdown
from report.analysis import Report, analyse
from report.runs import build_rows
from report.selection import apply_plan, group_names
from report.summary import summary


def analyse_dir(runs_dir: Path) -> Report:
    """Every number of the report on the runs under runs_dir (and its sweep plan)."""
    runs = [read_run(p) for p in find_run_dirs(runs_dir)]
    plan = SweepPlan.read(runs_dir)
    rows = build_rows(runs, group_names(runs, runs_dir, plan))
    pending = apply_plan(rows, runs_dir, plan)
    return analyse(runs_dir, runs, rows, plan, pending)


def build_report(runs_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Read every run under runs_dir, write report.md, summary.json and the PNGs to out_dir; return
    the summary (before strict JSON: infinities stay floats)."""
    rep = analyse_dir(runs_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = figures.write_all(rep, out_dir)
    (out_dir / "report.md").write_text(markdown.render(rep, pngs))
    result = summary(rep)
    (out_dir / "summary.json").write_text(json.dumps(strict_json(result), indent=1, allow_nan=False))
    return result
