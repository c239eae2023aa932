"""Compare runs: final validation loss per run, and mean ± std over seeds per (model, optimizer).

    python -m launch.compare runs/tiny-* [--markdown]

Reads each run directory's config.yaml and metrics.jsonl, so every number in the table can be
traced to its log.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml


def summarize_run(run_dir: Path) -> dict[str, Any]:
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    vals = [m for m in lines if "val_loss" in m]
    if not vals:
        raise ValueError(f"{run_dir} has no validation line in metrics.jsonl")
    return {"run": run_dir.name, "model": cfg["model"]["preset"], "optim": cfg["optim"]["name"],
            "seed": cfg["train"]["seed"], "step": vals[-1]["step"], "tokens": vals[-1]["tokens"],
            "val_loss": vals[-1]["val_loss"]}


def group(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for r in rows:
        groups[(r["model"], r["optim"], r["step"])].append(r["val_loss"])
    out = []
    for (model, optim, step), losses in sorted(groups.items()):
        std = statistics.stdev(losses) if len(losses) > 1 else float("nan")
        out.append({"model": model, "optim": optim, "step": step, "seeds": len(losses),
                    "mean": statistics.fmean(losses), "std": std, "min": min(losses), "max": max(losses)})
    return out


def table(rows: list[dict[str, Any]], keys: list[str]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    rows = [summarize_run(p) for p in args.runs if (p / "metrics.jsonl").is_file()]
    print(table(rows, ["run", "model", "optim", "seed", "step", "tokens", "val_loss"]))
    print()
    print(table(group(rows), ["model", "optim", "step", "seeds", "mean", "std", "min", "max"]))


if __name__ == "__main__":
    main()
