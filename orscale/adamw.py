"""AdamW (``torch.optim.AdamW``) from an ``OptimConfig``: its implementation choice (fused, foreach) and
its record in the optimizer table (``orscale.registry``). Every family's AdamW group is built here too."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from orscale.optimizer_spec import ALL_PLACEMENTS, Exchange, OptimizerSpec
from orscale.schedule import keep_lr_scales

if TYPE_CHECKING:
    from orscale.optim_config import OptimConfig


def adamw(groups: list[dict[str, Any]], cfg: OptimConfig) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` (DTensor-native under FSDP2) over routed param groups, in the
    implementation `cfg.fused` names: ``fused`` (one kernel per dtype/device for the whole update;
    CPU has one too), ``foreach`` (a few multi-tensor kernels per op), or ``auto``: fused when the
    parameters are on CUDA, foreach elsewhere."""
    opt = torch.optim.AdamW(
        groups,
        lr=cfg.lr,
        betas=(cfg.betas[0], cfg.betas[1]),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        **adamw_implementation(cfg.fused, groups),
    )
    return keep_lr_scales(opt)


# torch 2.10 and 2.11 keep one DTensorSpec alive per parameter per fused-AdamW step on DTensor
# (FSDP2) parameters: host RAM grows without bound (github.com/pytorch/pytorch/issues/181761 and
# .../188174; github.com/pytorch/torchtitan/issues/3790 saw 122 -> 180 GB over ~100k steps). Fixed
# upstream by github.com/pytorch/pytorch/pull/181792; 2.8 and 2.13 do not leak.
FUSED_DTENSOR_LEAK = ((2, 10), (2, 11))


def _leaking_torch(version: str) -> bool:
    return tuple(int(x) for x in version.split("+")[0].split(".")[:2]) in FUSED_DTENSOR_LEAK


def fused_leaks(params: list[Any], version: str = torch.__version__) -> bool:
    """Whether fused AdamW on `params` would leak under torch `version` (DTensor parameters only)."""
    from torch.distributed.tensor import DTensor

    return _leaking_torch(version) and any(isinstance(p, DTensor) for p in params)


def adamw_auto(on_cuda: bool, dtensor_params: bool, version: str = torch.__version__) -> str:
    """`optim.fused=auto` resolved: fused on CUDA, except on DTensor (FSDP2) parameters under a torch
    that leaks there (FUSED_DTENSOR_LEAK); foreach elsewhere."""
    return "fused" if on_cuda and not (dtensor_params and _leaking_torch(version)) else "foreach"


def adamw_implementation(
    setting: str, groups: list[dict[str, Any]], version: str = torch.__version__
) -> dict[str, bool]:
    """AdamW's `fused` / `foreach` keyword for `optim.fused` (auto | fused | foreach); the other stays
    at torch's default (None), as torch refuses both true. The choice is stored in every param group,
    so ZeRO's client, which copies these groups, runs the same implementation. `auto` is fused on
    CUDA, foreach elsewhere and on FSDP2 parameters under a torch that leaks there (FUSED_DTENSOR_LEAK);
    an explicit `fused` there is kept, with a warning."""
    # Routed groups hold (name, param) pairs; plain groups hold params.
    params = [item[1] if isinstance(item, tuple) else item for g in groups for item in g["params"]]
    leaks = fused_leaks(params, version)
    if setting == "auto":  # adamw_auto's rule, on the parameters themselves
        setting = "fused" if params and all(p.device.type == "cuda" for p in params) and not leaks else "foreach"
    elif setting == "fused" and leaks:
        logging.getLogger("orscale").warning(
            "optim.fused=fused on FSDP2 parameters under torch %s leaks host memory every step "
            "(pytorch#188174): a long run grows by GBs; use optim.fused=foreach or auto, or torch >= 2.12",
            version,
        )
    return {"fused": True} if setting == "fused" else {"foreach": True}


def _adamw(groups: list[dict[str, Any]], cfg: OptimConfig, exchange: Exchange) -> torch.optim.Optimizer:
    return adamw(groups, cfg)


ADAMW = OptimizerSpec(
    names=("adamw",),
    routing="adamw",
    build={placement: _adamw for placement in ALL_PLACEMENTS},  # DTensor-native; ZeRO's flat partitions
    labels={"adamw": "AdamW"},
)

SPECS: tuple[OptimizerSpec, ...] = (ADAMW,)
