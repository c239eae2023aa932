"""Sharded execution of the Muon family (DESIGN "Sharded execution"): FSDP2 and DDP.

Newton–Schulz needs whole matrices; everything else in the step is elementwise or a sum over
elements. So both subclasses keep ``MuonFamily``'s step and replace only (b) ``orthogonalize``
(and, for row shards, the ``_local`` accessor and the ``reduce_sums_of_squares`` hook):

* ``ShardedMuonFamily`` (FSDP2, params are DTensors ``Shard(0)`` on a 1-D mesh). Momentum is a
  DTensor shard like its weight; all elementwise math runs on ``to_local()`` shards. Each matrix
  has ONE owner rank (``assign_owners``: greedy longest-processing-time on the NS cost
  m·n·min(m,n), deterministic, the same on every rank). Per bucket, one ``all_to_all_single``
  sends the M̂ row shards to their owners, the owners run NS (batched by shape), and a second one
  returns each rank its Q rows (in the NS dtype: bf16 Q is sent as bf16, bit-identical to the
  ``.float()`` of a single-process run). Row shards follow DTensor's ``Shard(0)`` layout
  (``row_split``: ceil(m/W) rows per rank, the last ones short or EMPTY). The trust ratio's
  norms are local partial sums in one [N, 6] tensor, summed by ONE ``all_reduce`` per step, so
  every rank holds the same r and c. ``mode="replicate"``: one ``all_gather`` per bucket of the
  (row-padded) M̂ shards, NS on every rank, keep the local rows (a debugging reference).
* ``ReplicatedMuonFamily`` (DDP: grads already all-reduced, params and momentum replicated).
  Every rank updates every momentum buffer (cheap; the state stays identical everywhere and a
  checkpoint loads at any world size); NS runs only on the owner, and the owners' Qs are shared
  with one ``all_gather`` per bucket. Norms are local (whole matrices). ``mode="replicate"``:
  every rank runs every NS, no communication (the single-process step).

Counters of the latest step (host ints, on every rank): ``ns_calls`` (matrices orthogonalised
here), ``bytes_sent`` (bytes this rank put on the wire: all_to_all counts what goes to other
ranks; all_gather and all_reduce count a ring algorithm's (W−1)·chunk and 2(W−1)/W·size) and
``n_collectives``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from orscale.muon_family import GroupWork, MuonFamily, ParamsT
from orscale.newton_schulz import newton_schulz_many, resolve_ns_dtype

MODES = ("owner", "replicate")
DEFAULT_BUCKET_NUMEL = 1 << 27  # whole-matrix elements per bucket (512 MB of fp32 M̂)


def ns_cost(shape: tuple[int, ...]) -> int:
    """Newton–Schulz flops up to a constant: m·n·min(m, n)."""
    m, n = shape
    return m * n * min(m, n)


def assign_owners(shapes: list[tuple[int, ...]], world: int) -> list[int]:
    """Owner rank per matrix: greedy longest-processing-time on ``ns_cost`` (largest first, each
    to the least-loaded rank; ties by index and by lowest rank), the same on every rank."""
    owners = [0] * len(shapes)
    load = [0] * world
    for i in sorted(range(len(shapes)), key=lambda i: (-ns_cost(shapes[i]), i)):
        r = min(range(world), key=lambda k: (load[k], k))
        owners[i] = r
        load[r] += ns_cost(shapes[i])
    return owners


def row_split(m: int, world: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(rows, first row) per rank of DTensor's ``Shard(0)`` / FSDP2 layout: ceil(m/W) rows per
    rank, the last ranks short or empty (m = 5, W = 2: (3, 2); m = 1, W = 2: (1, 0))."""
    chunk = -(-m // world)
    starts = tuple(min(r * chunk, m) for r in range(world))
    sizes = tuple(max(0, min(chunk, m - s)) for s in starts)
    return sizes, starts


def make_buckets(numels: list[int], cap: int) -> list[list[int]]:
    """Consecutive positions grouped so that each bucket holds ≤ cap elements (≥ 1 matrix)."""
    out: list[list[int]] = []
    total = 0
    for i, k in enumerate(numels):
        if not out or total + k > cap:
            out.append([])
            total = 0
        out[-1].append(i)
        total += k
    return out


def _all_gather(out: Tensor, inp: Tensor, group: Optional[dist.ProcessGroup]) -> None:
    """Every rank's equal-size `inp`, rank-major, into `out` (newer torch: all_gather_single)."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp, group=group)


def _cat(ts: list[Tensor], dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.cat(ts) if ts else torch.empty(0, dtype=dtype, device=device)


@dataclass(frozen=True)
class Layout:
    owner: int  # rank that orthogonalises this matrix
    m: int
    n: int
    rows: tuple[int, ...]  # rows held by each rank (all m for replicated params)
    starts: tuple[int, ...]  # first row held by each rank


class _Distributed(MuonFamily):
    """What both sharded flavours share: owners, buckets, counters."""

    _sharded_rows = False  # params are row shards (FSDP2) rather than whole replicated matrices
    # set by the subclasses before the first _build_consts (defaults: a single process)
    _group: Optional[dist.ProcessGroup] = None
    _rank = 0
    _world = 1

    def __init__(self, params: ParamsT, lr: float = 1e-3, weight_decay: float = 0.1, *,
                 mode: str = "owner", bucket_numel: int = DEFAULT_BUCKET_NUMEL,
                 **kwargs: Any) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if bucket_numel < 1:
            raise ValueError(f"bucket_numel must be >= 1, got {bucket_numel}")
        self.mode, self.bucket_numel = mode, bucket_numel
        self._layout: dict[int, Layout] = {}
        super().__init__(params, lr, weight_decay, **kwargs)

    def _build_consts(self) -> None:
        super()._build_consts()
        ps = [p for g in self.param_groups for p in g["params"]]
        owners = assign_owners([tuple(p.shape) for p in ps], self._world)
        self._layout = {}
        for p, o in zip(ps, owners):
            m, n = p.shape
            rows, starts = (row_split(m, self._world) if self._sharded_rows
                            else ((m,) * self._world, (0,) * self._world))
            self._layout[id(p)] = Layout(o, m, n, rows, starts)

    def owners(self) -> list[list[int]]:
        """Owner rank of every matrix, per param group (for tests and logs)."""
        return [[self._layout[id(p)].owner for p in g["params"]] for g in self.param_groups]

    def _sent(self, nbytes: float) -> None:
        self.bytes_sent += int(nbytes)
        self.n_collectives += 1

    def _ns(self, group: dict[str, Any], mats: list[Tensor]) -> list[Tensor]:
        """NS in the group's dtype (not cast back: the caller sends or casts)."""
        self.ns_calls += len(mats)
        if not mats:
            return []
        return newton_schulz_many(mats, group["ns_steps"], group["ns_coefficients"],
                                  group["ns_dtype"])

    def orthogonalize(self, w: GroupWork, m_hats: list[Tensor]) -> list[Tensor]:
        """(b), distributed: per bucket of matrices, ``_orthogonalize_bucket`` returns this
        rank's part of Q (local rows, or the whole matrix when replicated) in fp32."""
        if self._world == 1 or (self.mode == "replicate" and not self._sharded_rows):
            return super().orthogonalize(w, m_hats)
        lays = [self._layout[id(p)] for p in w.params]
        qs: list[Tensor] = [None] * len(m_hats)  # type: ignore[list-item]
        for bucket in make_buckets([lay.m * lay.n for lay in lays], self.bucket_numel):
            out = self._orthogonalize_bucket(w.group, [m_hats[i] for i in bucket],
                                             [lays[i] for i in bucket])
            for i, q in zip(bucket, out):
                qs[i] = q
        return qs

    def _orthogonalize_bucket(self, group: dict[str, Any], m_hats: list[Tensor],
                              lays: list[Layout]) -> list[Tensor]:
        raise NotImplementedError


class ShardedMuonFamily(_Distributed):
    """MuonFamily over FSDP2 params (DTensors sharded on dim 0 of a 1-D mesh); see module doc.

    ``mode``: ``"owner"`` (NS on one rank per matrix, all_to_all there and back) or
    ``"replicate"`` (all_gather M̂, NS everywhere). ``bucket_numel`` caps the whole-matrix
    elements per collective (default: one bucket up to 2²⁷ elements). Other arguments as
    ``MuonFamily``.
    """

    _sharded_rows = True

    def __init__(self, params: ParamsT, lr: float = 1e-3, weight_decay: float = 0.1, *,
                 mode: str = "owner", bucket_numel: int = DEFAULT_BUCKET_NUMEL,
                 **kwargs: Any) -> None:
        self._mesh = None
        super().__init__(params, lr, weight_decay, mode=mode, bucket_numel=bucket_numel, **kwargs)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        from torch.distributed.tensor import DTensor, Shard

        params = param_group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        param_group["params"] = params  # a generator would be spent by the checks below
        for item in params:
            p = item[1] if isinstance(item, tuple) else item
            name = item[0] if isinstance(item, tuple) else "a parameter"
            if not isinstance(p, DTensor):
                raise ValueError(f"ShardedMuonFamily needs DTensor (FSDP2) params; {name} is a "
                                 "plain tensor: use MuonFamily or ReplicatedMuonFamily")
            if p.device_mesh.ndim != 1 or tuple(p.placements) != (Shard(0),):
                raise NotImplementedError(
                    f"ShardedMuonFamily supports Shard(0) on a 1-D mesh; {name} has "
                    f"{tuple(p.placements)} on a {p.device_mesh.ndim}-D mesh")
            if self._mesh is None:
                self._mesh = p.device_mesh
                self._group = p.device_mesh.get_group()
                self._rank, self._world = p.device_mesh.get_local_rank(), p.device_mesh.size()
            elif p.device_mesh != self._mesh:
                raise ValueError(f"ShardedMuonFamily: {name} lives on another device mesh")
            if p.ndim == 2 and p.to_local().shape[0] != row_split(p.shape[0], self._world)[0][
                    self._rank]:
                raise NotImplementedError(f"{name}: local shard {tuple(p.to_local().shape)} is "
                                          "not DTensor's even Shard(0) chunking")
        super().add_param_group(param_group)

    def _local(self, t: Tensor) -> Tensor:
        return t.to_local()

    def reduce_sums_of_squares(self, sums: Tensor) -> Tensor:
        """Partial sums over row shards → totals: ONE all_reduce for every matrix of the step."""
        if self._world > 1:
            dist.all_reduce(sums, group=self._group)
            self._sent(2 * (self._world - 1) / self._world * sums.numel() * sums.element_size())
        return sums

    def _orthogonalize_bucket(self, group: dict[str, Any], m_hats: list[Tensor],
                              lays: list[Layout]) -> list[Tensor]:
        if self.mode == "replicate":
            return self._replicate_bucket(group, m_hats, lays)
        return self._owner_bucket(group, m_hats, lays)

    def _a2a(self, send: Tensor, out_splits: list[int], in_splits: list[int]) -> Tensor:
        recv = send.new_empty(sum(out_splits))
        dist.all_to_all_single(recv, send, out_splits, in_splits, group=self._group)
        self._sent((sum(in_splits) - in_splits[self._rank]) * send.element_size())
        return recv

    def _owner_bucket(self, group: dict[str, Any], m_hats: list[Tensor],
                      lays: list[Layout]) -> list[Tensor]:
        R, W = self._rank, self._world
        dev = m_hats[0].device
        # 1. Every M̂ row shard to its matrix's owner: destination-major, bucket order within.
        by_owner = [[k for k, lay in enumerate(lays) if lay.owner == d] for d in range(W)]
        to_owner = [[m_hats[k].reshape(-1) for k in ks] for ks in by_owner]
        in_splits = [sum(t.numel() for t in ts) for ts in to_owner]
        mine = by_owner[R]
        out_splits = [sum(lays[k].rows[s] * lays[k].n for k in mine) for s in range(W)]
        recv = self._a2a(_cat([t for ts in to_owner for t in ts], torch.float32, dev),
                         out_splits, in_splits)
        pieces = [chunk.split([lays[k].rows[s] * lays[k].n for k in mine])
                  for s, chunk in enumerate(recv.split(out_splits))]
        fulls = [torch.cat([pieces[s][j].view(lays[k].rows[s], lays[k].n) for s in range(W)])
                 for j, k in enumerate(mine)]
        del recv, pieces
        # 2. NS on the owned matrices (batched by shape).
        q_full = self._ns(group, fulls)
        del fulls
        # 3. Each rank's Q rows back to it, in the NS dtype (what the unsharded step casts).
        q_dtype = resolve_ns_dtype(group["ns_dtype"])
        back = [q[lays[k].starts[d]:lays[k].starts[d] + lays[k].rows[d]].reshape(-1)
                for d in range(W) for k, q in zip(mine, q_full)]
        recv = self._a2a(_cat(back, q_dtype, dev), in_splits, out_splits)
        del back, q_full
        out: list[Tensor] = [None] * len(lays)  # type: ignore[list-item]
        for s, chunk in enumerate(recv.split(in_splits)):
            ks = by_owner[s]
            for k, t in zip(ks, chunk.split([lays[k].rows[R] * lays[k].n for k in ks])):
                out[k] = t.view(lays[k].rows[R], lays[k].n).float()
        return out

    def _replicate_bucket(self, group: dict[str, Any], m_hats: list[Tensor],
                          lays: list[Layout]) -> list[Tensor]:
        R, W = self._rank, self._world
        chunks = [lay.rows[0] for lay in lays]  # ceil(m/W): every rank pads its rows to it
        padded = [torch.nn.functional.pad(mh, (0, 0, 0, c - mh.shape[0])).reshape(-1)
                  for mh, c in zip(m_hats, chunks)]
        send = _cat(padded, torch.float32, m_hats[0].device)
        recv = send.new_empty(W * send.numel())
        _all_gather(recv, send, self._group)
        self._sent((W - 1) * send.numel() * send.element_size())
        per_rank = [part.split([c * lay.n for c, lay in zip(chunks, lays)])
                    for part in recv.view(W, -1)]
        fulls = [torch.cat([per_rank[s][k].view(c, lay.n)[:lay.rows[s]] for s in range(W)])
                 for k, (c, lay) in enumerate(zip(chunks, lays))]
        del recv, per_rank
        q_full = self._ns(group, fulls)
        return [q[lay.starts[R]:lay.starts[R] + lay.rows[R]].float()
                for q, lay in zip(q_full, lays)]


class ReplicatedMuonFamily(_Distributed):
    """MuonFamily for DDP (plain, replicated params; gradients already all-reduced).

    ``mode="owner"``: NS only on each matrix's owner, Qs shared by one all_gather per bucket;
    ``mode="replicate"``: every rank runs every NS. ``process_group``: default the world group
    (a single process without ``torch.distributed`` runs the plain step).
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, weight_decay: float = 0.1, *,
                 mode: str = "owner", bucket_numel: int = DEFAULT_BUCKET_NUMEL,
                 process_group: Optional[dist.ProcessGroup] = None, **kwargs: Any) -> None:
        if dist.is_available() and dist.is_initialized():
            self._group = process_group
            self._rank = dist.get_rank(process_group)
            self._world = dist.get_world_size(process_group)
        super().__init__(params, lr, weight_decay, mode=mode, bucket_numel=bucket_numel, **kwargs)

    def _orthogonalize_bucket(self, group: dict[str, Any], m_hats: list[Tensor],
                              lays: list[Layout]) -> list[Tensor]:
        R, W = self._rank, self._world
        by_owner = [[k for k, lay in enumerate(lays) if lay.owner == d] for d in range(W)]
        sizes = [sum(lays[k].m * lays[k].n for k in ks) for ks in by_owner]
        width = max(sizes)
        qs = self._ns(group, [m_hats[k] for k in by_owner[R]])
        dtype = resolve_ns_dtype(group["ns_dtype"])
        send = torch.zeros(width, dtype=dtype, device=m_hats[0].device)
        if qs:
            send[:sizes[R]].copy_(torch.cat([q.reshape(-1) for q in qs]))
        recv = send.new_empty(W * width)
        _all_gather(recv, send, self._group)
        self._sent((W - 1) * send.numel() * send.element_size())
        out: list[Tensor] = [None] * len(lays)  # type: ignore[list-item]
        for s, part in enumerate(recv.view(W, width)):
            ks = by_owner[s]
            for k, t in zip(ks, part[:sizes[s]].split([lays[k].m * lays[k].n for k in ks])):
                out[k] = t.view(lays[k].m, lays[k].n).float()
        return out

