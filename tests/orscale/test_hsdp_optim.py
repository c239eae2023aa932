"""The Muon family on HSDP: 4 ranks as 2 replica groups x 2 shards equal the single-process
step (owners inside the shard group, or split across the replica groups, or NS everywhere); NS
runs once per matrix per replica group (once in all with the split); replicas stay bit-identical;
the pipelined exchange is bit-identical to one bucket at a time; and the optimizer's bytes_sent
counters equal bench/bench_scaling.py's byte model. ONE job of tests/orscale/hsdp_worker.py on 4 ranks
of the pool."""

from __future__ import annotations

import pytest
import torch

from bench.bench_scaling import optimizer_bytes_sent
from tests.orscale.hsdp_worker import FLAVOURS
from tests.orscale.sharded_worker import muon_shapes

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

TOL = 1e-5
KINDS = ("toy", "gpt")
RUNS = [f"{kind}/{flavour}" for kind in KINDS for flavour in FLAVOURS]
BUCKETED = [f"{kind}/{flavour}" for kind in KINDS for flavour, spec in FLAVOURS.items() if spec[-1]]
# (replica groups that split NS, shards) of each flavour's owner exchange on 4 ranks
EXCHANGE = {"hsdp/owner": (1, 2), "hsdp/split": (2, 2), "fsdp/owner": (1, 4)}


@pytest.fixture(scope="module")
def worker() -> list[dict]:
    """Per-rank result dicts of one 4-rank job of the worker."""
    from tests.orscale import hsdp_worker
    from tests.pool import rank_pool

    return rank_pool(4).run(hsdp_worker.run_all)


@pytest.mark.parametrize("key", RUNS + [k + s for k in BUCKETED for s in ("/bucketed", "/bucketed_sync")])
def test_four_ranks_match_one_process(worker: list[dict], key: str) -> None:
    ranks = [w["runs"][key] for w in worker]
    for r, run in enumerate(ranks):
        assert run["err_matrix"] <= TOL, (r, run["err_matrix"])  # max over 6 steps and every matrix
        assert run["err_adamw"] <= TOL, (r, run["err_adamw"])
        assert run["state_err"] <= TOL, (r, run["state_err"])
        assert run["c_err"] <= TOL, (r, run["c_err"])
        assert run["row_states_are_dtensors"] and run["c_plain"]
    assert all(run["c"] == ranks[0]["c"] for run in ranks)  # calibration constants: bit-equal on all 4
    assert all(c > 0 for c in ranks[0]["c"][1]) and ranks[0]["c"][1] == ranks[0]["c"][-1]
    if "/hsdp/" in key:  # rank = replica·2 + shard: the two replicas of a shard hold the same bits
        assert ranks[0]["digest"] == ranks[2]["digest"] and ranks[1]["digest"] == ranks[3]["digest"]
        assert ranks[0]["digest"] != ranks[1]["digest"]


@pytest.mark.parametrize("key", RUNS)
def test_newton_schulz_once_per_matrix_per_replica_group(worker: list[dict], key: str) -> None:
    ranks = [w["runs"][key] for w in worker]
    active = ranks[0]["n_active"]  # matrices with a gradient at each step (one dropped once)
    for t, n in enumerate(active):
        calls = [r["ns_calls"][t] for r in ranks]
        if key.endswith("hsdp/replicate"):
            assert calls == [n] * 4
        elif key.endswith("hsdp/owner"):  # each replica group (ranks 0-1, 2-3) orthogonalises all
            assert calls[0] + calls[1] == n and calls[2] + calls[3] == n
        else:  # the split, and plain FSDP2 over 4 ranks: each matrix once in all
            assert sum(calls) == n
    if key.endswith("/split"):
        assert all(r["ns_calls"][0] > 0 for r in ranks)


@pytest.mark.parametrize("key", BUCKETED)
def test_pipelined_exchange_is_bit_identical(worker: list[dict], key: str) -> None:
    for w in worker:
        piped, sync = w["runs"][f"{key}/bucketed"], w["runs"][f"{key}/bucketed_sync"]
        assert piped["collectives"][-1] == sync["collectives"][-1] > 3
        assert piped["digest"] == sync["digest"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flavour", list(EXCHANGE))
def test_bytes_sent_match_the_scaling_model(worker: list[dict], kind: str, flavour: str) -> None:
    """The last step (every matrix active, one bucket): each rank's counter equals the model's
    count for that rank (fp32 NS in the worker: 4-byte Q)."""
    replicas, shards = EXCHANGE[flavour]
    shapes = muon_shapes(kind)
    for rank, w in enumerate(worker):
        got = w["runs"][f"{kind}/{flavour}"]["bytes_sent"][-1]
        want = optimizer_bytes_sent(shapes, replicas, shards, rank, 4)
        assert got == want, (rank, got, want)
    assert torch.tensor([w["runs"][f"{kind}/{flavour}"]["bytes_sent"][-1] for w in worker]).gt(0).all()
