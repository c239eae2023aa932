"""The sweep report: tables, significance, LR sensitivity, scaling fits and plots from run logs.

python -m launch.report RUNS_DIR --out REPORT_DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launch.report.build import build_report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.report", description=(__doc__ or "").splitlines()[0])
    p.add_argument("runs_dir", type=Path)
    p.add_argument("--out", type=Path, required=True, help="directory for report.md, summary.json and PNGs")
    args = p.parse_args(argv)
    if not args.runs_dir.is_dir():
        print(f"error: runs directory '{args.runs_dir}' not found", file=sys.stderr)
        return 2
    summary = build_report(args.runs_dir, args.out)
    print(
        f"report: {args.out / 'report.md'} ({summary['n_runs']} runs, {summary['n_finished']} finished, "
        f"{len(summary['rows'])} table rows)"
    )
    return 0
