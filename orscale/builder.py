"""The optimizers for a model under an ``OptimConfig``: the entry point of ``orscale``.

``build_optimizers`` returns ``[AdamW]``, ``[MuonFamily (or its distributed subclass), AdamW]`` or
``[CBP | LAMB | LARS]`` for a model whose parameters are plain tensors (one process), replicated
(DDP) or FSDP2 DTensors.
DeepSpeed ZeRO drives its own client optimizer (``orscale.distributed.zero``), built from the
same ``route_parameters`` and ``muon_family_kwargs``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from orscale.cbp import CBP
from orscale.distributed.ddp import ReplicatedMuonFamily
from orscale.distributed.elementwise import ShardedCBP, ShardedLAMB, ShardedLARS
from orscale.distributed.fsdp import ShardedMuonFamily
from orscale.distributed.owners import MODES
from orscale.muon_family import MuonFamily
from orscale.optim_config import OptimConfig, OptimConfigError
from orscale.routing import route_parameters
from orscale.trust_ratio import LAMB, LARS

# Where the parameters live: one process, DDP replicas, FSDP2 shards.
PLACEMENTS: tuple[str, ...] = ("none", "ddp", "fsdp")


def adamw(groups: list[dict[str, Any]], cfg: OptimConfig) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` (DTensor-native under FSDP2) over routed param groups."""
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)


def muon_family_kwargs(cfg: OptimConfig) -> dict[str, Any]:
    """MuonFamily's keyword arguments for `cfg` (shared by every placement, ZeRO's included)."""
    return dict(lr=cfg.lr, weight_decay=cfg.weight_decay, variant=cfg.name, momentum=cfg.momentum,
                nesterov=cfg.nesterov, ns_steps=cfg.ns_steps, ns_coefficients=cfg.ns_coefficients,
                ns_dtype=cfg.ns_dtype, r_min=cfg.r_min, r_max=cfg.r_max, eps=cfg.trust_eps,
                track_diagnostics=cfg.diagnostics)


def elementwise_optimizer(groups: list[dict[str, Any]], cfg: OptimConfig, sharded: bool = False
                          ) -> torch.optim.Optimizer:
    """CBP, LAMB or LARS (`cfg.name`) over routed param groups; `sharded`: for FSDP2 DTensors."""
    if cfg.name == "cbp":
        cls = ShardedCBP if sharded else CBP
        return cls(groups, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay,
                   decoupled_weight_decay=True, zeta=cfg.cbp_zeta, rho=cfg.cbp_rho, s_min=cfg.cbp_s_min,
                   s_max=cfg.cbp_s_max, equalize=cfg.cbp_equalize, precondition=cfg.cbp_precondition)
    if cfg.name == "lamb":
        return (ShardedLAMB if sharded else LAMB)(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                                                  weight_decay=cfg.weight_decay)
    if cfg.name == "lars":
        return (ShardedLARS if sharded else LARS)(groups, lr=cfg.lr, momentum=cfg.momentum,
                                                  weight_decay=cfg.weight_decay,
                                                  trust_coefficient=cfg.lars_trust_coefficient, eps=cfg.eps)
    raise ValueError(f"{cfg.name!r} is not an elementwise optimizer")


def build_optimizers(model: nn.Module, cfg: OptimConfig, backend: str = "none",
                     mode: str = "owner") -> list[torch.optim.Optimizer]:
    """The optimizers for `model` under `cfg`.

    ``backend`` says where the parameters live (``PLACEMENTS``) and picks the Muon-family class:
    ``fsdp`` → ``ShardedMuonFamily`` (DTensor params), ``ddp`` → ``ReplicatedMuonFamily``,
    ``none`` → ``MuonFamily``; ``mode`` (``owner`` | ``replicate``) says where Newton–Schulz runs.
    Every trainable parameter is in exactly one optimizer. All groups start at lr = cfg.lr; the
    trainer overwrites ``group["lr"]`` on every group each step.
    """
    if backend not in PLACEMENTS:
        raise OptimConfigError(f"backend must be one of {', '.join(PLACEMENTS)} for build_optimizers, "
                               f"got {backend!r}")
    if mode not in MODES:
        raise OptimConfigError(f"parallel.muon_mode must be one of {', '.join(MODES)}, got {mode!r}")
    routing = route_parameters(model, cfg)
    optimizers: list[torch.optim.Optimizer] = []
    if routing.elementwise:
        optimizers.append(elementwise_optimizer(routing.elementwise, cfg, sharded=backend == "fsdp"))
    if routing.matrices:
        kwargs = muon_family_kwargs(cfg)
        if backend == "fsdp":
            optimizers.append(ShardedMuonFamily(routing.matrices, mode=mode, **kwargs))
        elif backend == "ddp":
            optimizers.append(ReplicatedMuonFamily(routing.matrices, mode=mode, **kwargs))
        else:
            optimizers.append(MuonFamily(routing.matrices, **kwargs))
    if routing.adamw_groups:
        optimizers.append(adamw(routing.adamw_groups, cfg))
    return optimizers
