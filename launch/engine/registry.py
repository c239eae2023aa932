"""Which engine runs which `parallel.backend`. DeepSpeed is imported only when a ZeRO backend is
asked for, so a machine without it runs every other backend."""

from __future__ import annotations

from typing import Any

import torch

from launch.config import ParallelConfig, TrainConfig
from launch.engine.base import Engine
from launch.runtime.process_group import DistEnv
from models import GPTConfig
from orscale import OptimConfig


def engine_class(backend: str) -> type[Engine]:
    """The Engine implementation for `parallel.backend`."""
    if backend in ("zero1", "zero2"):
        from launch.engine.deepspeed_engine import DeepSpeedEngine

        return DeepSpeedEngine
    from launch.engine.torch_engine import TorchEngine

    return TorchEngine


def build_engine(
    model_cfg: GPTConfig,
    parallel: ParallelConfig,
    optim: OptimConfig,
    train: TrainConfig,
    env: DistEnv,
    dtype: torch.dtype,
    accum_steps: int,
    **kwargs: Any,
) -> Engine:
    """The engine of `parallel.backend`, built (collective on every rank)."""
    return engine_class(parallel.backend)(model_cfg, parallel, optim, train, env, dtype, accum_steps, **kwargs)
