"""The real ranks' side of tests/launch/test_dryrun.py (`real_step`, a job for the pool of ranks):
the dry run's own measurement (`launch.dryrun.measure.step_rank`) on a real gloo group and real
tensors, so the fake world's figures can be compared with these rank by rank."""

from __future__ import annotations

import dataclasses
import json
import os

import torch
import torch.distributed as dist

from launch.dryrun.fake_world import CollectiveLog
from launch.dryrun.measure import step_rank


def real_step(config: str, overrides: list[str], backend: str, replicate: int = 1) -> dict:
    """This rank set up and stepped for real, measured as the dry run measures (JSON-able)."""
    torch.set_num_threads(1)
    world, rank = dist.get_world_size(), dist.get_rank()
    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    log = CollectiveLog()
    with log:
        run = step_rank(config, world, rank, log, replicate=replicate, backend=backend, overrides=overrides)
    return json.loads(json.dumps(dataclasses.asdict(run)))
