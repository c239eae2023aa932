"""The Muon family under DDP: plain, replicated params whose gradients are already all-reduced.

Every rank updates every momentum buffer (cheap; the state stays identical everywhere and a
checkpoint loads at any world size); NS runs only on each matrix's owner, and the owners' Qs are
shared with one ``all_gather`` per bucket (in flight while the next bucket's NS runs). Norms are
local (whole matrices). ``mode="replicate"``: every rank runs every NS, no communication (the
single-process step).
"""

from __future__ import annotations

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
)
from orscale.newton_schulz import resolve_ns_dtype
from orscale.optim_common import ParamsT, TensorList


class ReplicatedMuonFamily(OwnerMuonFamily):
    """MuonFamily for DDP (plain, replicated params; gradients already all-reduced).

    ``mode="owner"``: NS only on each matrix's owner, Qs shared by one all_gather per bucket;
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

    @staticmethod
    def _owned(lays: list[Layout], owner: int) -> list[int]:
        return [k for k, lay in enumerate(lays) if lay.owner == owner]

    def _to_owners(self, group: dict[str, Any], m_hats: TensorList, lays: list[Layout]) -> InFlight:
        return landed([m_hats[k] for k in self._owned(lays, self._rank)])  # every rank holds every M̂

    def _from_owners(self, group: dict[str, Any], q_full: list[Tensor], lays: list[Layout]) -> InFlight:
        W = self._world
        by_owner = [self._owned(lays, d) for d in range(W)]
        sizes = [sum(lays[k].m * lays[k].n for k in ks) for ks in by_owner]
        width = max(sizes)
        send = torch.zeros(width, dtype=resolve_ns_dtype(group["ns_dtype"]), device=self._device)
        if q_full:
            send[: sizes[self._rank]].copy_(torch.cat([q.reshape(-1) for q in q_full]))
        recv = send.new_empty(W * width)
        work = all_gather_into(recv, send, self._group, async_op=True)
        self._sent((W - 1) * send.numel() * send.element_size())

        def unpack() -> list[Tensor]:
            out: dict[int, Tensor] = {}
            for s, part in enumerate(recv.view(W, width)):
                ks = by_owner[s]
                for k, t in zip(ks, part[: sizes[s]].split([lays[k].m * lays[k].n for k in ks]), strict=True):
                    out[k] = t.view(lays[k].m, lays[k].n).float()
            return [out[k] for k in range(len(lays))]

        return InFlight([work], unpack, (send, recv))
