"""The Muon family over FSDP2 parameters: DTensors ``Shard(0)`` on a 1-D mesh, or HSDP's
``(Replicate(), Shard(0))`` on a 2-D ("replicate", "shard") mesh.

Momentum is a DTensor shard like its weight; all elementwise math runs on ``to_local()`` shards.
Per bucket, one ``all_to_all_single`` sends the M̂ row shards to their owners, the owners run NS
(batched by shape), and a second one returns each rank its Q rows (in the NS dtype: bf16 Q is sent
as bf16, bit-identical to the ``.float()`` of a single-process run). Row shards follow DTensor's
``Shard(0)`` layout (``row_split``: ceil(m/S) rows per rank, the last ones short or EMPTY). The
trust ratio's norms are local partial sums in one [N, 6] tensor (with a member's own columns:
``MuonFamily.shape_directions``), summed by ONE ``all_reduce`` per step over the ranks that hold a
matrix's rows, so every rank holds the same r and c.

HSDP: every replica group holds the same shards (FSDP2 all-reduces the gradients across
"replicate"), so by default the exchange and the norm sums stay inside the shard group and NS runs
once per matrix per replica group (Dion's and torchtitan's way). ``replica_split=True`` also
splits the NS work across the R replica groups: each group orthogonalises the matrices dealt to it
(``assign_owners`` over groups, then over its shard ranks), exchanges them inside its shard group
as above, and one ``all_gather`` across "replicate" (rank s of every group) shares the Q rows:
1/R of the NS FLOPs per rank for about (R−1)/R of the local Q rows crossing "replicate"
(docs/scaling.md says when that pays).
``mode="replicate"``: one ``all_gather`` per bucket of the (row-padded) M̂ shards within the shard
group, NS on every rank, keep the local rows (a debugging reference).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from orscale.distributed.owners import (
    DEFAULT_BUCKET_NUMEL,
    ExchangePlan,
    InFlight,
    Layout,
    OwnerMuonFamily,
    a2a_sent,
    all_gather_into,
    cat_or_empty,
    exchange_plan,
    landed,
    row_split,
)
from orscale.muon_family import N_COLS
from orscale.newton_schulz import resolve_ns_dtype
from orscale.optim_common import ParamsT, TensorList

PLACEMENTS = {1: (Shard(0),), 2: (Replicate(), Shard(0))}  # FSDP2, HSDP


class ShardedMuonFamily(OwnerMuonFamily):
    """MuonFamily over FSDP2 / HSDP params (DTensors sharded on dim 0); see module doc.

    ``mode``: ``"owner"`` (NS on one rank per matrix, all_to_all there and back) or
    ``"replicate"`` (all_gather M̂, NS everywhere). ``replica_split``: on an HSDP mesh, NS owners
    across the replica groups too. ``bucket_numel`` caps the whole-matrix elements per
    collective; ``overlap`` pipelines the buckets (``OwnerMuonFamily.orthogonalize``). Other
    arguments as ``MuonFamily``.
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
        overlap: bool = True,
        replica_split: bool = False,
        **kwargs: Any,
    ) -> None:
        self._mesh: DeviceMesh | None = None
        self._share_group: dist.ProcessGroup | None = None  # "replicate": the replica split shares Q over it
        self.replica_split = replica_split
        super().__init__(params, lr, weight_decay, mode=mode, bucket_numel=bucket_numel, overlap=overlap, **kwargs)

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
            if PLACEMENTS.get(p.device_mesh.ndim) != tuple(p.placements):
                raise NotImplementedError(
                    f"ShardedMuonFamily supports Shard(0) on a 1-D mesh and (Replicate(), Shard(0)) on a "
                    f"2-D (HSDP) mesh; {name} has {tuple(p.placements)} on a {p.device_mesh.ndim}-D mesh"
                )
            if self._mesh is None:
                self._use_mesh(p.device_mesh)
            elif p.device_mesh != self._mesh:
                raise ValueError(f"ShardedMuonFamily: {name} lives on another device mesh")
            shard = self._rank % self._shards
            if p.ndim == 2 and p.to_local().shape[0] != row_split(p.shape[0], self._shards)[0][shard]:
                raise NotImplementedError(
                    f"{name}: local shard {tuple(p.to_local().shape)} is not DTensor's even Shard(0) chunking"
                )
        super().add_param_group(param_group)

    def _use_mesh(self, mesh: DeviceMesh) -> None:
        """The groups of `mesh`: shard = its last dim (FSDP2 puts "replicate" first); with the
        replica split, owner slots over both dims (rank = replica·shards + shard, the mesh order)."""
        self._mesh = mesh
        dim = mesh.ndim - 1
        self._group = mesh.get_group(dim)
        self._shards, self._rank = mesh.size(dim), mesh.get_local_rank(dim)
        if self.replica_split and mesh.ndim == 2 and mesh.size(0) > 1 and self.mode == "owner":
            self._share_group, self._replicas = mesh.get_group(0), mesh.size(0)
            self._rank += mesh.get_local_rank(0) * self._shards
        self._world = self._replicas * self._shards

    def _local(self, t: Tensor) -> Tensor:
        return t.to_local() if isinstance(t, DTensor) else t  # every param here is one (checked on add)

    def reduce_sums_of_squares(self, sums: Tensor) -> Tensor:
        """Partial sums over row shards → totals: ONE all_reduce (shard group) for every matrix."""
        if self._shards > 1:
            dist.all_reduce(sums, group=self._group)
            self._sent(self._all_reduce_bytes(sums.numel()))  # the tensor sent, against the plan's count
        return sums

    def _norm_bytes(self, n_matrices: int) -> int:
        return self._all_reduce_bytes(n_matrices * (N_COLS + self.extra_sum_columns))

    def _all_reduce_bytes(self, numel: int) -> int:
        S = self._shards  # a ring all_reduce of `numel` fp32: 2(S−1)/S of it
        return int(2 * (S - 1) / S * numel * 4) if S > 1 else 0

    def _bucket_bytes(self, lays: list[Layout], rank: int, q_bytes: int) -> int:
        S, me = self._shards, rank % self._shards
        if self.mode == "replicate":  # one all_gather of the row-padded M̂ shards
            return (S - 1) * sum(lay.rows[0] * lay.n for lay in lays) * 4 if S > 1 else 0
        plan = exchange_plan(lays, rank, S, self._replicas)
        out = (a2a_sent(plan.to_owner, me) * 4 + a2a_sent(plan.at_owner, me) * q_bytes) if S > 1 else 0
        if self._replicas > 1:
            out += (self._replicas - 1) * max(plan.shared) * q_bytes
        return out

    def _a2a(self, recv: Tensor, send: Tensor, recv_splits: list[int], send_splits: list[int]) -> Any:
        """One all_to_all in the shard group, started; counts what leaves this rank."""
        if self._shards == 1:  # HSDP with one rank per shard group: nothing to exchange
            recv.copy_(send)
            return None
        work = dist.all_to_all_single(recv, send, recv_splits, send_splits, group=self._group, async_op=True)
        self._sent(a2a_sent(send_splits, self._rank % self._shards) * send.element_size())
        return work

    def _to_owners(self, group: dict[str, Any], m_hats: TensorList, lays: list[Layout]) -> InFlight:
        if self.mode == "replicate":
            return self._gather_everywhere(m_hats, lays)
        S = self._shards
        plan = exchange_plan(lays, self._rank, S, self._replicas)
        # Every M̂ row shard to its matrix's owner: destination-major, bucket order within.
        send = cat_or_empty([m_hats[k].reshape(-1) for ks in plan.by_owner for k in ks], torch.float32, self._device)
        recv = send.new_empty(sum(plan.at_owner))
        work = self._a2a(recv, send, plan.at_owner, plan.to_owner)
        mine = plan.by_owner[self._rank % S]

        def assemble() -> list[Tensor]:
            chunks = recv.split(plan.at_owner)
            pieces = [chunks[t].split([lays[k].rows[t] * lays[k].n for k in mine]) for t in range(S)]
            return [
                torch.cat([pieces[t][j].view(lays[k].rows[t], lays[k].n) for t in range(S)]) for j, k in enumerate(mine)
            ]

        return InFlight([work], assemble, (send, recv))

    def _from_owners(self, group: dict[str, Any], q_full: list[Tensor], lays: list[Layout]) -> InFlight:
        S, me = self._shards, self._rank % self._shards
        if self.mode == "replicate":
            return landed(
                [q[lay.starts[me] : lay.starts[me] + lay.rows[me]].float() for q, lay in zip(q_full, lays, strict=True)]
            )
        plan = exchange_plan(lays, self._rank, S, self._replicas)
        q_dtype = resolve_ns_dtype(group["ns_dtype"])
        # Each rank's Q rows back to it, in the NS dtype (what the unsharded step casts).
        back = [
            q[lays[k].starts[d] : lays[k].starts[d] + lays[k].rows[d]].reshape(-1)
            for d in range(S)
            for k, q in zip(plan.by_owner[me], q_full, strict=True)
        ]
        send = cat_or_empty(back, q_dtype, self._device)
        recv = send.new_empty(sum(plan.to_owner))
        work = self._a2a(recv, send, plan.to_owner, plan.at_owner)

        def unpack() -> list[Tensor] | InFlight:
            out: dict[int, Tensor] = {}
            for s, chunk in enumerate(recv.split(plan.to_owner)):
                ks = plan.by_owner[s]
                for k, t in zip(ks, chunk.split([lays[k].rows[me] * lays[k].n for k in ks]), strict=True):
                    out[k] = t.view(lays[k].rows[me], lays[k].n)
            if self._replicas == 1:
                return [out[k].float() for k in range(len(lays))]
            return self._share(plan, [out[k] for k in sorted(out)], lays, q_dtype)

        return InFlight([work], unpack, (send, recv))

    def _share(self, plan: ExchangePlan, mine: list[Tensor], lays: list[Layout], q_dtype: torch.dtype) -> InFlight:
        """Replica split: this group's Q rows to the same shard rank of every other group (one
        all_gather across "replicate", each group's part padded to the largest)."""
        R, me = self._replicas, self._rank % self._shards
        width = max(plan.shared)
        send = torch.zeros(width, dtype=q_dtype, device=self._device)
        if mine:
            send[: plan.shared[self._rank // self._shards]].copy_(torch.cat([t.reshape(-1) for t in mine]))
        recv = send.new_empty(R * width)
        work = all_gather_into(recv, send, self._share_group, async_op=True)
        self._sent((R - 1) * width * send.element_size())

        def unpack() -> list[Tensor]:
            out: dict[int, Tensor] = {}
            for r, part in enumerate(recv.view(R, width)):
                ks = plan.by_replica[r]
                for k, t in zip(
                    ks, part[: plan.shared[r]].split([lays[k].rows[me] * lays[k].n for k in ks]), strict=True
                ):
                    out[k] = t.view(lays[k].rows[me], lays[k].n).float()
            return [out[k] for k in range(len(lays))]

        return InFlight([work], unpack, (send, recv))

    def _gather_everywhere(self, m_hats: TensorList, lays: list[Layout]) -> InFlight:
        """mode="replicate": every rank of the shard group gets every whole M̂ of the bucket."""
        S = self._world
        chunks = [lay.rows[0] for lay in lays]  # ceil(m/S): every rank pads its rows to it
        padded = [
            torch.nn.functional.pad(mh, (0, 0, 0, c - mh.shape[0])).reshape(-1)
            for mh, c in zip(m_hats, chunks, strict=True)
        ]
        send = cat_or_empty(padded, torch.float32, self._device)
        recv = send.new_empty(S * send.numel())
        work = all_gather_into(recv, send, self._group, async_op=True)
        self._sent((S - 1) * send.numel() * send.element_size())

        def assemble() -> list[Tensor]:
            per_rank = [
                part.split([c * lay.n for c, lay in zip(chunks, lays, strict=True)]) for part in recv.view(S, -1)
            ]
            return [
                torch.cat([per_rank[s][k].view(c, lay.n)[: lay.rows[s]] for s in range(S)])
                for k, (c, lay) in enumerate(zip(chunks, lays, strict=True))
            ]

        return InFlight([work], assemble, (send, recv))
