"""`python -m launch.branch`: many token budgets from one warmup-stable-decay run, as cooldown branches
(the command, its plan and its checks; the cooldown rule is `launch.sweep.branches.cooldown`, which a
sweep's `branch_of` scales follow too).

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

Everything that can be checked is checked before the plan is printed or a branch starts (one `error:`
line, exit 2): the flags, the parent's config, each branch's config as its train.py will read it, the
parent checkpoint each budget starts from (docs/running.md, "Schedules, and many token budgets from
one run").
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from launch.checkpoint import check_loadable, checkpoint_dirs, is_complete, read_meta
from launch.config import Config, read_config, to_dict
from launch.environment import EnvFacts
from launch.errors import USER_ERRORS, UserError
from launch.plan import load_config, resolve
from launch.run.resume import refuse_incompatible
from launch.sweep.branches import cooldown
from orscale.schedule import WSDOptions, decay_steps

ROOT = Path(__file__).resolve().parent.parent
# The branch's layout is its own launch's (the parent's resolved backend and shard count were its world's).
LAYOUT = ["parallel.backend=auto", "parallel.dp_replicate=1", "parallel.dp_shard=-1"]
# What a branch sets itself, and the flag that sets it (not an override: the plan depends on it).
OWN_KEYS = {
    "train.max_steps": "give each branch's budget with --budgets",
    "optim.decay_steps": "give the cooldown with --decay-steps",
    "optim.decay_fraction": "give the cooldown with --decay-fraction",
    "run.dir": "each branch's directory is <--out>/budget_<B>: give --out",
    "run.init_from": "the plan picks the parent's checkpoint for each budget",
}


@dataclass(frozen=True)
class Branch:
    budget: int  # train.max_steps of the branch
    decay: int  # its cooldown's steps
    start: Path  # the parent checkpoint it starts from (step <= budget - decay)
    run_dir: Path
    note: str = ""  # said beside the plan: e.g. a budget longer than the parent trains stable steps itself

    def overrides(self) -> list[str]:
        """On top of the parent's resolved config.yaml. The launch's own world decides the layout
        (the parent's resolved backend and shard count were its world's), unless given again."""
        return [
            *LAYOUT,
            f"run.dir={self.run_dir}",
            f"run.init_from={self.start}",
            "run.resume=auto",
            f"train.max_steps={self.budget}",
            "optim.schedule=wsd",
            f"optim.decay_steps={self.decay}",
            "optim.decay_fraction=null",
        ]


def parent_config(parent: Path) -> Config:
    """The parent run's config.yaml, read as train.py reads a config (one line for what is wrong)."""
    path = parent / "config.yaml"
    if not path.is_file():
        raise UserError(
            f"--parent '{parent}' holds no config.yaml: give the run directory of a finished or running run"
        )
    return load_config(str(path), LAYOUT)


def plan_branches(
    parent: Path, budgets: list[int], out: Path, fraction: float | None = None, steps: int | None = None
) -> list[Branch]:
    """One Branch per budget, or one UserError line naming what the parent lacks."""
    config = parent_config(parent)
    optim = config.optim
    if optim.schedule != "wsd":
        raise UserError(
            f"the parent run {parent} has optim.schedule={optim.schedule}: cooldown branches need a wsd "
            "parent (its LR is the peak's until its own cooldown); train one with optim.schedule=wsd"
        )
    total = config.train.max_steps
    stable_until = total - decay_steps(optim, total)  # the parent's own cooldown starts here
    # published checkpoints by their directory's step (meta.json is read, and checked, once one is chosen)
    saved = {int(p.name.split("_")[1]): p for p in checkpoint_dirs(parent / "checkpoints") if is_complete(p)}
    if fraction is None and steps is None:  # the parent's own cooldown length (a share of it, or steps)
        own = optim.own(WSDOptions)
        fraction, steps = own.decay_fraction, own.decay_steps
    branches = []
    for budget in budgets:
        decay, first = cooldown(budget, fraction, steps)  # first: the branch's first cooldown step
        if first < optim.warmup_steps:
            raise UserError(
                f"budget {budget}: its cooldown ({decay} steps) would start at step {first}, inside the parent's "
                f"warmup ({optim.warmup_steps} steps); use a longer budget or a shorter cooldown "
                "(--decay-steps / --decay-fraction)"
            )
        usable = [s for s in saved if s <= min(first, stable_until)]
        if not usable:
            raise UserError(
                f"budget {budget}: the parent {parent} has no checkpoint at or before step {min(first, stable_until)} "
                f"(it has {sorted(saved) or 'none'}); train it with train.ckpt_at=[{first}, ...] (a branch then "
                "starts right at its cooldown) and run.keep_checkpoints=0"
            )
        start = max(usable)
        note = ""
        if budget > total:  # past the parent's end: nothing of the parent's covers the steps after `start`
            stable = f"steps {start + 1}-{first} at the peak LR, then " if first > start else ""
            note = (
                f"longer than the parent's {total} steps: from its step {start} the branch trains the rest "
                f"itself, {stable}its cooldown (steps {first + 1}-{budget})"
            )
        branches.append(Branch(budget, decay, saved[start], out / f"budget_{budget}", note))
    return branches


