"""The PyTorch-native backends, run by `launch.engine.torch_engine.TorchEngine` and checkpointed
with torch.distributed.checkpoint: one process (`none`), DDP replicas (`ddp`) and FSDP2 shards
(`fsdp`; with `parallel.dp_replicate` > 1, HSDP: FSDP2 on a 2-D mesh, docs/scaling.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launch.backends.base import Backend

if TYPE_CHECKING:
    import torch
    from torch import nn

    from launch.parallel_config import ParallelConfig
    from launch.runtime.process_group import DistEnv
    from models import GPT


class NoBackend(Backend):
    """One process, no process group: the model and its optimizers as they are."""

    name = "none"
    label = "one process"
    optimizer_placement = "none"
    checkpoint_layout = "dcp"
    process_group = False
    many_processes = False


class DDPBackend(Backend):
    """DistributedDataParallel: whole replicas, gradients all-reduced in buckets."""

    name = "ddp"
    label = "DDP"
    optimizer_placement = "ddp"
    checkpoint_layout = "dcp"

    def wrap(self, model: GPT, env: DistEnv) -> nn.Module:
        from launch.engine.parallelize import wrap_ddp

        return wrap_ddp(model, env)


class FSDPBackend(Backend):
    """FSDP2 (`fully_shard`) per block and on the whole model; HSDP with `parallel.dp_replicate` > 1."""

    name = "fsdp"
    label = "FSDP2"
    optimizer_placement = "fsdp"
    checkpoint_layout = "dcp"
    shards_parameters = True
    accelerate_kind = "FSDP"

    def check_layout(self, parallel: ParallelConfig) -> None:
        return  # HSDP is FSDP2's

    def check_param_dtype(self, parallel: ParallelConfig) -> None:
        return  # FSDP2's own setting

    def meta_init(self, parallel: ParallelConfig) -> bool:
        return parallel.meta_init

    def shard(self, model: GPT, parallel: ParallelConfig, env: DistEnv, dtype: torch.dtype) -> None:
        from launch.engine.parallelize import shard_fsdp

        shard_fsdp(model, parallel, env, dtype)
