"""Parallelism applied from outside the model (torchtitan's way): FSDP2 or DDP, activation
checkpointing and per-block torch.compile. The model code never knows. Used by the engines."""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch
import torch.nn as nn

from launch.config import ParallelConfig
from launch.distributed import DistEnv
from models import GPT, GPTConfig


def build_model(model_cfg: GPTConfig, parallel: ParallelConfig, seed: int, env: DistEnv,
                dtype: torch.dtype = torch.float32) -> GPT:
    """Construct, shard (FSDP2) and initialise the GPT.

    FSDP2 with `parallel.meta_init` builds on the meta device and initialises each rank's shard
    after `fully_shard`, so a 1.1B model is never whole on one rank. Without it, every rank
    initialises the full model from the same seed before sharding: the weights then equal a
    single-process run's, which the equality tests need.
    """
    torch.manual_seed(seed)
    if parallel.backend == "fsdp" and parallel.meta_init:
        with torch.device("meta"):
            model = GPT(model_cfg)
        _apply(model, parallel, env, dtype)
        model.to_empty(device=env.device)
        model.init_weights()
        return model
    with torch.device(env.device):
        model = GPT(model_cfg)
    _apply(model, parallel, env, dtype)
    return model


def _apply(model: GPT, parallel: ParallelConfig, env: DistEnv, dtype: torch.dtype) -> None:
    if parallel.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for i, block in enumerate(model.blocks):
            model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False)
    if parallel.compile:
        for block in model.blocks:
            block.compile()
    if parallel.backend == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # bf16 compute with fp32 gradient reduction; the fp32 sharded params are the master weights.
        # (bf16 params on CUDA only: gloo's CPU collectives are the test path and stay fp32.)
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if dtype == torch.bfloat16 and env.device.type == "cuda" else MixedPrecisionPolicy())
        for block in model.blocks:
            # The last block's params are needed right away in backward: don't reshard them.
            fully_shard(block, mp_policy=mp, reshard_after_forward=block is not model.blocks[-1])
        fully_shard(model, mp_policy=mp)


def wrap_ddp(model: GPT, env: DistEnv) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[env.device.index] if env.device.type == "cuda" else None)


def no_sync(module: nn.Module, last_micro_batch: bool) -> ContextManager:
    """Skip gradient communication on all but the last micro-batch of an accumulation."""
    if last_micro_batch:
        return contextlib.nullcontext()
    if hasattr(module, "no_sync"):  # DDP
        return module.no_sync()
    if hasattr(module, "set_requires_gradient_sync"):  # FSDP2
        return _fsdp_no_sync(module)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(module: nn.Module):
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)
