"""Owner-rank execution of the Muon family (DESIGN "Sharded execution"), shared by FSDP2 and DDP.

Newton–Schulz needs whole matrices; everything else in the step is elementwise or a sum over
elements. So the distributed subclasses keep ``MuonFamily``'s step and replace only (b)
``orthogonalize`` (and, for row shards, the ``_local`` accessor and the ``reduce_sums_of_squares``
hook). Each matrix has ONE owner rank (``assign_owners``: greedy longest-processing-time on the NS
cost m·n·min(m,n), deterministic, the same on every rank); work travels in buckets of whole-matrix
elements (``make_buckets``).

* ``orscale.distributed.fsdp.ShardedMuonFamily``: FSDP2 DTensor row shards, all_to_all to owners.
* ``orscale.distributed.ddp.ReplicatedMuonFamily``: DDP replicated params, NS on owners, all_gather.
* ``orscale.distributed.zero.ZeroShardedOptimizer``: DeepSpeed ZeRO-1/2 flat partitions.

Counters of the latest step (host ints, on every rank): ``ns_calls`` (matrices orthogonalised
here), ``bytes_sent`` (bytes this rank put on the wire: all_to_all counts what goes to other
ranks; all_gather and all_reduce count a ring algorithm's (W−1)·chunk and 2(W−1)/W·size) and
``n_collectives``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from orscale.muon_family import GroupWork, MuonFamily
from orscale.newton_schulz import newton_schulz_many
from orscale.optim_common import ParamsT, TensorList

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


def all_gather_into(out: Tensor, inp: Tensor, group: dist.ProcessGroup | None) -> None:
    """Every rank's equal-size `inp`, rank-major, into `out` (newer torch: all_gather_single)."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp, group=group)


def cat_or_empty(ts: list[Tensor], dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.cat(ts) if ts else torch.empty(0, dtype=dtype, device=device)


@dataclass(frozen=True)
class Layout:
    owner: int  # rank that orthogonalises this matrix
    m: int
    n: int
    rows: tuple[int, ...]  # rows held by each rank (all m for replicated params)
    starts: tuple[int, ...]  # first row held by each rank


class OwnerMuonFamily(MuonFamily):
    """What both sharded flavours share: owners, buckets, counters."""

    _sharded_rows = False  # params are row shards (FSDP2) rather than whole replicated matrices
    # set by the subclasses before the first _build_consts (defaults: a single process)
    _group: dist.ProcessGroup | None = None
    _rank = 0
    _world = 1

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
        for p, o in zip(ps, owners, strict=True):
            m, n = p.shape
            rows, starts = row_split(m, self._world) if self._sharded_rows else ((m,) * self._world, (0,) * self._world)
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
        return newton_schulz_many(mats, group["ns_steps"], group["ns_coefficients"], group["ns_dtype"])

    def orthogonalize(self, w: GroupWork, m_hats: TensorList) -> list[Tensor]:
        """(b), distributed: per bucket of matrices, ``_orthogonalize_bucket`` returns this
        rank's part of Q (local rows, or the whole matrix when replicated) in fp32."""
        if self._world == 1 or (self.mode == "replicate" and not self._sharded_rows):
            return super().orthogonalize(w, m_hats)
        lays = [self._layout[id(p)] for p in w.params]
        qs: dict[int, Tensor] = {}
        for bucket in make_buckets([lay.m * lay.n for lay in lays], self.bucket_numel):
            out = self._orthogonalize_bucket(w.group, [m_hats[i] for i in bucket], [lays[i] for i in bucket])
            qs.update(zip(bucket, out, strict=True))
        return [qs[i] for i in range(len(m_hats))]

    def _orthogonalize_bucket(self, group: dict[str, Any], m_hats: TensorList, lays: list[Layout]) -> list[Tensor]:
        raise NotImplementedError
