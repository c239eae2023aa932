"""Does today's code, with optim.adamw_lr unset, reproduce the shared-LR ladder bit for bit?

    python -m bench.compare_shared_ladder [--old docs/results/cpu_ladder_shared_lr/summary.json]
                                          [--runs runs/cpu_ladder]

The old ladder (one LR for the matrices and the AdamW group) kept its per-LR means in summary.json.
The new ladder's search starts with the same grid tied (`lr{X}-seed0`) and scores the shared point
on seeds 1-3 again (`lr{X}-seed{1,2,3}`). For every (scale, optimizer, LR) whose old mean came from
the same seeds as the new cells, prints both losses and their difference; exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from records.read import read_run

ROOT = Path(__file__).resolve().parent.parent


def _new_losses(runs: Path, scale: str, opt: str, lr: str) -> dict[int, float]:
    """seed -> final val loss of the new ladder's tied cells at this LR (finished runs only)."""
    out: dict[int, float] = {}
    for seed in range(4):
        path = runs / scale / opt / f"lr{lr}-seed{seed}"
        if path.is_dir():
            run = read_run(path)
            if run.final_val is not None:
                out[seed] = run.final_val
    return out


def compare(old_summary: Path, runs: Path) -> tuple[list[tuple], int]:
    rows, mismatches = [], 0
    for row in json.loads(old_summary.read_text())["rows"]:
        for opt, group in row["groups"].items():
            for lr, cell in group["by_lr"].items():
                new = _new_losses(runs, row["scale"], opt, lr)
                # n=1: the search's seed-0 cell; n=4: seed 0 plus the three scoring seeds.
                wanted = [0] if cell["n"] == 1 else [0, *group["seeds"]]
                if cell["n"] != len(wanted) or any(s not in new for s in wanted):
                    continue
                mean = sum(new[s] for s in wanted) / len(wanted)
                diff = mean - cell["mean"]
                mismatches += diff != 0.0
                rows.append((row["name"], opt, lr, cell["n"], cell["mean"], mean, diff))
    return rows, mismatches


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, default=ROOT / "docs/results/cpu_ladder_shared_lr/summary.json")
    ap.add_argument("--runs", type=Path, default=ROOT / "runs/cpu_ladder")
    args = ap.parse_args(argv)
    rows, mismatches = compare(args.old, args.runs)
    print(f"{'row':34s} {'optimizer':15s} {'lr':>8s} {'n':>2s} {'old':>10s} {'new':>10s} {'new-old':>10s}")
    for name, opt, lr, n, old, new, diff in rows:
        print(f"{name:34s} {opt:15s} {lr:>8s} {n:2d} {old:10.6f} {new:10.6f} {diff:+10.2e}")
    print(f"{len(rows)} cells compared, {mismatches} differ")
    return 1 if mismatches or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
