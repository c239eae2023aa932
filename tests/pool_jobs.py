"""Jobs the tests run on the pool of ranks (tests/pool.py): the trainer's own entry points, called in
each rank as torchrun's workers would call them."""

from __future__ import annotations

import os
from typing import Any


def train_runs(argvs: list[list[str]]) -> list[dict[str, Any]]:
    """`train.py ARGV` for each argv in turn (the trainer's `train(plan)`; in a multi-rank pool the
    runs share the job's process group, as tests/launch/runs_worker.py's runs share torchrun's)."""
    from launch.loop import parse_args, train
    from launch.plan import load_plan
    from launch.runtime.console import setup_logging

    setup_logging(rank=int(os.environ.get("RANK", "0")))
    out = []
    for argv in argvs:
        args = parse_args(argv)
        out.append(train(load_plan(args.config, args.overrides)))
    return out


def train_runs_side_by_side(argvs_by_rank: list[list[list[str]]]) -> list[dict[str, Any]]:
    """Pool rank r runs `train_runs(argvs_by_rank[r])`, each in a process of its own and no group
    (run with group=False): independent runs two at a time on two cores."""
    return train_runs(argvs_by_rank[int(os.environ["POOL_RANK"])])


def train_error(argv: list[str]) -> str | None:
    """The one-line user error `train.py ARGV` stops with on this rank (None if it trains): what
    `launch.loop.main` prints after `error: `, without its console plumbing (tested by real launches)."""
    from launch.errors import USER_ERRORS
    from launch.loop import parse_args, train
    from launch.plan import load_plan

    args = parse_args(argv)
    try:
        train(load_plan(args.config, args.overrides))
    except USER_ERRORS as err:
        return str(err)
    return None
