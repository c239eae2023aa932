"""CBP (``orscale.cbp.CBP``) in the optimizer table (``orscale.registry``): its options (`optim.cbp`),
its param groups, its build and its ZeRO owner hooks (docs/cbp.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from orscale.cbp import CBP, share_equalization_targets, summarize_cbp
from orscale.errors import require_all
from orscale.optimizer_spec import OptimizerSpec, OwnerHooks, elementwise_build, split_tensors

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


@dataclass
class CBPOptions:
    """`optim.cbp`: M1 (block equalisation) and M3 (the preconditioner) of CBP; its paper uses betas
    (0.9, 0.999)."""

    section: ClassVar[str] = "cbp"

    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    zeta: float = 1e-3  # M3 damping ζ added to √v̂
    rho: float = 0.99  # M1 energy EMA ρ
    s_min: float = 0.1  # M1 clip of the block scale
    s_max: float = 4.0
    equalize: bool = True  # M1 on/off (the paper's ablations)
    precondition: bool = True  # M3 on/off

    def __post_init__(self) -> None:
        require_all(
            [
                (
                    len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
                    f"optim.cbp.betas must be two numbers in [0, 1), got {self.betas}",
                ),
                (0 < self.zeta < math.inf, f"optim.cbp.zeta must be > 0, got {self.zeta}"),
                (0 <= self.rho < 1, f"optim.cbp.rho must be in [0, 1), got {self.rho}"),
                (
                    0 < self.s_min <= self.s_max < math.inf,
                    f"optim.cbp.s_min ({self.s_min}) must be > 0 and <= optim.cbp.s_max ({self.s_max})",
                ),
            ]
        )


def _kwargs(cfg: OptimConfig) -> dict[str, Any]:
    o = cfg.own(CBPOptions)
    return dict(
        lr=cfg.lr,
        betas=(o.betas[0], o.betas[1]),
        weight_decay=cfg.weight_decay,
        decoupled_weight_decay=True,
        zeta=o.zeta,
        rho=o.rho,
        s_min=o.s_min,
        s_max=o.s_max,
        equalize=o.equalize,
        precondition=o.precondition,
    )


def _hooks(cfg: OptimConfig) -> OwnerHooks:
    """Owners share each role's equalisation target (a mean over every rank's blocks); the M1
    summary is merged from every rank's statistics."""
    return OwnerHooks(
        share_equalization_targets if cfg.own(CBPOptions).equalize else None,
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
        owner_hooks=_hooks,
        options=(CBPOptions,),
    ),
)
