"""python -m launch.dryrun --config configs/1.1b.yaml --world 64 [--replicate 8] [--backend fsdp|ddp]
[key=value ...]: one rank of that world set up and stepped in this process, on a fake process group
and fake tensors; prints parameter, gradient and optimizer-state bytes, Newton–Schulz FLOPs and
owner-exchange bytes of every rank (min / mean / max), all collective bytes per step, the
micro-batch's activations and the steady-state peak (docs/scaling.md, "The dry run").

    python -m launch.dryrun --table [--sizes 125m 1.1b] [--worlds 8 64 512] [key=value ...]

prints the table of docs/scaling.md: every size, world and layout (FSDP2; HSDP with a node of
--gpus-per-node ranks per shard group; DDP), each run as a user would launch it (`batch_for`).
"""

from __future__ import annotations

import argparse
import logging
import sys

from launch.backends.registry import BACKENDS
from launch.dryrun.fake_world import check_world
from launch.dryrun.measure import dry_run
from launch.dryrun.report import LAYOUTS, TABLE_HEAD, TABLE_NOTE, batch_for, describe, table_row, unsupported_rows
from launch.errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m launch.dryrun", description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="the run's YAML (configs/*.yaml)")
    ap.add_argument("--world", type=int, help="ranks (GPUs) of the run")
    ap.add_argument(
        "--replicate", type=int, default=1, help="HSDP replica groups (parallel.dp_replicate; 1: FSDP2 over the world)"
    )
    ap.add_argument(
        "--backend",
        choices=[name for name, cls in BACKENDS.items() if cls.many_processes],
        help="parallel.backend (default: the config's)",
    )
    ap.add_argument("--rank", type=int, default=0, help="the rank that is set up and stepped (default 0)")
    ap.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node (torchrun's LOCAL_WORLD_SIZE)")
    ap.add_argument("--table", action="store_true", help="the table of docs/scaling.md instead of one run")
    ap.add_argument("--sizes", nargs="+", default=["125m", "1.1b"], help="--table: configs/<size>.yaml")
    ap.add_argument("--worlds", type=int, nargs="+", default=[8, 64, 512], help="--table: world sizes")
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value (as train.py takes them)")
    return ap


def _table(args: argparse.Namespace) -> None:
    print(TABLE_HEAD, flush=True)
    for size in args.sizes:
        config = f"configs/{size}.yaml"
        for world in args.worlds:
            for backend, replicated in LAYOUTS:
                replicate = world // args.gpus_per_node if replicated else 1
                if replicated and replicate < 2:
                    continue  # one node: HSDP is FSDP2
                overrides = [*batch_for(config, world), *args.overrides]
                run = dry_run(
                    config,
                    world,
                    replicate=replicate,
                    backend=backend,
                    overrides=overrides,
                    gpus_per_node=args.gpus_per_node,
                )
                print(table_row(run), flush=True)
    print("\n" + "\n".join([TABLE_NOTE, *unsupported_rows()]))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        if args.table:
            for world in args.worlds:
                check_world(world, gpus_per_node=args.gpus_per_node, flag="--worlds")
            _table(args)
            return 0
        if args.config is None or args.world is None:
            raise ConfigError("--config and --world are required (or --table)")
        run = dry_run(
            args.config,
            args.world,
            replicate=args.replicate,
            backend=args.backend,
            rank=args.rank,
            overrides=args.overrides,
            gpus_per_node=args.gpus_per_node,
        )
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(describe(run))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
