"""CBP (``orscale.cbp.CBP``) in the optimizer table (``orscale.registry``): its param groups, the
checks of its `optim.cbp_*` keys, its build and its ZeRO owner hooks (docs/cbp.md)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from orscale.cbp import CBP, share_equalization_targets, summarize_cbp
from orscale.optimizer_spec import Checks, OptimizerSpec, OwnerHooks, elementwise_build, split_tensors

if TYPE_CHECKING:
    from orscale.optim_config import OptimConfig


def cbp_groups(named: list[tuple[str, Any]], emb: frozenset[int], cfg: OptimConfig) -> list[dict[str, Any]]:
    """Every tensor one block, grouped by ``role``: CBP equalises each role among itself (c is the
    role's mean energy, so a norm gain is not scaled against a matrix); every group takes decoupled
    decay, but the 1-D tensors and the embedding none with ``exempt_norms_and_embeddings``."""
    emb_mats, mats, vecs = split_tensors(named, emb, cfg)
    exempt, wd = cfg.exempt_norms_and_embeddings, cfg.weight_decay
    return [
        {
            "params": emb_mats,
            "weight_decay": 0.0 if exempt else cfg.adamw_decay,
            "role": "embedding" if exempt else "matrices",
        },
        {
            "params": [(n, p) for n, p in mats if not (exempt and id(p) in emb)],
            "weight_decay": wd,
            "role": "matrices",
        },
        {"params": [(n, p) for n, p in mats if exempt and id(p) in emb], "weight_decay": 0.0, "role": "embedding"},
        {
            "params": vecs,
            "weight_decay": 0.0 if exempt else (cfg.adamw_decay if cfg.own_adamw_group else wd),
            "role": "vectors",
        },
    ]


def _checks(cfg: OptimConfig) -> Checks:
    return [
        (0 < cfg.cbp_zeta < math.inf, f"optim.cbp_zeta must be > 0, got {cfg.cbp_zeta}"),
        (0 <= cfg.cbp_rho < 1, f"optim.cbp_rho must be in [0, 1), got {cfg.cbp_rho}"),
        (
            0 < cfg.cbp_s_min <= cfg.cbp_s_max < math.inf,
            f"optim.cbp_s_min ({cfg.cbp_s_min}) must be > 0 and <= optim.cbp_s_max ({cfg.cbp_s_max})",
        ),
    ]


def _kwargs(cfg: OptimConfig) -> dict[str, Any]:
    return dict(
        lr=cfg.lr,
        betas=(cfg.betas[0], cfg.betas[1]),
        weight_decay=cfg.weight_decay,
        decoupled_weight_decay=True,
        zeta=cfg.cbp_zeta,
        rho=cfg.cbp_rho,
        s_min=cfg.cbp_s_min,
        s_max=cfg.cbp_s_max,
        equalize=cfg.cbp_equalize,
        precondition=cfg.cbp_precondition,
    )


def _hooks(cfg: OptimConfig) -> OwnerHooks:
    """Owners share each role's equalisation target (a mean over every rank's blocks); the M1
    summary is merged from every rank's statistics."""
    return OwnerHooks(
        share_equalization_targets if cfg.cbp_equalize else None,
        lambda opt: opt.diagnostic_stats() if opt is not None else [],
        summarize_cbp,
    )


SPECS = (
    OptimizerSpec(
        names=("cbp",),
        routing="elementwise",
        build=elementwise_build(CBP, _kwargs),
        labels={"cbp": "CBP"},
        groups=cbp_groups,
        checks=_checks,
        owner_hooks=_hooks,
    ),
)