def check_overrides(extra: list[str]) -> None:
    """UserError (one line) for an override of what a branch sets itself or cannot change."""
    for item in extra:
        key, _, value = item.partition("=")
        if key in OWN_KEYS:
            raise UserError(f"{item}: {OWN_KEYS[key]}")
        if key == "optim.schedule" and value.strip() != "wsd":
            raise UserError(
                f"{item}: a cooldown branch runs the parent's wsd schedule with a cooldown of its own; drop it "
                "(a run of another schedule is a run of its own: python train.py)"
            )


def check_branch(parent: Path, branch: Branch, nproc: int, extra: list[str]) -> None:
    """What the branch's train.py would refuse at its start, checked now (one UserError line): its
    config with the user's overrides, on `nproc` processes, and the parent checkpoint it starts from.
    (Its config's warnings, if any, its train.py says.)"""
    cfg = read_config(str(parent / "config.yaml"), [*branch.overrides(), *extra])
    # resolved as the branch's launch will resolve it: parallel.backend=auto, parallel.dp_shard=-1
    launch = dataclasses.replace(EnvFacts.from_env(cfg.train), world_size=nproc, local_world_size=nproc)
    plan = resolve(cfg, launch)
    cfg = plan.cfg
    problem = check_loadable(branch.start)
    if problem is not None:
        raise UserError(
            f"budget {branch.budget} starts from the parent's checkpoint {branch.start}, which is damaged: "
            f"{problem}; restore it from a copy, or give budgets whose cooldown starts at another checkpoint"
        )
    plan.backend.engine_class().check_checkpoint(branch.start, nproc)
    saved = read_meta(branch.start)
    model = dataclasses.asdict(cfg.model.resolve())
    refuse_incompatible(saved, {**saved, "config": to_dict(cfg), "model": model})


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


def check_flags(args: argparse.Namespace) -> None:
    """UserError (one line, naming the flag) for a flag's impossible value."""
    if any(b < 1 for b in args.budgets):
        raise UserError(f"--budgets must be >= 1, got {args.budgets}")
    if args.nproc < 1:
        raise UserError(f"--nproc must be >= 1 (processes per branch), got {args.nproc}")
    if args.decay_fraction is not None and not 0 < args.decay_fraction <= 1:
        raise UserError(
            f"--decay-fraction must be in (0, 1] (the cooldown's share of a budget), got {args.decay_fraction}"
        )
    if args.decay_steps is not None and args.decay_steps < 1:
        raise UserError(f"--decay-steps must be >= 1, got {args.decay_steps}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parent = args.parent.resolve()
    out = (args.out or parent.with_name(f"{parent.name}-branches")).resolve()
    try:  # everything that can be checked, before the plan is printed or a branch starts
        check_flags(args)
        check_overrides(args.overrides)
        branches = plan_branches(parent, sorted(set(args.budgets)), out, args.decay_fraction, args.decay_steps)
        for branch in branches:
            check_branch(parent, branch, args.nproc, args.overrides)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    failed = 0
    for branch in branches:
        argv_b = branch_argv(parent, branch, args.nproc, args.overrides)
        note = f"\n  note: {branch.note}" if branch.note else ""
        print(
            f"budget {branch.budget}: cooldown of {branch.decay} steps from {branch.start}{note}\n  {' '.join(argv_b)}"
        )
        if not args.dry_run:
            failed += subprocess.run(argv_b, cwd=ROOT, env=env).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
