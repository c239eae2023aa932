"""Many budgets from one run, measured on the CPU ladder's budget axis.

    python -m bench.wsd_budgets run [--runs runs/wsd_budgets] [--jobs 2]     # resumable: run it again

s2 of configs/sweeps/cpu_ladder.yaml, the three optimizers at their tuned LRs (docs/results/cpu_ladder),
seeds 1-3, five token budgets (48 / 96 / 192 / 384 / 768 steps of 1,024 tokens), two protocols:

* **cosine** (today's): one run per budget, warmup 10% of it, cosine to 0.1x. The 96 / 192 / 384 runs
  are the ladder's own (docs/results/cpu_ladder/run_logs.tar.xz: unpack it into --ladder); this adds 48
  and 768.
* **wsd**: one 768-step run per (optimizer, seed), warmup 19 steps (the ladder's main budget's), the
  peak, a 1-sqrt cooldown over its last 20% (`--decay-fraction 0.5`: half) to 0.1x, checkpoints at
  the cooldown starts of the shorter budgets; each shorter budget is a cooldown branch from there
  (`python -m launch.branch`), cooling down over the same share of itself.

`python -m bench.wsd_budgets report` then compares them (bench/wsd_report.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from orscale.schedule import WSDOptions

ROOT = Path(__file__).resolve().parent.parent
LADDER = [  # configs/sweeps/cpu_ladder.yaml's overrides and scale s2
    "data.tokenizer=assets/tokenizers/bpe4k_ladder",
    "model.vocab_size=4096",
    "data.seq_len=128",
    "model.max_seq_len=128",
    "data.val_tokens=16384",
    "data.val_batch_size=32",
    "data.piece_bytes=32768",
    "data.logical_shards=8",
    "train.tokens_per_step=1024",
    "train.micro_batch_size=8",
    "train.log_every=8",
    "train.progress=false",
    "optim.min_lr_ratio=0.1",
    "optim.muon.ns_dtype=fp32",
    "parallel.backend=none",
    "model.n_layer=3",
    "model.d_model=96",
    "model.n_head=3",
]
# s2's tuned points (docs/results/cpu_ladder/summary.json): (lr, adamw_lr)
TUNED = {"adamw": (0.002, 0.128), "muon_moonlight": (0.004, 0.064), "orscale_lm": (0.001, 0.064)}
SEEDS = (1, 2, 3)
BUDGETS = (48, 96, 192, 384, 768)
LADDER_BUDGETS = {96: "s2-D0.5", 192: "s2", 384: "s2-D2"}  # the ladder's cosine runs, by label
WSD_TOTAL, WSD_WARMUP = 768, 19
FRACTIONS = (0.2, 0.5)  # the cooldown's share of each budget: Hägele et al.'s 20%, and half


def wsd_dir(fraction: float) -> str:
    """Where the wsd runs of a cooldown share live under --runs (`wsd`: 20%, `wsd-f0.5`: 50%)."""
    return "wsd" if fraction == 0.2 else f"wsd-f{fraction:g}"


@dataclass(frozen=True)
class Job:
    run_dir: Path
    argv: list[str]  # from the project root
    steps: int


def _point(optim: str, seed: int) -> list[str]:
    lr, adamw_lr = TUNED[optim]
    return [f"optim.name={optim}", f"optim.lr={lr}", f"optim.adamw_lr={adamw_lr}", f"train.seed={seed}"]


def _tag(optim: str, seed: int) -> str:
    lr, adamw_lr = TUNED[optim]
    return f"{optim}/lr{lr:g}-alr{adamw_lr:g}-seed{seed}"


def cosine_jobs(runs: Path) -> list[Job]:
    """The budgets the ladder did not run, as the ladder would have: warmup 10%, 16 evaluations."""
    jobs = []
    for budget in (b for b in BUDGETS if b not in LADDER_BUDGETS):
        for optim in TUNED:
            for seed in SEEDS:
                run_dir = runs / f"cosine-{budget}" / _tag(optim, seed)
                cfg = [f"train.max_steps={budget}", f"optim.warmup_steps={round(budget / 10)}"]
                cfg += [f"train.eval_every={max(1, budget // 12)}"]
                args = ["--config", "configs/tiny.yaml", *LADDER, *cfg, *_point(optim, seed), f"run.dir={run_dir}"]
                jobs.append(Job(run_dir, [sys.executable, "train.py", *args], budget))
    return jobs


def branch_starts(fraction: float) -> list[int]:
    """The shorter budgets' cooldown starts: where the wsd parent saves."""
    from orscale import OptimConfig
    from orscale.schedule import decay_steps

    length = OptimConfig(schedule="wsd").with_options(WSDOptions(decay_fraction=fraction))
    return [b - decay_steps(length, b) for b in BUDGETS if b < WSD_TOTAL]


