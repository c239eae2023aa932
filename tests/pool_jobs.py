"""Jobs the tests run on the pool of ranks (tests/pool.py): the trainer's own entry points, called in
each rank as torchrun's workers would call them."""

from __future__ import annotations

import os
from typing import Any


def train_runs(argvs: list[list[str]]) -> list[dict[str, Any]]:
    """`train.py ARGV` for each argv in turn (the trainer's `train(cfg)`; in a multi-rank pool the
    runs share the job's process group, as tests/launch/runs_worker.py's runs share torchrun's)."""
    from launch.config import load_config
    from launch.loop import parse_args, train
    from launch.runtime.console import setup_logging

    setup_logging(rank=int(os.environ.get("RANK", "0")))
    out = []
    for argv in argvs:
        args = parse_args(argv)
        out.append(train(load_config(args.config, args.overrides)))
    return out


def train_main(argv: list[str]) -> int:
    """`python train.py ARGV` up to its exit status (user errors become one line and status 2)."""
    from launch.loop import main

    return main(argv)


def train_error(argv: list[str]) -> str | None:
    """The one-line user error `train.py ARGV` stops with on this rank (None if it trains): what
    `launch.loop.main` prints after `error: `, without its console plumbing (tested by real launches)."""
    from launch.config import load_config
    from launch.errors import USER_ERRORS
    from launch.loop import parse_args, train

    args = parse_args(argv)
    try:
        train(load_config(args.config, args.overrides))
    except USER_ERRORS as err:
        return str(err)
    return None
