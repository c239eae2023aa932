"""Downstream evaluation (OLMES ranked classification) of a checkpoint or an HF export, one process.

`python -m launch.evaluation`'s arguments (launch/evaluation/offline.py runs the command): argparse
alone, so that `--help` and a usage error answer before torch and the task code are imported.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m launch.evaluation", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", type=Path, help="step directory, checkpoints root or run directory")
    source.add_argument("--hf", type=Path, help="an HF model directory (e.g. from python -m launch.export)")
    # The names are evals' table (docs/evaluation.md); an unknown one is answered with the list.
    parser.add_argument("--tasks", nargs="+", required=True, metavar="TASK", help="e.g. hellaswag arc_easy piqa")
    parser.add_argument("--shots", type=int, default=0, help="0 or 5 (OLMES rc_0shot / rc_5shot)")
    parser.add_argument("--max-examples", type=int, default=0, help="per task; 0 = all (fixed-seed subsample)")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences (choices) per forward")
    parser.add_argument("--max-len", type=int, default=None, help="default: data.seq_len, or the HF context")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default: see the module docs)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    return parser.parse_args(argv)
