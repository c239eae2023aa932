"""The PyTorch-native backends, run by `launch.engine.torch_engine.TorchEngine` and checkpointed
with torch.distributed.checkpoint: one process (`none`), DDP replicas (`ddp`) and FSDP2 shards
(`fsdp`; with `parallel.dp_replicate` > 1, HSDP: FSDP2 on a 2-D mesh, docs/scaling.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from launch.backends.base import Backend
from launch.train_config import require

if TYPE_CHECKING:
    import torch
    from torch import nn

    from launch.parallel_config import ParallelConfig
    from launch.runtime.process_group import DistEnv
    from models import GPT


PARAM_DTYPES: tuple[str, ...] = ("auto", "bf16", "fp32")


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


@dataclass
class FSDPOptions:
    """`parallel.fsdp`: FSDP2's own settings."""

    section: ClassVar[str] = "fsdp"

    meta_init: bool = True  # build on meta, init shards after sharding (never whole on a rank)
    # Free each block's gathered params after its forward (true), keep them for backward (false: faster,
    # more memory), or auto (false on one node, true across nodes).
    reshard_after_forward: str | bool = field(default="auto", metadata={"resume": "routine"})
    # The param dtype in forward/backward: auto (bf16 with train.dtype bf16 on CUDA) | bf16 | fp32.
    # Gradients are reduced in fp32 either way; `bf16` runs the bf16-param policy on CPU too (tests).
    param_dtype: str = "auto"

    def __post_init__(self) -> None:
        # A YAML boolean keeps meaning what it meant.
        if isinstance(self.reshard_after_forward, bool):
            self.reshard_after_forward = "true" if self.reshard_after_forward else "false"
        require(
            self.reshard_after_forward in ("auto", "true", "false"),
            f"parallel.fsdp.reshard_after_forward must be auto, true or false, got {self.reshard_after_forward!r}",
        )
        require(
            self.param_dtype in PARAM_DTYPES,
            f"parallel.fsdp.param_dtype must be one of {', '.join(PARAM_DTYPES)}, got {self.param_dtype!r}",
        )


class FSDPBackend(Backend):
    """FSDP2 (`fully_shard`) per block and on the whole model; HSDP with `parallel.dp_replicate` > 1."""

    name = "fsdp"
    label = "FSDP2"
    optimizer_placement = "fsdp"
    checkpoint_layout = "dcp"
    shards_parameters = True
    accelerate_kind = "FSDP"
    options = (FSDPOptions,)

    def check_layout(self, parallel: ParallelConfig) -> None:
        return  # HSDP is FSDP2's

    def meta_init(self, parallel: ParallelConfig) -> bool:
        return parallel.own(FSDPOptions).meta_init

    def shard(self, model: GPT, parallel: ParallelConfig, env: DistEnv, dtype: torch.dtype) -> None:
        from launch.engine.parallelize import shard_fsdp

        shard_fsdp(model, parallel, parallel.own(FSDPOptions), env, dtype)
