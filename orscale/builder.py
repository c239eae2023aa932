"""The optimizers for a model under an ``OptimConfig``: the entry point of ``orscale``.

``build_optimizers`` returns ``[AdamW]``, ``[MuonFamily (or its distributed subclass), AdamW]`` or
``[CBP | LAMB | LARS]`` for a model whose parameters are plain tensors (one process), replicated
(DDP) or FSDP2 DTensors.
DeepSpeed ZeRO drives its own client optimizer (``orscale.distributed.zero``), built from the
same ``route_parameters`` and ``orscale.factories``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from orscale.distributed.ddp import ReplicatedMuonFamily
from orscale.distributed.elementwise import SHARDED_ELEMENTWISE
from orscale.distributed.fsdp import ShardedMuonFamily
from orscale.distributed.owners import DEFAULT_BUCKET_NUMEL, MODES
from orscale.factories import adamw, elementwise_optimizer, muon_family_kwargs
from orscale.muon_family import MuonFamily
from orscale.optim_config import OptimConfig, OptimConfigError
from orscale.routing import route_parameters

# Where the parameters live: one process, DDP replicas, FSDP2 shards.
PLACEMENTS: tuple[str, ...] = ("none", "ddp", "fsdp")


def build_optimizers(
    model: nn.Module,
    cfg: OptimConfig,
    backend: str = "none",
    mode: str = "owner",
    *,
    replica_split: bool = False,
    overlap: bool = True,
    bucket_numel: int = DEFAULT_BUCKET_NUMEL,
) -> list[torch.optim.Optimizer]:
    """The optimizers for `model` under `cfg`.

    ``backend`` says where the parameters live (``PLACEMENTS``) and picks the Muon-family class:
    ``fsdp`` → ``ShardedMuonFamily`` (DTensor params), ``ddp`` → ``ReplicatedMuonFamily``,
    ``none`` → ``MuonFamily``; ``mode`` (``owner`` | ``replicate``) says where Newton–Schulz runs;
    ``replica_split`` (HSDP: owners across the replica groups too), ``overlap`` and
    ``bucket_numel`` how the owner exchange runs (``orscale.distributed.owners``).
    Every trainable parameter is in exactly one optimizer. All groups start at lr = cfg.lr; the
    trainer overwrites ``group["lr"]`` on every group each step.
    """
    if backend not in PLACEMENTS:
        raise OptimConfigError(f"backend must be one of {', '.join(PLACEMENTS)} for build_optimizers, got {backend!r}")
    if mode not in MODES:
        raise OptimConfigError(f"parallel.muon_mode must be one of {', '.join(MODES)}, got {mode!r}")
    routing = route_parameters(model, cfg)
    optimizers: list[torch.optim.Optimizer] = []
    if routing.elementwise:
        optimizers.append(
            elementwise_optimizer(routing.elementwise, cfg, SHARDED_ELEMENTWISE if backend == "fsdp" else None)
        )
    if routing.matrices:
        kwargs = muon_family_kwargs(cfg)
        exchange: dict[str, Any] = dict(mode=mode, overlap=overlap, bucket_numel=bucket_numel)
        if backend == "fsdp":
            optimizers.append(ShardedMuonFamily(routing.matrices, replica_split=replica_split, **exchange, **kwargs))
        elif backend == "ddp":
            optimizers.append(ReplicatedMuonFamily(routing.matrices, **exchange, **kwargs))
        else:
            optimizers.append(MuonFamily(routing.matrices, **kwargs))
    if routing.adamw_groups:
        optimizers.append(adamw(routing.adamw_groups, cfg))
    return optimizers
