"""The validation loss of a live model: the fixed validation set's mean cross-entropy, split over
ranks, the same number whatever the world size (`launch.loop` calls it at the validation steps)."""

from __future__ import annotations

import math

import torch

from launch.engine.base import Engine
from launch.runtime.process_group import DistEnv, all_reduce_sum


@torch.no_grad()
def validation_loss(engine: Engine, val: torch.Tensor, batch_size: int, env: DistEnv) -> float:
    """Mean cross-entropy over every target token of the fixed validation set, split over ranks. Every rank runs
    the same number of forward passes (a sharded model gathers weights inside forward), padding its share with
    repeats of weight 0, so the result does not depend on the world size."""
    engine.module.eval()
    mine = val[env.rank :: env.world_size]
    per_rank = math.ceil(len(val) / env.world_size)
    total = torch.tensor([0.0, 0.0], device=env.device, dtype=torch.float64)  # [sum of losses, tokens]
    for start in range(0, per_rank, batch_size):
        batch = mine[start : start + batch_size]
        weight = len(batch)
        batch = (batch if weight else val[:1]).to(env.device)
        with engine.autocast():
            loss = engine.module(batch[:, :-1], batch[:, 1:])
        n = weight * (batch.shape[1] - 1)
        total += torch.stack([loss.double() * n, torch.tensor(n, device=env.device, dtype=torch.float64)])
    all_reduce_sum(total)
    engine.module.train()
    return (total[0] / total[1]).item()
