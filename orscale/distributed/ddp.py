"""The Muon family under DDP: plain, replicated params whose gradients are already all-reduced.

Every rank updates every momentum buffer (cheap; the state stays identical everywhere and a
checkpoint loads at any world size); NS runs only on each matrix's owner, and the owners' Qs are
shared bucket by bucket (in flight while the next bucket's NS runs). A bucket holds up to one run
of matrices per owner (``owners.owner_buckets``: each rank's matrices largest first), so in the
one all_gather that shares it every rank contributes its own Qs, padded to the bucket's longest
run: Muon's own layout. Where a bucket has too few owners for that (more ranks than matrices, the
last bucket of an uneven deal) the gather would be mostly zeros, so its owners broadcast their
runs instead (``GatherPlan``). Norms are local (whole matrices). ``mode="replicate"``: every rank
runs every NS, no communication (the single-process step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from orscale.distributed.owners import (
    DEFAULT_BUCKET_NUMEL,
    InFlight,
    Layout,
    OwnerMuonFamily,
    all_gather_into,
    landed,
    owner_buckets,
)
from orscale.newton_schulz import resolve_ns_dtype
from orscale.optim_common import ParamsT, TensorList

# A bucket whose all_gather would be more than this share zeros (ranks that own nothing in it, or
# runs shorter than the longest) is sent as one broadcast per owner: exactly its Q bytes, for more
# collectives. Owners dealt evenly (every rank one run of one size) always gather.
MAX_PADDING = 1 / 8


@dataclass(frozen=True)
class GatherPlan:
    """How one bucket's Qs reach every rank, in elements. ``by_owner[d]``: the bucket positions
    rank d orthogonalised (bucket order); ``sizes[d]``: their elements; ``width``: the all_gather's
    chunk (the longest run); ``broadcast``: one broadcast per owner instead of the all_gather."""

    by_owner: list[list[int]]
    sizes: list[int]
    width: int
    broadcast: bool

    def sent(self, rank: int) -> int:
        """Elements `rank` puts on the wire (ring algorithms: an all_gather sends W − 1 chunks; a
        broadcast passes the buffer on at every rank but the root's predecessor)."""
        if not self.broadcast:
            return (len(self.sizes) - 1) * self.width
        return sum(self.passed_on(rank, d) for d in range(len(self.sizes)))

    def passed_on(self, rank: int, owner: int) -> int:
        """Elements `rank` sends in the broadcast from `owner` (a ring: all but the last rank)."""
        return self.sizes[owner] if rank != (owner - 1) % len(self.sizes) else 0

    def padding(self, rank: int) -> int:
        """Zero elements `rank` contributes (its chunk beyond its own Qs)."""
        return 0 if self.broadcast else self.width - self.sizes[rank]


def gather_plan(lays: list[Layout], world: int) -> GatherPlan:
    """The plan of one bucket (``lays``: its matrices' layouts, owners in 0..world-1)."""
    by_owner = [[k for k, lay in enumerate(lays) if lay.owner == d] for d in range(world)]
    sizes = [sum(lays[k].m * lays[k].n for k in ks) for ks in by_owner]
    width = max(sizes)
    return GatherPlan(by_owner, sizes, width, world * width - sum(sizes) > MAX_PADDING * world * width)


class ReplicatedMuonFamily(OwnerMuonFamily):
    """MuonFamily for DDP (plain, replicated params; gradients already all-reduced).

    ``mode="owner"``: NS only on each matrix's owner, Qs shared per bucket (see module doc);
    ``mode="replicate"``: every rank runs every NS. ``process_group``: default the world group
    (a single process without ``torch.distributed`` runs the plain step).
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        *,
        mode: str = "owner",
        bucket_numel: int = DEFAULT_BUCKET_NUMEL,
        overlap: bool = True,
        process_group: dist.ProcessGroup | None = None,
        **kwargs: Any,
    ) -> None:
        if dist.is_available() and dist.is_initialized():
            self._group = process_group
            self._rank = dist.get_rank(process_group)
            self._world = self._shards = dist.get_world_size(process_group)
        super().__init__(params, lr, weight_decay, mode=mode, bucket_numel=bucket_numel, overlap=overlap, **kwargs)

    def _buckets(self, lays: list[Layout]) -> list[list[int]]:
        return owner_buckets(
            [lay.owner for lay in lays], [lay.m * lay.n for lay in lays], self._world, self.bucket_numel
        )

    def _bucket_bytes(self, lays: list[Layout], rank: int, q_bytes: int) -> int:
        return gather_plan(lays, self._world).sent(rank) * q_bytes

    def _to_owners(self, group: dict[str, Any], m_hats: TensorList, lays: list[Layout]) -> InFlight:
        mine = [k for k, lay in enumerate(lays) if lay.owner == self._rank]
        return landed([m_hats[k] for k in mine])  # every rank holds every M̂

    def _from_owners(self, group: dict[str, Any], q_full: list[Tensor], lays: list[Layout]) -> InFlight:
        plan = gather_plan(lays, self._world)
        dtype = resolve_ns_dtype(group["ns_dtype"])
        mine = torch.cat([q.reshape(-1) for q in q_full]) if q_full else None
        start = self._broadcast if plan.broadcast else self._all_gather
        works, parts, buffers = start(plan, mine, dtype)

        def unpack() -> list[Tensor]:
            out: dict[int, Tensor] = {}
            for d, part in parts.items():
                ks = plan.by_owner[d]
                for k, t in zip(ks, part.split([lays[k].m * lays[k].n for k in ks]), strict=True):
                    out[k] = t.view(lays[k].m, lays[k].n).float()
            return [out[k] for k in range(len(lays))]

        return InFlight(works, unpack, buffers)

    def _all_gather(
        self, plan: GatherPlan, mine: Tensor | None, dtype: torch.dtype
    ) -> tuple[list[Any], dict[int, Tensor], tuple[Tensor, ...]]:
        """Every rank's run, padded to the bucket's longest, in one all_gather."""
        W = self._world
        send = torch.zeros(plan.width, dtype=dtype, device=self._device)
        if mine is not None:
            send[: mine.numel()].copy_(mine)
        recv = send.new_empty(W * plan.width)
        work = all_gather_into(recv, send, self._group, async_op=True)
        self._sent(plan.sent(self._rank) * send.element_size())
        rows = recv.view(W, plan.width)
        return [work], {d: rows[d, : plan.sizes[d]] for d in range(W) if plan.sizes[d]}, (send, recv)

    def _broadcast(
        self, plan: GatherPlan, mine: Tensor | None, dtype: torch.dtype
    ) -> tuple[list[Any], dict[int, Tensor], tuple[Tensor, ...]]:
        """One broadcast per owner of the bucket, from the owner, of exactly its Qs."""
        works, parts = [], {}
        for d, size in enumerate(plan.sizes):
            if not size:
                continue
            buf = mine if d == self._rank and mine is not None else torch.empty(size, dtype=dtype, device=self._device)
            src = d if self._group is None else dist.get_global_rank(self._group, d)
            works.append(dist.broadcast(buf, src, group=self._group, async_op=True))
            self._sent(plan.passed_on(self._rank, d) * buf.element_size())
            parts[d] = buf
        return works, parts, tuple(parts.values())
