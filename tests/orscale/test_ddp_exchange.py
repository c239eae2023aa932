"""DDP's owner exchange (orscale/distributed/ddp.py) sends what is useful: on 2 and 4 gloo ranks of
the pool, with every matrix larger than the bucket, no rank contributes a zero to an all_gather
(the old one-owner buckets had the W − 1 others send zero chunks), the ranks together send each Q
once to each other rank, the counters match the plan, and the weights match one process's."""

from __future__ import annotations

import pytest

from tests.orscale.ddp_exchange_worker import SHAPES, run

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


@pytest.fixture(scope="module", params=[2, 4])
def ranks(request: pytest.FixtureRequest) -> tuple[int, list[dict], list[dict]]:
    """(world, each rank's pipelined run, each rank's one-bucket-at-a-time run)."""
    from tests.pool import rank_pool

    pool = rank_pool(request.param)
    return request.param, pool.run(run, True), pool.run(run, False)


def test_no_rank_contributes_zeros(ranks: tuple[int, list[dict], list[dict]]) -> None:
    world, piped, _ = ranks
    for rank, result in enumerate(piped):
        for step in result["steps"]:
            contributed = sum(c["numel"] for c in step["calls"])
            zeros = sum(c["zeros"] for c in step["calls"])
            assert contributed > 0 and zeros == 0, (world, rank, zeros, contributed)


def test_each_q_crosses_once_per_receiver(ranks: tuple[int, list[dict], list[dict]]) -> None:
    world, piped, _ = ranks
    useful = (world - 1) * sum(m * n for m, n in SHAPES) * 4  # fp32 Q to every other rank
    for t in range(len(piped[0]["steps"])):
        assert sum(r["steps"][t]["bytes_sent"] for r in piped) == useful
        assert all(r["steps"][t]["collectives"] < len(SHAPES) for r in piped)  # not one per matrix
    for rank, result in enumerate(piped):  # the plan the dry run reads, rank by rank
        assert [result["steps"][-1]["bytes_sent"]] * world == [r["planned"][rank] for r in piped]


def test_same_weights_as_one_process(ranks: tuple[int, list[dict], list[dict]]) -> None:
    world, piped, sync = ranks
    assert sum(r["ns_calls"] for r in piped) == len(SHAPES)  # each matrix on one owner
    for r in piped:
        assert r["err"] <= 1e-5
    assert len({r["digest"] for r in piped + sync}) == 1  # replicas equal; overlap changes nothing