def wsd_jobs(runs: Path, fraction: float) -> list[Job]:
    jobs = []
    for optim in TUNED:
        for seed in SEEDS:
            run_dir = runs / wsd_dir(fraction) / _tag(optim, seed)
            cfg = [f"train.max_steps={WSD_TOTAL}", f"optim.warmup_steps={WSD_WARMUP}", "optim.schedule=wsd"]
            cfg += [f"optim.wsd.decay_fraction={fraction}", "optim.wsd.decay_shape=1-sqrt", "train.eval_every=32"]
            cfg += [f"train.ckpt_at=[{','.join(map(str, branch_starts(fraction)))}]", "run.keep_checkpoints=0"]
            args = ["--config", "configs/tiny.yaml", *LADDER, *cfg, *_point(optim, seed), f"run.dir={run_dir}"]
            jobs.append(Job(run_dir, [sys.executable, "train.py", *args], WSD_TOTAL))
    return jobs


def branch_jobs(runs: Path, fraction: float) -> list[Job]:
    """`python -m launch.branch` for each parent: every shorter budget, in <parent>-branches/."""
    jobs = []
    for parent in wsd_jobs(runs, fraction):
        out = parent.run_dir.with_name(parent.run_dir.name + "-branches")
        budgets = [str(b) for b in BUDGETS if b < WSD_TOTAL]
        argv = [sys.executable, "-m", "launch.branch", "--parent", str(parent.run_dir), "--budgets", *budgets]
        cooldowns = sum(b - s for b, s in zip(BUDGETS[:-1], branch_starts(fraction), strict=True))
        jobs.append(Job(out, [*argv, "--out", str(out)], cooldowns))
    return jobs


def finished(run_dir: Path, steps: int) -> bool:
    """Whether a run (or every branch under a branches directory) reached its last step."""
    metrics = sorted(run_dir.glob("**/metrics.jsonl"))
    if not metrics:
        return False
    last = lambda p: max((json.loads(x).get("step", 0) for x in p.read_text().splitlines() if x.strip()), default=0)  # noqa: E731
    if run_dir.name.endswith("-branches"):
        return len(metrics) == len(BUDGETS) - 1 and all(last(p) == int(p.parent.name.split("_")[1]) for p in metrics)
    return last(metrics[0]) >= steps


def run_all(jobs: list[Job], parallel: int, log_dir: Path) -> None:
    """Every unfinished job, `parallel` at a time, each with one OpenMP thread; logs to log_dir."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    todo = [j for j in jobs if not finished(j.run_dir, j.steps)]
    print(f"{len(jobs) - len(todo)} of {len(jobs)} done; running {len(todo)}, {parallel} at a time", flush=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    running: list[tuple[Job, subprocess.Popen, float]] = []
    while todo or running:
        while todo and len(running) < parallel:
            job = todo.pop(0)
            name = str(job.run_dir.relative_to(log_dir.parent)).replace("/", "__")
            out = open(log_dir / f"{name}.out", "ab")
            running.append((job, subprocess.Popen(job.argv, cwd=ROOT, env=env, stdout=out, stderr=out), time.time()))
        time.sleep(1)
        for item in list(running):
            job, proc, start = item
            if proc.poll() is not None:
                running.remove(item)
                print(f"  {job.run_dir}: exit {proc.returncode} after {time.time() - start:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wsd_budgets")
    parser.add_argument("command", choices=["run", "report"])
    parser.add_argument("--runs", type=Path, default=ROOT / "runs/wsd_budgets")
    parser.add_argument("--ladder", type=Path, default=ROOT / "runs/cpu_ladder", help="the ladder's unpacked runs")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/results/cpu_ladder_wsd")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--decay-fraction", type=float, choices=FRACTIONS, default=0.2, help="the wsd runs to run")
    args = parser.parse_args(argv)
    runs = args.runs.resolve()
    if args.command == "run":
        run_all(wsd_jobs(runs, args.decay_fraction) + cosine_jobs(runs), args.jobs, runs / "logs")
        run_all(branch_jobs(runs, args.decay_fraction), args.jobs, runs / "logs")  # after their parents
        return 0
    from bench.wsd_report import write_report

    write_report(runs, args.ladder.resolve(), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
