"""The Muon family (every ``orscale.variants`` row: Muon, Muon+Moonlight, OrScale, OrScale-LM and the
design-space variants) in the optimizer table (``orscale.registry``): its options (`optim.muon`), its
builds per placement and its ZeRO owner hooks. A member with a step of its own (a subclass of each
placement's class) builds and hooks the same way: ``muon_family_build``, ``muon_owner_hooks``."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from orscale.diagnostics import merge_rows
from orscale.distributed.ddp import ReplicatedMuonFamily
from orscale.distributed.fsdp import ShardedMuonFamily
from orscale.errors import require_all
from orscale.muon_family import MuonFamily
from orscale.newton_schulz import NS_COEFFICIENT_SETS, NS_KERNELS
from orscale.optimizer_spec import ZERO, Builder, OptimizerSpec, OwnerHooks
from orscale.variants import VARIANTS, Variant

if TYPE_CHECKING:
    from orscale.optim_config import OptimConfig


@dataclass
class MuonOptions:
    """`optim.muon`: the momentum, Newton–Schulz and trust-ratio settings of every Muon-family variant."""

    section: ClassVar[str] = "muon"

    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_coefficients: str = "polar_express"  # polar_express | jordan
    ns_dtype: str = "auto"  # auto (bf16 on CUDA, fp32 elsewhere) | bf16 | fp32 (fp32 for exact equality tests)
    # X Xᵀ and b·A + c·A²: auto (symmetric Triton kernels for bf16 on CUDA; torch's elsewhere) | torch
    ns_kernel: str = "auto"
    r_min: float = 0.1  # the trust ratio's clip (OrScale, OrScale-LM)
    r_max: float = 5.0
    trust_eps: float = 1e-6
    diagnostics: bool = True  # per-matrix trust-ratio diagnostics (diag/ in metrics)
    # The elementwise passes around Newton–Schulz compiled into fused kernels (null: on CUDA) or eager
    # (orscale/muon_passes.py)
    compile_passes: bool | None = None

    def __post_init__(self) -> None:
        require_all(
            [
                (0 <= self.momentum < 1, f"optim.muon.momentum must be in [0, 1), got {self.momentum}"),
                (self.ns_steps >= 1, f"optim.muon.ns_steps must be >= 1, got {self.ns_steps}"),
                (
                    self.ns_coefficients in NS_COEFFICIENT_SETS,
                    f"optim.muon.ns_coefficients must be one of {', '.join(NS_COEFFICIENT_SETS)}, "
                    f"got {self.ns_coefficients!r}",
                ),
                (
                    self.ns_dtype in ("auto", "bf16", "fp32"),
                    f"optim.muon.ns_dtype must be auto, bf16 or fp32, got {self.ns_dtype!r}",
                ),
                (
                    self.ns_kernel in NS_KERNELS,
                    f"optim.muon.ns_kernel must be one of {', '.join(NS_KERNELS)}, got {self.ns_kernel!r}",
                ),
                (
                    0 < self.r_min <= self.r_max < math.inf,
                    f"optim.muon.r_min ({self.r_min}) must be > 0 and <= optim.muon.r_max ({self.r_max})",
                ),
                (0 < self.trust_eps < math.inf, f"optim.muon.trust_eps must be > 0, got {self.trust_eps}"),
            ]
        )


def muon_family_kwargs(cfg: OptimConfig) -> dict[str, Any]:
    """MuonFamily's keyword arguments for `cfg` (shared by every placement, ZeRO's included)."""
    o = cfg.own(MuonOptions)
    return dict(
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        variant=cfg.name,
        momentum=o.momentum,
        nesterov=o.nesterov,
        ns_steps=o.ns_steps,
        ns_coefficients=o.ns_coefficients,
        ns_dtype=o.ns_dtype,
        r_min=o.r_min,
        r_max=o.r_max,
        eps=o.trust_eps,
        track_diagnostics=o.diagnostics,
        compile_passes=o.compile_passes,
        ns_kernel=o.ns_kernel,
    )


def muon_family_build(
    plain: type[MuonFamily],
    replicated: type[ReplicatedMuonFamily],
    sharded: type[ShardedMuonFamily],
    kwargs: Callable[[OptimConfig], dict[str, Any]] = muon_family_kwargs,
) -> dict[str, Builder]:
    """The builds of a Muon-family step on every placement: `plain` on one process and at ZeRO's
    owners (whole fp32 matrices), `replicated` under DDP, `sharded` under FSDP2 (each with the
    ``Exchange`` settings it takes); `kwargs`: their keyword arguments under a config."""

    def make(use: type[MuonFamily], *exchange: str) -> Builder:
        return lambda matrices, cfg, ex: use(matrices, **{k: getattr(ex, k) for k in exchange}, **kwargs(cfg))

    return {
        "none": make(plain),
        "ddp": make(replicated, "mode", "overlap", "bucket_numel"),
        "fsdp": make(sharded, "replica_split", "mode", "overlap", "bucket_numel"),
        ZERO: make(plain),
    }


def muon_owner_hooks(variant: Variant) -> OwnerHooks:
    """What ZeRO's owners need of a Muon-family step with `variant`'s choices: its diagnostics per
    matrix class, merged over the ranks, and whether it keeps calibration constants."""
    return OwnerHooks(
        None,
        lambda opt: opt.diagnostic_rows() if opt is not None else ([], [], [], []),
        merge_rows,
        lazy_calibration=variant.calibration == "lazy",
    )


# On several ranks the matrices are exchanged whole (orscale.distributed).
MUON_FAMILY = OptimizerSpec(
    names=tuple(VARIANTS),
    routing="matrices",
    build=muon_family_build(MuonFamily, ReplicatedMuonFamily, ShardedMuonFamily),
    labels={"muon_moonlight": "Muon+Moonlight", "orscale_lm": "OrScale-LM", "muon": "Muon", "orscale": "OrScale"},
    owner_hooks=lambda cfg: muon_owner_hooks(VARIANTS[cfg.name]),
    options=(MuonOptions,),
)

SPECS: tuple[OptimizerSpec, ...] = (MUON_FAMILY,)
