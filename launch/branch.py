"""`python -m launch.branch`: many token budgets from one warmup-stable-decay run, as cooldown branches.

    python -m launch.branch --parent runs/s2-wsd --budgets 48 96 192 384 [--decay-fraction 0.2 |
        --decay-steps N] [--decay-shape SHAPE] [--out DIR] [--nproc N] [--dry-run]
        [section.key=value ...]

A `optim.schedule=wsd` run holds its peak LR until its own cooldown; every step before a cooldown's
first step is the same whatever the run's length (orscale.schedule). So the run of budget B (a
cooldown of d steps from step B - d) is the parent run up to step B - d, then its own cooldown: each
branch starts from the parent's newest checkpoint at or before B - d (`run.init_from`) in a run
directory of its own (`<out>/budget_<B>`), and trains the rest with the schedule it would have had
from step 0 (train.max_steps=B, optim.wsd.decay_steps=d). The parent's files are only read.

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

This module reads the command's arguments; the plan and its checks are `launch.branch_plan`, imported
once they are read, so that `--help` and a usage error answer before torch is imported.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command's arguments; `budgets` as given (launch.branch_plan.check_flags reads them). An
    override written right after the budgets (`--budgets 64 128 optim.lr=1e-3`) joins the others,
    in the command line's order."""
    parser = argparse.ArgumentParser(prog="python -m launch.branch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--parent", required=True, type=Path, help="the wsd run directory to branch from")
    parser.add_argument("--budgets", required=True, nargs="+", metavar="STEPS", help="train.max_steps of each branch")
    length = parser.add_mutually_exclusive_group()
    length.add_argument(
        "--decay-fraction", type=float, default=None, help="cooldown share of each budget (default: the parent's)"
    )
    length.add_argument(
        "--decay-steps", type=int, default=None, help="cooldown steps of every branch (default: the parent's)"
    )
    parser.add_argument(
        "--decay-shape",
        default=None,
        help="the cooldown's shape, optim.wsd.decay_shape (default: the parent's)",
    )
    parser.add_argument("--out", type=Path, default=None, help="where the branches go (default: <parent>-branches)")
    parser.add_argument("--nproc", type=int, default=1, help="processes per branch (torchrun through launch.launcher)")
    parser.add_argument("--dry-run", action="store_true", help="print each branch's command and run nothing")
    parser.add_argument("overrides", nargs="*", help="more section.key=value for every branch")
    args = parser.parse_intermixed_args(argv)  # overrides before, between and after the flags
    given = sys.argv[1:] if argv is None else argv
    overrides = [*args.overrides, *(b for b in args.budgets if "=" in b)]
    # the command line's order (a later override wins); one given as `--budgets=key=value` goes last
    args.overrides = sorted(overrides, key=lambda o: given.index(o) if o in given else len(given))
    args.budgets = [b for b in args.budgets if "=" not in b]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from launch.branch_plan import run  # torch and the project: seconds to import

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
