"""Cooldown branches: many token budgets from one warmup-stable-decay run.

    python -m launch.branch --parent runs/s2-wsd --budgets 48 96 192 384 [--decay-fraction 0.2 |
        --decay-steps N] [--out DIR] [--nproc N] [--dry-run] [section.key=value ...]

A `optim.schedule=wsd` run holds its peak LR until its own cooldown; every step before a cooldown's
first step is the same whatever the run's length (orscale.schedule). So the run of budget B (a
cooldown of d steps from step B - d) is the parent run up to step B - d, then its own cooldown: each
branch starts from the parent's newest checkpoint at or before B - d (`run.init_from`) in a run
directory of its own (`<out>/budget_<B>`), and trains the rest with the schedule it would have had
from step 0 (train.max_steps=B, optim.decay_steps=d). The parent's files are only read.

A branch is a run like any other: its config.yaml (`run.init_from`) and run.log name the checkpoint it
started from, it resumes from its own checkpoints (the same command again: a killed branch continues,
a finished one is skipped), and it runs under any backend (`--nproc`, `parallel.backend=...`; the
parent's layout is not inherited), as checkpoints move between them.
Give the parent checkpoints at every B - d (`train.ckpt_at=[...]`, or at least before it:
`train.ckpt_every`), and `run.keep_checkpoints=0` so none is pruned.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from launch.checkpoint import checkpoint_dirs, read_meta
from launch.errors import USER_ERRORS, UserError
from orscale import OptimConfig
from orscale.schedule import decay_steps

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Branch:
    budget: int  # train.max_steps of the branch
    decay: int  # its cooldown's steps
    start: Path  # the parent checkpoint it starts from (step <= budget - decay)
    run_dir: Path

    def overrides(self) -> list[str]:
        """On top of the parent's resolved config.yaml. The launch's own world decides the layout
        (the parent's resolved backend and shard count were its world's), unless given again."""
        return [
            "parallel.backend=auto",
            "parallel.dp_replicate=1",
            "parallel.dp_shard=-1",
            f"run.dir={self.run_dir}",
            f"run.init_from={self.start}",
            "run.resume=auto",
            f"train.max_steps={self.budget}",
            "optim.schedule=wsd",
            f"optim.decay_steps={self.decay}",
            "optim.decay_fraction=null",
        ]


def plan_branches(
    parent: Path, budgets: list[int], out: Path, fraction: float | None = None, steps: int | None = None
) -> list[Branch]:
    """One Branch per budget, or one UserError line naming what the parent lacks."""
    config_path = parent / "config.yaml"
    if not config_path.is_file():
        raise UserError(
            f"--parent '{parent}' holds no config.yaml: give the run directory of a finished or running run"
        )
    config = yaml.safe_load(config_path.read_text())
    optim = OptimConfig(**config["optim"])
    if optim.schedule != "wsd":
        raise UserError(
            f"the parent run {parent} has optim.schedule={optim.schedule}: cooldown branches need a wsd "
            "parent (its LR is the peak's until its own cooldown); train one with optim.schedule=wsd"
        )
    total = int(config["train"]["max_steps"])
    stable_until = total - decay_steps(optim, total)  # the parent's own cooldown starts here
    saved = {read_meta(p)["step"]: p for p in checkpoint_dirs(parent / "checkpoints") if (p / "meta.json").is_file()}
    if fraction is None and steps is None:  # the parent's own cooldown length (a share of it, or steps)
        fraction, steps = optim.decay_fraction, optim.decay_steps
    branches = []
    for budget in budgets:
        length = OptimConfig(schedule="wsd", decay_fraction=fraction, decay_steps=steps)
        decay = decay_steps(length, budget)
        first = budget - decay  # the branch's first cooldown step
        if first < optim.warmup_steps:
            raise UserError(
                f"budget {budget}: its cooldown ({decay} steps) would start at step {first}, inside the parent's "
                f"warmup ({optim.warmup_steps} steps); use a longer budget or a shorter cooldown"
            )
        usable = [s for s in saved if s <= min(first, stable_until)]
        if not usable:
            raise UserError(
                f"budget {budget}: the parent {parent} has no checkpoint at or before step {min(first, stable_until)} "
                f"(it has {sorted(saved) or 'none'}); train it with train.ckpt_at=[{first}, ...] (a branch then "
                "starts right at its cooldown) and run.keep_checkpoints=0"
            )
        branches.append(Branch(budget, decay, saved[max(usable)], out / f"budget_{budget}"))
    return branches


def branch_argv(parent: Path, branch: Branch, nproc: int, extra: list[str]) -> list[str]:
    """The branch's train.py command (from the project root): the parent's resolved config, then the
    branch's own settings, then the user's overrides."""
    args = ["train.py", "--config", str(parent / "config.yaml"), *branch.overrides(), *extra]
    if nproc > 1:
        return [sys.executable, "-m", "launch.launcher", "--standalone", f"--nproc_per_node={nproc}", *args]
    return [sys.executable, *args]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m launch.branch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--parent", required=True, type=Path, help="the wsd run directory to branch from")
    parser.add_argument("--budgets", required=True, type=int, nargs="+", help="train.max_steps of each branch")
    length = parser.add_mutually_exclusive_group()
    length.add_argument(
        "--decay-fraction", type=float, default=None, help="cooldown share of each budget (default: the parent's)"
    )
    length.add_argument(
        "--decay-steps", type=int, default=None, help="cooldown steps of every branch (default: the parent's)"
    )
    parser.add_argument("--out", type=Path, default=None, help="where the branches go (default: <parent>-branches)")
    parser.add_argument("--nproc", type=int, default=1, help="processes per branch (torchrun through launch.launcher)")
    parser.add_argument("--dry-run", action="store_true", help="print each branch's command and run nothing")
    parser.add_argument("overrides", nargs="*", help="more section.key=value for every branch")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parent = args.parent.resolve()
    out = (args.out or parent.with_name(f"{parent.name}-branches")).resolve()
    try:
        if any(b < 1 for b in args.budgets):
            raise UserError(f"--budgets must be >= 1, got {args.budgets}")
        branches = plan_branches(parent, sorted(set(args.budgets)), out, args.decay_fraction, args.decay_steps)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    failed = 0
    for branch in branches:
        argv_b = branch_argv(parent, branch, args.nproc, args.overrides)
        print(f"budget {branch.budget}: cooldown of {branch.decay} steps from {branch.start}\n  {' '.join(argv_b)}")
        if not args.dry_run:
            failed += subprocess.run(argv_b, cwd=ROOT, env=env).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
