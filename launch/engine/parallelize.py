"""Parallelism applied from outside the model (torchtitan's way): FSDP2 or DDP, activation
checkpointing and per-block torch.compile. The model code never knows. Used by the engines."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from launch.config import ParallelConfig
from launch.runtime.process_group import DistEnv
from models import GPT, GPTConfig

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule


def build_model(
    model_cfg: GPTConfig, parallel: ParallelConfig, seed: int, env: DistEnv, dtype: torch.dtype = torch.float32
) -> GPT:
    """Construct, shard (FSDP2) and initialise the GPT.

    FSDP2 with `parallel.meta_init` builds on the meta device and fills each rank's shard after
    `fully_shard` (`init_sharded`), so a 1.1B model is never whole on one rank. Either way every
    tensor's initial value depends on (seed, name) only (`GPT.init_value`), so the weights equal a
    single-process run's at any world size and on every backend.
    """
    torch.manual_seed(seed)
    if parallel.backend == "fsdp" and parallel.meta_init:
        with torch.device("meta"):
            model = GPT(model_cfg)
        _apply(model, parallel, env, dtype)
        model.to_empty(device=env.device)
        init_sharded(model, seed)
        return model
    with torch.device(env.device):
        model = GPT(model_cfg, seed=seed)
    _apply(model, parallel, env, dtype)
    return model


@torch.no_grad()
def init_sharded(model: GPT, seed: int) -> None:
    """`GPT.init_weights` for a model whose parameters may be DTensor shards: each rank draws one
    whole tensor at a time (never the whole model) and keeps its own shard of it."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    from orscale.routing import canonical_name

    for name, p in model.named_parameters():
        value = model.init_value(canonical_name(name), seed, tuple(p.shape))
        if isinstance(p, DTensor):  # src_data_rank=None: each rank cuts its shard of its own copy
            value = distribute_tensor(value, p.device_mesh, p.placements, src_data_rank=None).to_local()
            p.to_local().copy_(value)
        else:
            p.copy_(value)
    model.init_buffers()


def _apply(model: GPT, parallel: ParallelConfig, env: DistEnv, dtype: torch.dtype) -> None:
    if parallel.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for i, block in enumerate(model.blocks):
            model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False)
    if parallel.compile == "blocks":
        for block in model.blocks:
            block.compile()
    if parallel.backend == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # bf16 compute with fp32 gradient reduction; the fp32 sharded params are the master weights.
        # (bf16 params on CUDA only: gloo's CPU collectives are the test path and stay fp32.)
        mp = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if dtype == torch.bfloat16 and env.device.type == "cuda"
            else MixedPrecisionPolicy()
        )
        for block in model.blocks:
            # The last block's params are needed right away in backward: don't reshard them.
            fully_shard(block, mp_policy=mp, reshard_after_forward=block is not model.blocks[-1])
        fully_shard(model, mp_policy=mp)


def wrap_ddp(model: GPT, env: DistEnv) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    # No buffer broadcast: buffers are equal on every rank by construction (RoPE tables, centred
    # means averaged after each step), and a centred layer's per-rank input sum must stay per rank.
    return DDP(model, device_ids=[env.device.index] if env.device.type == "cuda" else None, broadcast_buffers=False)


def no_sync(module: nn.Module, last_micro_batch: bool) -> AbstractContextManager:
    """Skip gradient communication on all but the last micro-batch of an accumulation."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel as DDP

    if last_micro_batch:
        return contextlib.nullcontext()
    if isinstance(module, DDP):
        return module.no_sync()
    if isinstance(module, FSDPModule):
        return _fsdp_no_sync(module)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(module: FSDPModule) -> Iterator[None]:
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)
