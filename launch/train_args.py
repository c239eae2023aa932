"""train.py's command line: `--config` and the dotted overrides. argparse alone, so that train.py reads
it before importing torch and the project (seconds): `--help` and a usage error answer at once."""

from __future__ import annotations

import argparse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """train.py's arguments (`launch.loop.main` reads them); argparse's usage error or help exits."""
    parser = argparse.ArgumentParser(prog="train.py", description="Train the paper's GPT.")
    parser.add_argument("--config", default=None, help="YAML config file (e.g. configs/tiny.yaml)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.name=orscale_lm")
    # The DeepSpeed launcher passes --local_rank; LOCAL_RANK in the environment says the same.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)
