"""Several training runs in one launch, one after another (the 2-rank side of tests that compare
many configurations, and their one-process references). Under torchrun the runs share the process
group; every run is the trainer's own `train(plan)` from the same command-line arguments, seeded on
its own. Starting Python, torch and torchrun costs more than a tiny run itself, so a test module
starts one launch per backend instead of one per configuration.

    [torchrun --nproc_per_node=2] tests/launch/runs_worker.py RUNS.json   # a JSON list of argv lists
"""

from __future__ import annotations

import json
import sys

if __name__ == "__main__":
    from launch.launcher.parent_death import die_with_parent

    die_with_parent()

    from launch.loop import parse_args, train
    from launch.plan import load_plan
    from launch.runtime.console import setup_logging
    from launch.runtime.process_group import shutdown

    setup_logging(rank=0)
    with open(sys.argv[1]) as fh:
        runs = json.load(fh)
    for argv in runs:
        args = parse_args(argv)
        train(load_plan(args.config, args.overrides))
    shutdown()
