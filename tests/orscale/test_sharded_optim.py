"""Sharded Muon family (orscale/distributed/): 2-rank FSDP2 (owner / replicate) and DDP runs equal
the single-process step by step (a choice of the variants, and every other member of the family in
the optimizer table); NS once per matrix; DCP round-trip of the sharded state. The distributed
numbers come from ONE job of tests/orscale/sharded_worker.py on 2 ranks of the pool (shared by every
test here); the helpers' own tests run in-process."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bench.bench_scaling import optimizer_bytes_sent
from orscale import MuonFamily, OptimConfig, ReplicatedMuonFamily, ShardedMuonFamily, build_optimizers
from orscale import OptimConfigError as ConfigError
from orscale.distributed.ddp import gather_plan
from orscale.distributed.owners import (
    Layout,
    assign_owners,
    exchange_plan,
    make_buckets,
    ns_cost,
    owner_buckets,
    row_split,
)
from tests.orscale import sharded_worker
from tests.orscale.sharded_worker import CASES, LRS, MEMBERS, bucketed_runs, muon_shapes

TOL = 1e-5  # relative (Frobenius) error vs the single-process run; fp32 NS
RUNS = [
    f"{kind}/{preset}/{backend}/{mode}"
    for kind in ("toy", "gpt")
    for preset, flavours in CASES
    for backend, mode in flavours
]
RUNS += [key for kind in ("toy", "gpt") for key, _, _ in bucketed_runs(kind)]


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> list[dict]:
    """Per-rank result dicts of one 2-rank job of the worker (about 20–40 s on 2 CPU cores)."""
    from tests.pool import rank_pool

    return rank_pool(2).run(sharded_worker.run_all, str(tmp_path_factory.mktemp("sharded") / "ckpt"))


# ----------------------------------------------------------------------------- 2 ranks
@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("key", RUNS)
def test_matches_single_process(worker: list[dict], key: str) -> None:
    ranks = [w["runs"][key] for w in worker]  # (the step also ran with host syncs forbidden)
    for r, run in enumerate(ranks):
        assert run["err_matrix"] <= TOL, (r, run["err_matrix"])  # max over steps and matrices
        assert run["err_adamw"] <= TOL, (r, run["err_adamw"])  # AdamW on DTensors / DDP
        assert run["state_err"] <= TOL, (r, run["state_err"])  # momentum, a member's own state, clip counts
        assert run["c_err"] <= TOL, (r, run["c_err"])  # vs single-process c, every step
        assert run["c_plain"]
        assert run["row_states_are_dtensors" if "/fsdp/" in key else "row_states_are_plain"]
    # calibration constants: bit-identical on every rank, every step
    assert ranks[0]["c"] == ranks[1]["c"]
    if "/orscale_lm/" in key or "decoupled" in key:
        assert all(c == 0 for c in ranks[0]["c"][0])  # lr = 0 at step 0: not calibrated
        assert all(c > 0 for c in ranks[0]["c"][1])
        assert ranks[0]["c"][1] == ranks[0]["c"][-1]  # set once, never recomputed


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("key", RUNS)
def test_newton_schulz_once_per_matrix(worker: list[dict], key: str) -> None:
    ranks = [w["runs"][key] for w in worker]
    active = ranks[0]["n_active"]  # matrices with a gradient at each step (one dropped once)
    assert len(active) == len(LRS) and min(active) < ranks[0]["n_matrices"]
    if key.endswith("/replicate"):
        assert all(r["ns_calls"] == active for r in ranks)
        return
    per_step = [sum(r["ns_calls"][t] for r in ranks) for t in range(len(active))]
    assert per_step == active  # each matrix exactly once across the ranks
    assert all(0 < r["ns_calls"][0] < active[0] for r in ranks)  # both ranks do some
    assert ranks[0]["owners"] == ranks[1]["owners"]


@pytest.mark.slow
@pytest.mark.distributed
def test_collectives_are_bucketed(worker: list[dict]) -> None:
    runs = worker[0]["runs"]
    for key in RUNS:
        n = runs[key]["collectives"][-1]
        if key.endswith("fsdp/owner"):
            assert n == 3  # all_to_all there and back + one all_reduce of the norms
        elif key.endswith("fsdp/replicate"):
            assert n == 2  # one all_gather + one all_reduce
        elif key.endswith("ddp/owner"):
            assert n == 1  # one all_gather of the owners' Qs
        elif key.endswith("ddp/replicate"):
            assert n == 0  # every rank runs every NS: the single-process step
        else:
            assert n > 3  # owner_bucketed: a small bucket cap gives several buckets
    gpt = runs["gpt/orscale_lm/fsdp/owner"]
    matrix_bytes = 4 * sum(m * n for m, n in [(192, 64), (64, 64), (256, 64), (64, 256)]) * 2
    assert sum(w["runs"]["gpt/orscale_lm/fsdp/owner"]["bytes_sent"][-1] for w in worker) <= 2 * matrix_bytes
    assert gpt["bytes_sent"][0] > 0


@pytest.mark.slow
@pytest.mark.distributed
def test_bytes_sent_are_the_planned_bytes(worker: list[dict]) -> None:
    # The last step has every matrix active: what each rank counted is what the dry run plans.
    for w in worker:
        assert {k: w["runs"][k]["bytes_sent"][-1] for k in RUNS} == {k: w["runs"][k]["planned_bytes"] for k in RUNS}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("kind", ["toy", "gpt"])
def test_bytes_sent_match_the_scaling_model(worker: list[dict], kind: str) -> None:
    # bench/bench_scaling.py's count of the owner exchange and the norm all_reduce (the last step:
    # every matrix active; fp32 NS, so Q travels as 4 bytes) against the optimizer's own counter.
    shapes = muon_shapes(kind)
    for rank, w in enumerate(worker):
        assert w["runs"][f"{kind}/orscale_lm/fsdp/owner"]["bytes_sent"][-1] == optimizer_bytes_sent(
            shapes, 1, 2, rank, 4
        )


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("kind", ["toy", "gpt"])
@pytest.mark.parametrize("backend", ["fsdp", "ddp"])
def test_overlapped_exchange_is_bit_identical(worker: list[dict], kind: str, backend: str) -> None:
    # The pipelined owner exchange (bucket k+1 in flight during bucket k's NS) against one bucket at
    # a time: the same collectives on the same data, so every rank's weights hash alike.
    for w in worker:
        runs = w["runs"]
        piped, sync = (
            runs[f"{kind}/orscale_lm/{backend}/owner_bucketed"],
            runs[f"{kind}/orscale_lm/{backend}/owner_bucketed_sync"],
        )
        assert piped["collectives"][-1] == sync["collectives"][-1] > 3
        assert piped["digest"] == sync["digest"]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("run", ["toy/orscale_lm", "gpt/orscale_lm", *(f"toy/{m}" for m in MEMBERS)])
def test_dcp_roundtrip_of_sharded_state(worker: list[dict], run: str) -> None:
    # every state tensor (momentum and a member's own: DTensor shards, incl. an empty one) and c
    # (0-d fp32) equal after save → load; the next step is bit-identical; the files also load into
    # one unsharded process (2 ranks -> 1).
    for r, w in enumerate(worker):
        bad = [k for k, ok in w["dcp"][run].items() if not ok]
        assert not bad, (r, bad)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("backend", ["fsdp", "ddp"])
def test_real_backward_matches(worker: list[dict], backend: str) -> None:
    # Gradients from half batches averaged by FSDP2 / DDP vs the whole batch in one process:
    # equal only up to reduction order (~1e-7), which NS and AdamW's g/√v amplify (a gradient
    # entry that cancels to ~0 can flip sign), so a looser bound than the synthetic runs.
    for w in worker:
        assert w["real"][backend]["matrix"] <= 1e-4
        assert w["real"][backend]["adamw"] <= 1e-4


# ----------------------------------------------------------------------------- in-process
def test_row_split_matches_dtensor_layout() -> None:
    assert row_split(5, 2) == ((3, 2), (0, 3))
    assert row_split(1, 2) == ((1, 0), (0, 1))
    assert row_split(6, 4) == ((2, 2, 2, 0), (0, 2, 4, 6))
    assert row_split(10, 4) == ((3, 3, 3, 1), (0, 3, 6, 9))
    assert row_split(8, 1) == ((8,), (0,))


def test_assign_owners_balances_ns_cost() -> None:
    shapes = [(384, 128), (128, 128), (512, 128), (128, 512)] * 4  # the tiny GPT's matrices
    owners = assign_owners(shapes, 2)
    assert owners == assign_owners(shapes, 2)  # deterministic
    load = [sum(ns_cost(s) for s, o in zip(shapes, owners, strict=True) if o == r) for r in range(2)]
    assert max(load) / min(load) <= 1.1
    assert assign_owners(shapes, 1) == [0] * len(shapes)
    assert sorted(set(assign_owners([(4, 4)] * 3, 8))) == [0, 1, 2]


def test_replica_split_owners_deal_groups_then_ranks() -> None:
    shapes = [(384, 128), (128, 128), (512, 128), (128, 512)] * 4
    owners = assign_owners(shapes, 4, replicas=2)  # owner = group·2 + shard
    assert assign_owners(shapes, 4) != owners and set(owners) == {0, 1, 2, 3}
    group = [sum(ns_cost(s) for s, o in zip(shapes, owners, strict=True) if o // 2 == g) for g in range(2)]
    assert max(group) / min(group) <= 1.1
    assert [o // 2 for o in owners] == assign_owners(shapes, 2)  # groups first, by the same rule
    assert assign_owners(shapes, 4, replicas=1) == assign_owners(shapes, 4)


@pytest.mark.parametrize("replicas, shards", [(1, 2), (1, 4), (2, 2), (2, 1), (4, 2)])
def test_exchange_plans_agree_between_peers(replicas: int, shards: int) -> None:
    # What each rank sends to a peer is what that peer expects from it, in both directions; the
    # replica split's all_gather has the same widths on every rank of a "replicate" group.
    shapes = [(1, 8), (5, 7), (6, 6), (10, 3), (192, 64), (64, 256)]
    owners = assign_owners(shapes, replicas * shards, replicas)
    lays = [Layout(o, m, n, *row_split(m, shards)) for (m, n), o in zip(shapes, owners, strict=True)]
    plans = [exchange_plan(lays, g, shards, replicas) for g in range(replicas * shards)]
    for g, plan in enumerate(plans):
        base, me = g - g % shards, g % shards
        assert plan.by_owner == plans[base].by_owner  # one view per replica group
        for d in range(shards):
            assert plan.to_owner[d] == plans[base + d].at_owner[me]
        assert plan.shared == plans[me].shared  # the same shard rank of every group
        assert sorted(k for ks in plan.by_replica for k in ks) == list(range(len(shapes)))


def test_make_buckets() -> None:
    assert make_buckets([5, 5, 5], 100) == [[0, 1, 2]]
    assert make_buckets([5, 5, 5], 10) == [[0, 1], [2]]
    assert make_buckets([50, 5, 60], 10) == [[0], [1], [2]]  # oversized matrices go alone
    assert make_buckets([], 10) == []


def test_owner_buckets_take_a_run_from_every_owner() -> None:
    # 3 owners; matrices above the cap: bucket j holds every owner's j-th largest matrix
    owners, numels = [0, 1, 2, 0, 1, 0], [50, 50, 50, 30, 30, 20]
    assert owner_buckets(owners, numels, 3, 10) == [[0, 1, 2], [3, 4], [5]]
    assert owner_buckets(owners, numels, 3, 100) == [[0, 1, 2, 3, 4, 5]]  # small ones share a run
    assert owner_buckets([1, 1], [4, 9], 2, 10) == [[1], [0]]  # largest first; rank 0 owns nothing
    assert owner_buckets([], [], 4, 10) == []


def test_gather_plan_pads_only_when_owners_are_even() -> None:
    lay = lambda o, m: Layout(o, m, 4, (m,) * 4, (0,) * 4)  # noqa: E731
    even = gather_plan([lay(0, 8), lay(1, 8), lay(2, 8), lay(3, 8)], 4)
    assert not even.broadcast and even.width == 32 and [even.padding(r) for r in range(4)] == [0] * 4
    assert [even.sent(r) for r in range(4)] == [96] * 4  # a ring all_gather: (W - 1) chunks
    sparse = gather_plan([lay(2, 8), lay(3, 4)], 4)  # two owners of four: the gather would be 5/8 zeros
    assert sparse.broadcast and [sparse.padding(r) for r in range(4)] == [0] * 4
    # rank r passes each owner's buffer on unless it is the ring's last (the owner's predecessor)
    assert [sparse.sent(r) for r in range(4)] == [32 + 16, 16, 32, 32 + 16]
    assert sum(sparse.sent(r) for r in range(4)) == 3 * (32 + 16)


def _named(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [
        (f"blocks.{i}.w", nn.Parameter(torch.randn(s, generator=gen))) for i, s in enumerate([(5, 7), (1, 8), (5, 7)])
    ]


def test_replicated_without_process_group_is_the_plain_step() -> None:
    a, b = _named(), _named()
    oa = MuonFamily(a, lr=0.02, variant="orscale_lm", ns_dtype="fp32")
    ob = ReplicatedMuonFamily(b, lr=0.02, variant="orscale_lm", ns_dtype="fp32")
    for t in range(3):
        gen = torch.Generator().manual_seed(t)
        for (_, p), (_, q) in zip(a, b, strict=True):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        oa.step()
        ob.step()
    assert all(torch.equal(p, q) for (_, p), (_, q) in zip(a, b, strict=True))
    assert oa.ns_calls == ob.ns_calls == 3 and ob.bytes_sent == 0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="DTensor"):
        ShardedMuonFamily(_named(), lr=0.02)
    with pytest.raises(ValueError, match="mode"):
        ReplicatedMuonFamily(_named(), lr=0.02, mode="everywhere")
    model = nn.Module()
    model.blocks = nn.ModuleList([nn.Linear(4, 4, bias=False)])
    with pytest.raises(ConfigError, match="muon_mode"):
        build_optimizers(model, OptimConfig(name="orscale_lm"), backend="ddp", mode="x")
    with pytest.raises(ConfigError, match="backend"):
        build_optimizers(model, OptimConfig(name="orscale_lm"), backend="tp")
    opts = build_optimizers(model, OptimConfig(name="orscale_lm"), backend="ddp")
    assert type(opts[0]) is ReplicatedMuonFamily
    assert type(build_optimizers(model, OptimConfig(name="orscale_lm"))[0]) is MuonFamily
