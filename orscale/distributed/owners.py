"""Owner-rank execution of the Muon family, shared by FSDP2 and DDP.

Newton–Schulz needs whole matrices; everything else in the step is elementwise or a sum over
elements. So the distributed subclasses keep ``MuonFamily``'s step and replace only (b)
``orthogonalize`` (and, for row shards, the ``_local`` accessor and the ``reduce_sums_of_squares``
hook). Each matrix has ONE owner rank (``assign_owners``: greedy longest-processing-time on the NS
cost m·n·min(m,n), deterministic, the same on every rank); work travels in buckets of whole-matrix
elements (``make_buckets``).

* ``orscale.distributed.fsdp.ShardedMuonFamily``: FSDP2 DTensor row shards (1-D mesh, or HSDP's
  2-D "replicate" × "shard" mesh), all_to_all to owners and back.
* ``orscale.distributed.ddp.ReplicatedMuonFamily``: DDP replicated params, NS on owners; each bucket
  holds up to one run of matrices per owner (``owner_buckets``), shared by one all_gather (or, where
  few owners would leave it mostly padding, one broadcast per owner).
* ``orscale.distributed.zero.ZeroShardedOptimizer``: DeepSpeed ZeRO-1/2 flat partitions.

The buckets run as a pipeline (``overlap=True``): the collective that brings bucket k+1 to its
owners is in flight (``async_op``) while bucket k's NS runs, and the one that returns bucket k while
k+1's NS runs; the same collectives on the same data as ``overlap=False``, so the result is the same
bit for bit. ``exchange_plan`` is the one account of who sends what to whom (the optimizer's
collectives and ``bench/bench_scaling.py``'s byte model both read it).

Counters of the latest step (host ints, on every rank): ``ns_calls`` (matrices orthogonalised
here), ``bytes_sent`` (bytes this rank put on the wire: all_to_all counts what goes to other
ranks; all_gather, all_reduce and broadcast count a ring algorithm's (W−1)·chunk, 2(W−1)/W·size
and, on every rank but the root's predecessor in the ring, the buffer) and ``n_collectives``.
``planned_bytes_sent(rank)`` is the same count for any rank of a step in which every matrix has
a gradient, from the same plans (the dry run, ``python -m launch.dryrun``, reads it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from orscale.muon_family import GroupWork, MuonFamily, matrix_shape
from orscale.newton_schulz import newton_schulz_many, resolve_ns_dtype
from orscale.optim_common import ParamsT, TensorList

MODES = ("owner", "replicate")
# Whole-matrix elements per bucket (8 MB of fp32 M̂). Measured with overlap on (bench/bench_overlap.py,
# docs/scaling.md): 0.92-0.94x the one-bucket step on 2 and 4 CPU ranks, FSDP2 and HSDP, where 2^19
# and 2^17 were not reliably faster (up to 1.3x slower: more collectives); matrices larger than
# it (125m and up) travel one per bucket, which is what the pipeline needs to overlap anything.
# DDP's buckets (owner_buckets) apply the cap to each owner's run: up to W matrices per bucket.
DEFAULT_BUCKET_NUMEL = 1 << 21


def ns_cost(shape: tuple[int, ...]) -> int:
    """Newton–Schulz flops up to a constant: m·n·min(m, n)."""
    m, n = shape
    return m * n * min(m, n)


def ns_flops(shape: tuple[int, ...], steps: int) -> float:
    """FLOPs of one m × n matrix's NS (``newton_schulz._iterate`` on the wide orientation, m ≤ n):
    per iteration A = XXᵀ (2m²n), A² (2m³), (bA + cA²)·X (2m²n)."""
    m, n = sorted(shape[-2:])
    return steps * (4 * m * m * n + 2 * m**3)


def assign_owners(shapes: list[tuple[int, ...]], world: int, replicas: int = 1) -> list[int]:
    """Owner rank per matrix: greedy longest-processing-time on ``ns_cost`` (largest first, each
    to the least-loaded rank; ties by index and by lowest rank), the same on every rank.
    ``replicas`` > 1 (HSDP's replica split): the same rule first deals the matrices to the replica
    groups, then each group's to its world // replicas ranks; owner = replica·shards + shard."""
    if replicas > 1:
        shards, owners = world // replicas, [0] * len(shapes)
        group = assign_owners(shapes, replicas)
        for r in range(replicas):
            idx = [i for i, g in enumerate(group) if g == r]
            for i, o in zip(idx, assign_owners([shapes[i] for i in idx], shards), strict=True):
                owners[i] = r * shards + o
        return owners
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


def owner_buckets(owners: list[int], numels: list[int], world: int, cap: int) -> list[list[int]]:
    """Buckets in which every owner contributes its own matrices (Muon's layout): each rank's
    matrices, largest first, cut into runs of ≤ cap elements (≥ 1 matrix: ``make_buckets``);
    bucket j holds every rank's j-th run, so it has up to `world` owners and matrices of one size
    travel together (an all_gather pads each rank's run to the bucket's longest). Positions sorted."""
    runs = []
    for r in range(world):
        mine = sorted((i for i, o in enumerate(owners) if o == r), key=lambda i: (-numels[i], i))
        runs.append([[mine[k] for k in b] for b in make_buckets([numels[i] for i in mine], cap)])
    return [sorted(i for rr in runs if j < len(rr) for i in rr[j]) for j in range(max(map(len, runs), default=0))]


def a2a_sent(send_splits: list[int], me: int) -> int:
    """Elements an all_to_all takes from rank `me` to the others (its own split stays home)."""
    return sum(send_splits) - send_splits[me]


def all_gather_into(out: Tensor, inp: Tensor, group: dist.ProcessGroup | None, async_op: bool = False) -> Any:
    """Every rank's equal-size `inp`, rank-major, into `out` (newer torch: all_gather_single)."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


def cat_or_empty(ts: list[Tensor], dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.cat(ts) if ts else torch.empty(0, dtype=dtype, device=device)


@dataclass(frozen=True)
class Layout:
    owner: int  # who orthogonalises it: replica group · shards + shard rank (group 0 but with the replica split)
    m: int
    n: int
    rows: tuple[int, ...]  # rows held by each shard rank (all m for replicated params)
    starts: tuple[int, ...]  # first row held by each shard rank


@dataclass(frozen=True)
class ExchangePlan:
    """One bucket's exchange from one rank's side, in elements. Rank g = replica·shards + shard
    (HSDP's mesh order) holds the rows of shard g % shards. Inside the shard group one all_to_all
    takes the M̂ rows of the replica group's own matrices to their owners and one brings the Q rows
    back (the same splits, swapped); with the replica split, one all_gather across "replicate" then
    shares every rank's Q rows of its group's matrices with the other groups."""

    by_owner: list[list[int]]  # bucket positions each shard rank of this replica group owns
    to_owner: list[int]  # M̂ elements this rank sends to each shard rank (its Q elements back)
    at_owner: list[int]  # M̂ elements this rank receives from each shard rank (Q it sends back)
    by_replica: list[list[int]]  # positions each replica group orthogonalises (one group: all)
    shared: list[int]  # this rank's Q rows of each group's matrices (the all_gather pads to the max)


def exchange_plan(lays: list[Layout], rank: int, shards: int, replicas: int = 1) -> ExchangePlan:
    """Who sends what to whom for the bucket `lays` (see ExchangePlan)."""
    group, me = divmod(rank, shards)
    by_replica: list[list[int]] = [[] for _ in range(replicas)]
    for k, lay in enumerate(lays):
        by_replica[lay.owner // shards].append(k)
    by_owner: list[list[int]] = [[] for _ in range(shards)]  # one pass: a dry run asks for 512 ranks' plans
    for k in by_replica[group]:
        by_owner[lays[k].owner % shards].append(k)

    def rows(k: int, s: int) -> int:
        return lays[k].rows[s] * lays[k].n

    return ExchangePlan(
        by_owner=by_owner,
        to_owner=[sum(rows(k, me) for k in ks) for ks in by_owner],
        at_owner=[sum(rows(k, s) for k in by_owner[me]) for s in range(shards)],
        by_replica=by_replica,
        shared=[sum(rows(k, me) for k in ks) for ks in by_replica],
    )


class InFlight:
    """A bucket's collectives in flight (``async_op=True`` works) and what turns their buffers into
    the bucket's matrices once they have landed, or into the next stage's collectives."""

    def __init__(
        self, works: list[Any], finish: Callable[[], list[Tensor] | InFlight], buffers: tuple[Tensor, ...] = ()
    ) -> None:
        # buffers: what the collectives read and write, kept alive until they have landed
        self.works, self.finish, self.buffers = works, finish, buffers

    def wait(self) -> list[Tensor] | InFlight:
        for work in self.works:
            if work is not None:
                work.wait()
        out = self.finish()
        self.buffers = ()
        return out

    def result(self) -> list[Tensor]:
        """Every stage, waited for in turn."""
        out = self.wait()
        return out.result() if isinstance(out, InFlight) else out


def landed(value: list[Tensor]) -> InFlight:
    """A stage that needed no communication."""
    return InFlight([], lambda: value)


class OwnerMuonFamily(MuonFamily):
    """What both sharded flavours share: owners, buckets and their pipeline, counters."""

    _sharded_rows = False  # params are row shards (FSDP2) rather than whole replicated matrices
    # set by the subclasses before the first _build_consts (defaults: a single process)
    _group: dist.ProcessGroup | None = None  # the owner exchange's group
    _rank = 0  # this rank in _group
    _world = 1  # owner slots: ranks of _group, times the replica groups with the replica split
    _shards = 1  # ranks a row-sharded matrix is split over (_world, or the HSDP shard group)
    _replicas = 1  # replica groups that split the NS work (HSDP's replica split; else 1)

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        *,
        mode: str = "owner",
        bucket_numel: int = DEFAULT_BUCKET_NUMEL,
        overlap: bool = True,
        **kwargs: Any,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if bucket_numel < 1:
            raise ValueError(f"bucket_numel must be >= 1, got {bucket_numel}")
        self.mode, self.bucket_numel, self.overlap = mode, bucket_numel, overlap
        self._layout: dict[int, Layout] = {}
        super().__init__(params, lr, weight_decay, **kwargs)

    def _build_consts(self) -> None:
        super()._build_consts()
        ps = [p for g in self.param_groups for p in g["params"]]
        owners = assign_owners([matrix_shape(p) for p in ps], self._world, self._replicas)
        self._layout = {}
        self._device = ps[0].device if ps else torch.device("cpu")
        for p, o in zip(ps, owners, strict=True):
            m, n = matrix_shape(p)  # a conv weight as its [out, in·k…] matrix
            rows, starts = (
                row_split(m, self._shards) if self._sharded_rows else ((m,) * self._world, (0,) * self._world)
            )
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
        return newton_schulz_many(
            mats, group["ns_steps"], group["ns_coefficients"], group["ns_dtype"], kernel=self.ns_kernel
        )

    def orthogonalize(self, w: GroupWork, m_hats: TensorList) -> list[Tensor]:
        """(b), distributed: per bucket, ``_to_owners`` brings the matrices this rank orthogonalises,
        ``_ns`` runs, ``_from_owners`` returns this rank's part of each Q (local rows, or the whole
        matrix when replicated) in fp32. Overlapped: bucket k+1 travels to its owners while k's NS
        runs, and each return moves one stage on (lands; starts its next collective) per NS."""
        if self._world == 1 or (self.mode == "replicate" and not self._sharded_rows):
            return super().orthogonalize(w, m_hats)
        lays = [self._layout[id(p)] for p in w.params]
        buckets = self._buckets(lays)

        def send(k: int) -> InFlight:
            return self._to_owners(w.group, [m_hats[i] for i in buckets[k]], [lays[i] for i in buckets[k]])

        qs: dict[int, Tensor] = {}
        returning: list[tuple[list[int], InFlight]] = []  # oldest first

        def advance() -> None:
            still = []
            for positions, flight in returning:
                out = flight.wait()
                if isinstance(out, InFlight):
                    still.append((positions, out))
                else:
                    qs.update(zip(positions, out, strict=True))
            returning[:] = still

        inbound = send(0)
        for k, bucket in enumerate(buckets):
            fulls = inbound.result()
            if self.overlap and k + 1 < len(buckets):
                inbound = send(k + 1)  # in flight while this bucket's NS runs
            q_full = self._ns(w.group, fulls)
            del fulls
            advance()  # the returns started before this NS have landed meanwhile
            returning.append((bucket, self._from_owners(w.group, q_full, [lays[i] for i in bucket])))
            del q_full
            if not self.overlap:
                while returning:
                    advance()
                if k + 1 < len(buckets):
                    inbound = send(k + 1)
        while returning:
            advance()
        return [qs[i] for i in range(len(m_hats))]

    def _buckets(self, lays: list[Layout]) -> list[list[int]]:
        """The step's buckets over one group's matrices (positions into `lays`): consecutive runs
        of ≤ ``bucket_numel`` elements (row shards go to every owner in one all_to_all anyway)."""
        return make_buckets([lay.m * lay.n for lay in lays], self.bucket_numel)

    def planned_bytes_sent(self, rank: int) -> int:
        """What ``bytes_sent`` reads on `rank` (an owner slot, as ``_rank``) after a step in which
        every matrix has a gradient: each group's buckets as the step cuts them, then the norm sums.
        From the layouts alone, so a dry run can ask it for every rank of a world it never runs."""
        if self._world == 1 or (self.mode == "replicate" and not self._sharded_rows):
            return 0
        total, n = 0, 0
        for g in self.param_groups:
            lays = [self._layout[id(p)] for p in g["params"]]
            q_bytes = resolve_ns_dtype(g["ns_dtype"]).itemsize
            total += sum(self._bucket_bytes([lays[k] for k in b], rank, q_bytes) for b in self._buckets(lays))
            n += len(lays)
        return total + self._norm_bytes(n)

    @property
    def owner_slots(self) -> int:
        """The ranks NS work is dealt over (owner = 0 .. owner_slots − 1): the group's, times the
        replica groups with the replica split; global rank g is slot g % owner_slots."""
        return self._world

    def planned_ns_flops(self, rank: int) -> float:
        """NS FLOPs owner slot `rank` runs in a step in which every matrix has a gradient (every
        matrix's, where each rank runs every NS: ``mode="replicate"`` or one rank)."""
        everywhere = self._world == 1 or self.mode == "replicate"
        return sum(
            ns_flops((lay.m, lay.n), g["ns_steps"])
            for g in self.param_groups
            for lay in (self._layout[id(p)] for p in g["params"])
            if everywhere or lay.owner == rank
        )

    def _bucket_bytes(self, lays: list[Layout], rank: int, q_bytes: int) -> int:
        """Bytes `rank` sends in one bucket's exchange (the plan its collectives are cut from)."""
        raise NotImplementedError

    def _norm_bytes(self, n_matrices: int) -> int:
        """Bytes this rank sends summing the [N, N_COLS + extra_sum_columns] fp32 norm sums (none when local)."""
        return 0

    def _to_owners(self, group: dict[str, Any], m_hats: TensorList, lays: list[Layout]) -> InFlight:
        """Start moving one bucket's M̂ to its owners; the result: the matrices this rank owns (in
        bucket order), whole, ready for NS."""
        raise NotImplementedError

    def _from_owners(self, group: dict[str, Any], q_full: list[Tensor], lays: list[Layout]) -> InFlight:
        """Start returning the owned Qs (NS dtype); the result (after one or more stages): this
        rank's part of every Q of the bucket, in bucket order, fp32."""
        raise NotImplementedError
