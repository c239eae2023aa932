"""NorMuon (Li, Liu, Liang, Chen, Zhao 2025, "NorMuon: Making Muon more efficient and scalable",
arXiv:2510.05491) as a member of the Muon family, and its record in the optimizer table
(``orscale.registry``): `optim.name=normuon`.

Muon's step with a second moment per neuron of the orthogonalised update. Per hidden matrix W (m × n,
one row per output neuron), after the family's momentum and Newton–Schulz have given Q = NS(M̂):

    v ← β2·v + (1 − β2)·mean_j Q²_ij         one value per row (v: [m, 1], fp32, zeros at first)
    Q' = Q / (√v + ε)                         each row divided by its own RMS history
    a  = ‖Q‖_F / (‖Q'‖_F + ε)                  the update keeps Q's Frobenius norm
    W ← (1 − ηλ)·W − η·s·a·Q'                 s = 0.2·√max(m, n): Muon+Moonlight's update

What this follows, checked against the authors' `normuon.py` (github.com/zichongli5/NorMuon) and
modded-nanogpt's `NorMuonAndAdam`:

* **Which dimension.** One statistic per row, the mean over the row's n entries: the paper's
  per-neuron v ∈ ℝᵐ and the authors' code (`mean(dim=-1)`, state `p[..., 0:1]`). modded-nanogpt
  instead keeps it along the longer side (per row when m ≥ n, per column otherwise); not followed:
  a per-column mean would sum over every rank's rows under FSDP2's row shards.
* **β2 and ε.** β2 = 0.95: the paper's and the authors' default, and modded-nanogpt's when it took
  NorMuon (its record of 2025-10-24; it runs 0.9 now). ε = 1e-10 added to √v and to ‖Q'‖_F, as in the
  authors' code (modded-nanogpt clamps there at 1e-10 instead: the same where v ≫ 1e-20). No bias
  correction of v (none in either code): its scale cancels in a.
* **The scale.** The authors' code keeps ‖Q'‖ = ‖Q‖ (the factor a), then multiplies by Keller
  Jordan's max(1, m/n)^½; the paper's Algorithm 1 writes the step as η̂·Q' with
  η̂ = 0.2·η·√(mn)/‖Q'‖_F, an update RMS of 0.2η (Moonlight's AdamW match). Here a, then Moonlight's
  s = 0.2·√max(m, n): the paper's step where Q's singular values are 1 (‖Q‖_F = √min(m, n)), so
  NorMuon runs beside Muon+Moonlight at the same LRs.
* **Momentum and decay.** The family's: M ← μM + G, Nesterov M̂ = μM + G (the authors' EMA form is
  (1 − μ) times this, which Newton–Schulz's normalisation of its input removes), its Newton–Schulz
  (`optim.muon.ns_coefficients=jordan` gives the authors' coefficients), decoupled decay
  W ← (1 − ηλ)·W; a matrix without a gradient is not stepped (the authors' code steps it with a zero
  gradient: its momentum and v move on).

Distributed, through the family's hooks (``MuonFamily.shape_directions``, ``direction_scales``): v
and Q' are per row, so each rank works on the rows it holds (FSDP2's Shard(0) shards; whole matrices
under DDP and at ZeRO's owners), and ‖Q‖², ‖Q'‖² are two more columns of the step's one all-reduce
of per-matrix partial sums. v is fp32 and shaped [m, 1] like the weight's rows, so FSDP2 and DCP
shard it with them (a DTensor ``Shard(0)``), a checkpoint loads at any world size, and ZeRO's owner
checkpoint saves it by parameter name (``second_moment``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from orscale.distributed.ddp import ReplicatedMuonFamily
from orscale.distributed.fsdp import ShardedMuonFamily
from orscale.errors import require_all
from orscale.muon_family import GroupWork, MuonFamily
from orscale.muon_spec import MuonOptions, muon_family_build, muon_family_kwargs, muon_owner_hooks
from orscale.optim_common import ParamsT, check_number
from orscale.optimizer_spec import OptimizerSpec
from orscale.variants import VARIANTS

if TYPE_CHECKING:
    from orscale.optim_config import OptimConfig

SECOND_MOMENT = "second_moment"  # each matrix's v, [m, 1] fp32
BASE_VARIANT = "muon_moonlight"  # the family's choices NorMuon runs with (orscale.variants)


@dataclass
class NorMuonOptions:
    """`optim.normuon`: the second moment's decay and ε (the authors' defaults)."""

    section: ClassVar[str] = "normuon"

    beta2: float = 0.95
    eps: float = 1e-10

    def __post_init__(self) -> None:
        require_all(
            [
                (0 <= self.beta2 < 1, f"optim.normuon.beta2 must be in [0, 1), got {self.beta2}"),
                (0 < self.eps < math.inf, f"optim.normuon.eps must be > 0, got {self.eps}"),
            ]
        )


class NorMuon(MuonFamily):
    """NorMuon (see the module doc): ``MuonFamily`` with Muon+Moonlight's choices by default and a
    per-row second moment of Q. ``beta2``: v's decay; ``second_moment_eps``: its ε. Other arguments
    as ``MuonFamily`` (``eps`` is the trust ratio's, unused without one). Its subclasses run on DDP
    (``ReplicatedNorMuon``) and FSDP2 (``ShardedNorMuon``) parameters."""

    fp32_state = (*MuonFamily.fp32_state, SECOND_MOMENT)
    extra_sum_columns = 2  # ‖Q‖², ‖Q'‖²
    scales_directions = True

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        *,
        beta2: float = 0.95,
        second_moment_eps: float = 1e-10,
        variant: str = BASE_VARIANT,
        **kwargs: Any,
    ) -> None:
        check_number("beta2", beta2, lambda x: 0 <= x < 1, "in [0, 1)")
        check_number("second_moment_eps", second_moment_eps, lambda x: x > 0, "> 0")
        self.beta2, self.second_moment_eps = beta2, second_moment_eps
        super().__init__(params, lr, weight_decay, variant=variant, **kwargs)

    def _init_state(self, group: dict[str, Any]) -> None:
        super()._init_state(group)
        for p in group["params"]:
            if SECOND_MOMENT not in self.state[p]:
                # [m, 1] like the rows of the [m, n·…] matrix: a DTensor Shard(0) of p's mesh under FSDP2
                self.state[p][SECOND_MOMENT] = torch.zeros_like(p.flatten(1)[:, :1], dtype=torch.float32)

    def shape_directions(self, w: GroupWork, qs: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        """v ← β2·v + (1 − β2)·mean_j Q², Q' = Q / (√v + ε) on this rank's rows; the partial sums
        ‖Q‖², ‖Q'‖² (from the rows' sums of squares: Q' is not read again)."""
        directions, sums = [], []
        for p, q in zip(w.params, qs, strict=True):
            v = self._local(self.state[p][SECOND_MOMENT])
            q = q.float()
            row_sq = q.square().sum(dim=1, keepdim=True)
            v.lerp_(row_sq / q.shape[1], 1 - self.beta2)
            inv = (v.sqrt() + self.second_moment_eps).reciprocal()
            directions.append(q * inv)
            sums.append(torch.stack([row_sq.sum(), (row_sq * inv.square()).sum()]))
        return directions, torch.stack(sums)

    def direction_scales(self, w: GroupWork, sums: Tensor, extra: Tensor) -> Tensor:
        """a = ‖Q‖_F / (‖Q'‖_F + ε), from the reduced sums."""
        return extra[:, 0].sqrt() / (extra[:, 1].sqrt() + self.second_moment_eps)


class ReplicatedNorMuon(NorMuon, ReplicatedMuonFamily):
    """NorMuon under DDP: ``ReplicatedMuonFamily``'s owners and exchange, every rank's v whole."""


class ShardedNorMuon(NorMuon, ShardedMuonFamily):
    """NorMuon over FSDP2 / HSDP parameters: ``ShardedMuonFamily``'s exchange, v sharded with the rows."""


def normuon_kwargs(cfg: OptimConfig) -> dict[str, Any]:
    """NorMuon's keyword arguments for `cfg`: the family's (`optim.muon`) and its own (`optim.normuon`)."""
    own = cfg.own(NorMuonOptions)
    return {**muon_family_kwargs(cfg), "variant": BASE_VARIANT, "beta2": own.beta2, "second_moment_eps": own.eps}


SPECS = (
    OptimizerSpec(
        names=("normuon",),
        routing="matrices",
        build=muon_family_build(NorMuon, ReplicatedNorMuon, ShardedNorMuon, normuon_kwargs),
        labels={"normuon": "NorMuon"},
        owner_hooks=lambda cfg: muon_owner_hooks(VARIANTS[BASE_VARIANT]),
        options=(MuonOptions, NorMuonOptions),
    ),
)
