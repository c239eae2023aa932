"""The optimizers for a model under an ``OptimConfig``: the entry point of ``orscale``.

``build_optimizers`` returns ``[AdamW]``, ``[MuonFamily (or its distributed subclass), AdamW]`` or
``[CBP | LAMB | LARS ...]`` for a model whose parameters are plain tensors (one process), replicated
(DDP) or FSDP2 DTensors: the optimizer's record in ``orscale.registry`` says how its parameters are
routed and what it builds on each placement. DeepSpeed ZeRO drives its own client optimizer
(``orscale.distributed.zero``), built from the same routing and records.
"""

from __future__ import annotations

import torch
from torch import nn

from orscale.adamw import adamw
from orscale.distributed.owners import DEFAULT_BUCKET_NUMEL, MODES
from orscale.errors import OptimConfigError
from orscale.optim_config import OptimConfig
from orscale.optimizer_spec import PLACEMENTS, Exchange
from orscale.registry import optimizer_spec
from orscale.routing import route_parameters


def build_optimizers(
    model: nn.Module,
    cfg: OptimConfig,
    placement: str = "none",
    mode: str = "owner",
    *,
    backend: str | None = None,
    replica_split: bool = False,
    overlap: bool = True,
    bucket_numel: int = DEFAULT_BUCKET_NUMEL,
) -> list[torch.optim.Optimizer]:
    """The optimizers for `model` under `cfg`.

    ``placement`` says where the parameters live (``PLACEMENTS``: ``none``, ``ddp``, ``fsdp``; also
    accepted by its older keyword name ``backend``), and so which class each optimizer's record
    builds there (the Muon family: ``MuonFamily``, ``ReplicatedMuonFamily``, ``ShardedMuonFamily``);
    ``mode`` (``owner`` |
    ``replicate``) says where Newton–Schulz runs; ``replica_split`` (HSDP: owners across the
    replica groups too), ``overlap`` and ``bucket_numel`` how the owner exchange runs
    (``orscale.distributed.owners``).
    Every trainable parameter is in exactly one optimizer. All groups start at lr = cfg.lr; the
    trainer overwrites ``group["lr"]`` on every group each step.
    """
    if backend is not None:
        placement = backend
    if placement not in PLACEMENTS:
        raise OptimConfigError(
            f"backend must be one of {', '.join(PLACEMENTS)} for build_optimizers, got {placement!r}"
        )
    if mode not in MODES:
        raise OptimConfigError(f"parallel.muon_mode must be one of {', '.join(MODES)}, got {mode!r}")
    build = optimizer_spec(cfg.name).build[placement]
    exchange = Exchange(mode=mode, replica_split=replica_split, overlap=overlap, bucket_numel=bucket_numel)
    routing = route_parameters(model, cfg)
    optimizers: list[torch.optim.Optimizer] = []
    if routing.elementwise:
        optimizers.append(build(routing.elementwise, cfg, exchange))
    if routing.matrices:
        optimizers.append(build(routing.matrices, cfg, exchange))
    if routing.adamw_groups:
        optimizers.append(adamw(routing.adamw_groups, cfg))
    return optimizers
