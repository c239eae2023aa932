"""The comparison report: tables, significance, LR sensitivity, scaling fits and plots from run logs.

python -m report RUNS_DIR --out REPORT_DIR

Every run directory under RUNS_DIR (config.yaml + metrics.jsonl) is read; report.md, summary.json
and PNGs go to REPORT_DIR. Runs are grouped into *rows* (same model, context, tokens per step,
steps and every other setting that changes the result) and, within a row, by optimizer and LR;
seeds are the repeats. Only finished runs (a final evaluation at train.max_steps) give numbers;
the others are listed under "Unfinished runs".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m report", description=(__doc__ or "").splitlines()[0])
    p.add_argument("runs_dir", type=Path)
    p.add_argument("--out", type=Path, required=True, help="directory for report.md, summary.json and PNGs")
    args = p.parse_args(argv)
    if not args.runs_dir.is_dir():
        print(f"error: runs directory '{args.runs_dir}' not found", file=sys.stderr)
        return 2
    from report.build import build_report  # pandas, scipy and matplotlib: not for --help or a bad path

    summary = build_report(args.runs_dir, args.out)
    print(
        f"report: {args.out / 'report.md'} ({summary['n_runs']} runs, {summary['n_finished']} finished, "
        f"{len(summary['rows'])} table rows)"
    )
    return 0
