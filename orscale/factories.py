"""Single-process optimizers from an ``OptimConfig``: the pieces every placement builds on.

``orscale.builder`` picks the placement (one process, DDP, FSDP2) on top of these, and DeepSpeed
ZeRO's client optimizer (``orscale.distributed.zero``) builds its owner-side optimizers from them,
so neither imports the other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from orscale.cbp import CBP, share_equalization_targets, summarize_cbp
from orscale.diagnostics import merge_rows
from orscale.optim_config import OptimConfig
from orscale.schedule import keep_lr_scales
from orscale.trust_ratio import LAMB, LARS
from orscale.variants import VARIANTS

# The elementwise optimizers' classes by name; a placement may substitute its own (FSDP2's sharded ones).
ELEMENTWISE_CLASSES: dict[str, type[torch.optim.Optimizer]] = {"cbp": CBP, "lamb": LAMB, "lars": LARS}


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


def muon_family_kwargs(cfg: OptimConfig) -> dict[str, Any]:
    """MuonFamily's keyword arguments for `cfg` (shared by every placement, ZeRO's included)."""
    return dict(
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        variant=cfg.name,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov,
        ns_steps=cfg.ns_steps,
        ns_coefficients=cfg.ns_coefficients,
        ns_dtype=cfg.ns_dtype,
        r_min=cfg.r_min,
        r_max=cfg.r_max,
        eps=cfg.trust_eps,
        track_diagnostics=cfg.diagnostics,
        compile_passes=cfg.compile_passes,
        ns_kernel=cfg.ns_kernel,
    )


def elementwise_optimizer(
    groups: list[dict[str, Any]], cfg: OptimConfig, classes: dict[str, type[torch.optim.Optimizer]] | None = None
) -> torch.optim.Optimizer:
    """CBP, LAMB or LARS (`cfg.name`) over routed param groups (their LR scales kept for `set_lr`);
    `classes` overrides which class runs each name (default ``ELEMENTWISE_CLASSES``)."""
    return keep_lr_scales(_elementwise(groups, cfg, classes))


def _elementwise(
    groups: list[dict[str, Any]], cfg: OptimConfig, classes: dict[str, type[torch.optim.Optimizer]] | None
) -> torch.optim.Optimizer:
    cls: Any = (classes or ELEMENTWISE_CLASSES).get(cfg.name)
    betas = (cfg.betas[0], cfg.betas[1])
    if cfg.name == "cbp":
        return cls(
            groups,
            lr=cfg.lr,
            betas=betas,
            weight_decay=cfg.weight_decay,
            decoupled_weight_decay=True,
            zeta=cfg.cbp_zeta,
            rho=cfg.cbp_rho,
            s_min=cfg.cbp_s_min,
            s_max=cfg.cbp_s_max,
            equalize=cfg.cbp_equalize,
            precondition=cfg.cbp_precondition,
        )
    if cfg.name == "lamb":
        return cls(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.name == "lars":
        return cls(
            groups,
            lr=cfg.lr,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
            trust_coefficient=cfg.lars_trust_coefficient,
            eps=cfg.eps,
        )
    raise ValueError(f"{cfg.name!r} is not an elementwise optimizer")


@dataclass(frozen=True)
class OwnerHooks:
    """What owner-rank execution (ZeRO) needs of an optimizer beyond its step, for ranks that may hold
    none of its tensors: a statistic shared across ranks before the step (`sync`), and how each
    rank's diagnostics are taken (`payload`, given the owner optimizer or None) and merged (`merge`).
    `lazy_calibration`: whether it keeps OrScale-LM's calibration constants."""

    sync: Callable[[Any, list[str], Callable[[torch.Tensor], torch.Tensor], torch.device], None] | None
    payload: Callable[[Any], Any] | None
    merge: Callable[[list[Any]], dict[str, float]] | None
    lazy_calibration: bool = False


def owner_hooks(cfg: OptimConfig) -> OwnerHooks:
    """The hooks of `cfg.name`'s optimizer (see OwnerHooks)."""
    if cfg.name == "cbp":
        return OwnerHooks(
            share_equalization_targets if cfg.cbp_equalize else None,
            lambda opt: opt.diagnostic_stats() if opt is not None else [],
            summarize_cbp,
        )
    if cfg.name in ELEMENTWISE_CLASSES:  # LAMB, LARS: nothing shared, no diagnostics
        return OwnerHooks(None, None, None)
    return OwnerHooks(
        None,
        lambda opt: opt.diagnostic_rows() if opt is not None else ([], [], [], []),
        merge_rows,
        lazy_calibration=cfg.name in VARIANTS and VARIANTS[cfg.name].calibration == "lazy",
    )
