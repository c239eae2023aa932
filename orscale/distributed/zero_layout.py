"""Where the Muon-family matrices lie inside DeepSpeed ZeRO-1/2's flat partitions, and who owns each.

ZeRO flattens a param group into one buffer cut into equal contiguous partitions, one per rank. A
matrix may straddle a boundary; its owner is the rank holding most of it (ties: lowest rank), and
the layout says which pieces each rank sends to and receives from every other rank per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class Span:
    """A contiguous run of matrix `k` inside the partition of rank `rank`."""

    k: int
    rank: int
    part_off: int  # offset inside that rank's partition
    mat_off: int  # offset inside the flattened matrix
    n: int


@dataclass
class MatrixLayout:
    """Where every matrix of the Muon group lies across the ZeRO partitions, who owns it, and (for
    this rank) what travels where. Identical on every rank except the per-rank plans."""

    names: list[str]
    shapes: list[torch.Size]
    owner: list[int]
    pieces: list[list[Span]]  # per matrix, in flat order
    rank: int
    world: int

    def __post_init__(self) -> None:
        me = self.rank
        self.owned = [k for k, o in enumerate(self.owner) if o == me]
        self.slot = {k: i for i, k in enumerate(self.owned)}  # matrix index -> position in `owned`
        # Pieces this rank holds of matrices it owns (copied locally, never sent).
        self.kept = [pc for k in self.owned for pc in self.pieces[k] if pc.rank == me]
        # outgoing[d]: pieces this rank holds of matrices d owns; incoming[s]: pieces s holds of
        # matrices this rank owns. Both sides list them in the same (matrix, offset) order.
        self.outgoing = [
            []
            if d == me
            else [pc for k, ps in enumerate(self.pieces) if self.owner[k] == d for pc in ps if pc.rank == me]
            for d in range(self.world)
        ]
        self.incoming = [
            [] if s == me else [pc for k in self.owned for pc in self.pieces[k] if pc.rank == s]
            for s in range(self.world)
        ]
        # The same on every rank, so either all ranks take part in the all_to_all or none does.
        self.needs_exchange = self.world > 1 and any(pc.rank != self.owner[pc.k] for ps in self.pieces for pc in ps)


def build_layout(
    names: list[str], shapes: list[torch.Size], offsets: list[int], partition_size: int, rank: int, world: int
) -> MatrixLayout:
    """Cut each matrix [offset, offset + numel) of the flat group at the partition boundaries."""
    P = partition_size
    pieces, owner = [], []
    for k, (shape, off) in enumerate(zip(shapes, offsets, strict=True)):
        n = math.prod(shape)
        ps = []
        for q in range(off // P, (off + n - 1) // P + 1):
            lo, hi = max(off, q * P), min(off + n, (q + 1) * P)
            if hi > lo:
                ps.append(Span(k, q, lo - q * P, lo - off, hi - lo))
        if not ps or ps[-1].rank >= world:
            raise RuntimeError(f"matrix {names[k]} lies outside the ZeRO flat buffer")
        pieces.append(ps)
        owner.append(max(ps, key=lambda pc: (pc.n, -pc.rank)).rank)
    return MatrixLayout(list(names), list(shapes), owner, pieces, rank, world)


def zero_group_layout(zero_opt: Any, gi: int, world: int) -> tuple[Tensor, list[Tensor], list[int], int]:
    """(flat group buffer, params in flat order, their element offsets in it, partition size)."""
    if hasattr(zero_opt, "bit16_groups_flat"):  # DeepSpeedZeroOptimizer (ZeRO-1/2)
        flat, params = zero_opt.bit16_groups_flat[gi], list(zero_opt.bit16_groups[gi])
        P = int(zero_opt.partition_size[gi])
    elif hasattr(zero_opt, "bf16_groups_flat"):  # BF16_Optimizer (ZeRO-1, bf16 params, fp32 grad accum)
        flat, params = zero_opt.bf16_groups_flat[gi], list(zero_opt.bf16_groups[gi])
        P = flat.numel() // world
    else:
        raise TypeError(f"unsupported DeepSpeed optimizer {type(zero_opt).__name__}: expected ZeRO stage 1/2")
    offsets = []
    for p in params:  # the params' storage are views into the flat buffer
        off = (p.data_ptr() - flat.data_ptr()) // p.element_size()
        if p.dtype != flat.dtype or not 0 <= off <= flat.numel() - p.numel():
            raise RuntimeError("ZeRO parameter is not a view into its flat group buffer")
        offsets.append(off)
    if P * world != flat.numel():
        raise RuntimeError(f"ZeRO partitions are not equal-sized ({flat.numel()} elements, {world} ranks)")
    return flat, params, offsets, P
