"""The Muon family over FSDP2 parameters (DTensors ``Shard(0)`` on a 1-D mesh).

Momentum is a DTensor shard like its weight; all elementwise math runs on ``to_local()`` shards.
Per bucket, one ``all_to_all_single`` sends the M̂ row shards to their owners, the owners run NS
(batched by shape), and a second one returns each rank its Q rows (in the NS dtype: bf16 Q is sent
as bf16, bit-identical to the ``.float()`` of a single-process run). Row shards follow DTensor's
``Shard(0)`` layout (``row_split``: ceil(m/W) rows per rank, the last ones short or EMPTY). The
trust ratio's norms are local partial sums in one [N, 6] tensor, summed by ONE ``all_reduce`` per
step, so every rank holds the same r and c. ``mode="replicate"``: one ``all_gather`` per bucket of
the (row-padded) M̂ shards, NS on every rank, keep the local rows (a debugging reference).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from orscale.distributed.owners import (
    DEFAULT_BUCKET_NUMEL,
    Layout,
    OwnerMuonFamily,
    all_gather_into,
    cat_or_empty,
    row_split,
)
from orscale.newton_schulz import resolve_ns_dtype
from orscale.optim_common import ParamsT, TensorList


class ShardedMuonFamily(OwnerMuonFamily):
    """MuonFamily over FSDP2 params (DTensors sharded on dim 0 of a 1-D mesh); see module doc.

    ``mode``: ``"owner"`` (NS on one rank per matrix, all_to_all there and back) or
    ``"replicate"`` (all_gather M̂, NS everywhere). ``bucket_numel`` caps the whole-matrix
    elements per collective (default: one bucket up to 2²⁷ elements). Other arguments as
    ``MuonFamily``.
    """

    _sharded_rows = True

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        *,
        mode: str = "owner",
        bucket_numel: int = DEFAULT_BUCKET_NUMEL,
        **kwargs: Any,
    ) -> None:
        self._mesh: DeviceMesh | None = None
        super().__init__(params, lr, weight_decay, mode=mode, bucket_numel=bucket_numel, **kwargs)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        params = param_group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        param_group["params"] = params  # a generator would be spent by the checks below
        for item in params:
            p = item[1] if isinstance(item, tuple) else item
            name = item[0] if isinstance(item, tuple) else "a parameter"
            if not isinstance(p, DTensor):
                raise ValueError(
                    f"ShardedMuonFamily needs DTensor (FSDP2) params; {name} is a "
                    "plain tensor: use MuonFamily or ReplicatedMuonFamily"
                )
            if p.device_mesh.ndim != 1 or tuple(p.placements) != (Shard(0),):
                raise NotImplementedError(
                    f"ShardedMuonFamily supports Shard(0) on a 1-D mesh; {name} has "
                    f"{tuple(p.placements)} on a {p.device_mesh.ndim}-D mesh"
                )
            if self._mesh is None:
                self._mesh = p.device_mesh
                self._group = p.device_mesh.get_group()
                self._rank, self._world = p.device_mesh.get_local_rank(), p.device_mesh.size()
            elif p.device_mesh != self._mesh:
                raise ValueError(f"ShardedMuonFamily: {name} lives on another device mesh")
            if p.ndim == 2 and p.to_local().shape[0] != row_split(p.shape[0], self._world)[0][self._rank]:
                raise NotImplementedError(
                    f"{name}: local shard {tuple(p.to_local().shape)} is not DTensor's even Shard(0) chunking"
                )
        super().add_param_group(param_group)

    def _local(self, t: Tensor) -> Tensor:
        return t.to_local() if isinstance(t, DTensor) else t  # every param here is one (checked on add)

    def reduce_sums_of_squares(self, sums: Tensor) -> Tensor:
        """Partial sums over row shards → totals: ONE all_reduce for every matrix of the step."""
        if self._world > 1:
            dist.all_reduce(sums, group=self._group)
            self._sent(2 * (self._world - 1) / self._world * sums.numel() * sums.element_size())
        return sums

    def _orthogonalize_bucket(self, group: dict[str, Any], m_hats: TensorList, lays: list[Layout]) -> list[Tensor]:
        if self.mode == "replicate":
            return self._replicate_bucket(group, m_hats, lays)
        return self._owner_bucket(group, m_hats, lays)

    def _a2a(self, send: Tensor, out_splits: list[int], in_splits: list[int]) -> Tensor:
        recv = send.new_empty(sum(out_splits))
        dist.all_to_all_single(recv, send, out_splits, in_splits, group=self._group)
        self._sent((sum(in_splits) - in_splits[self._rank]) * send.element_size())
        return recv

    def _owner_bucket(self, group: dict[str, Any], m_hats: TensorList, lays: list[Layout]) -> list[Tensor]:
        R, W = self._rank, self._world
        dev = m_hats[0].device
        # 1. Every M̂ row shard to its matrix's owner: destination-major, bucket order within.
        by_owner = [[k for k, lay in enumerate(lays) if lay.owner == d] for d in range(W)]
        to_owner = [[m_hats[k].reshape(-1) for k in ks] for ks in by_owner]
        in_splits = [sum(t.numel() for t in ts) for ts in to_owner]
        mine = by_owner[R]
        out_splits = [sum(lays[k].rows[s] * lays[k].n for k in mine) for s in range(W)]
        recv = self._a2a(cat_or_empty([t for ts in to_owner for t in ts], torch.float32, dev), out_splits, in_splits)
        pieces = [
            chunk.split([lays[k].rows[s] * lays[k].n for k in mine]) for s, chunk in enumerate(recv.split(out_splits))
        ]
        fulls = [
            torch.cat([pieces[s][j].view(lays[k].rows[s], lays[k].n) for s in range(W)]) for j, k in enumerate(mine)
        ]
        del recv, pieces
        # 2. NS on the owned matrices (batched by shape).
        q_full = self._ns(group, fulls)
        del fulls
        # 3. Each rank's Q rows back to it, in the NS dtype (what the unsharded step casts).
        q_dtype = resolve_ns_dtype(group["ns_dtype"])
        back = [
            q[lays[k].starts[d] : lays[k].starts[d] + lays[k].rows[d]].reshape(-1)
            for d in range(W)
            for k, q in zip(mine, q_full, strict=True)
        ]
        recv = self._a2a(cat_or_empty(back, q_dtype, dev), in_splits, out_splits)
        del back, q_full
        out: dict[int, Tensor] = {}
        for s, chunk in enumerate(recv.split(in_splits)):
            ks = by_owner[s]
            for k, t in zip(ks, chunk.split([lays[k].rows[R] * lays[k].n for k in ks]), strict=True):
                out[k] = t.view(lays[k].rows[R], lays[k].n).float()
        return [out[k] for k in range(len(lays))]

    def _replicate_bucket(self, group: dict[str, Any], m_hats: TensorList, lays: list[Layout]) -> list[Tensor]:
        R, W = self._rank, self._world
        chunks = [lay.rows[0] for lay in lays]  # ceil(m/W): every rank pads its rows to it
        padded = [
            torch.nn.functional.pad(mh, (0, 0, 0, c - mh.shape[0])).reshape(-1)
            for mh, c in zip(m_hats, chunks, strict=True)
        ]
        send = cat_or_empty(padded, torch.float32, m_hats[0].device)
        recv = send.new_empty(W * send.numel())
        all_gather_into(recv, send, self._group)
        self._sent((W - 1) * send.numel() * send.element_size())
        per_rank = [part.split([c * lay.n for c, lay in zip(chunks, lays, strict=True)]) for part in recv.view(W, -1)]
        fulls = [
            torch.cat([per_rank[s][k].view(c, lay.n)[: lay.rows[s]] for s in range(W)])
            for k, (c, lay) in enumerate(zip(chunks, lays, strict=True))
        ]
        del recv, per_rank
        q_full = self._ns(group, fulls)
        return [q[lay.starts[R] : lay.starts[R] + lay.rows[R]].float() for q, lay in zip(q_full, lays, strict=True)]
