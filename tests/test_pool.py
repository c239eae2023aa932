"""The pool of ranks itself (tests/pool.py): each rank's result, a failing rank's error and log
tail, a timeout that restarts the pool, and jobs that leave nothing behind for the next."""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch
import torch.distributed as dist

from tests.pool import PoolJobError, PoolRetryWarning, _describe, rank_pool

pytestmark = pytest.mark.slow  # starts pools of processes


def _rank_and_sum() -> tuple[int, int, float]:
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.item()


def _fail_on_rank_one() -> int:
    print("about to fail", file=sys.stderr, flush=True)
    if dist.get_rank() == 1:
        raise ValueError("rank one says no")
    return dist.get_rank()


def _dirty_the_process(marker: str) -> dict:
    """Changes what a job must not leave behind; returns what it found on entry."""
    import signal

    found = {
        "env": os.environ.get("POOL_TEST_MARKER"),
        "cwd": os.getcwd(),
        "threads": torch.get_num_threads(),
        "sigterm": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
        "rand": torch.rand(1).item(),
        "group_timeout": dist.distributed_c10d._get_default_timeout(dist.Backend.GLOO).total_seconds(),
    }
    os.environ["POOL_TEST_MARKER"] = marker
    os.chdir("/")
    torch.set_num_threads(max(1, torch.get_num_threads() + 1))
    signal.signal(signal.SIGTERM, lambda *a: None)
    torch.rand(5)  # moves the RNG
    import datetime

    from launch.runtime.hangs import set_default_timeout

    set_default_timeout(datetime.timedelta(seconds=7))
    return found


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def test_every_rank_runs_the_job_in_a_group_of_its_own():
    assert rank_pool(2).run(_rank_and_sum) == [(0, 2, 3.0), (1, 2, 3.0)]


def test_a_failing_rank_fails_the_job_with_its_line_and_log_and_the_next_job_runs():
    pool = rank_pool(2)
    results = pool.run_raw(_fail_on_rank_one)
    assert results[0].error is None and results[0].value == 0
    assert results[1].error == "ValueError: rank one says no"
    assert "about to fail" in results[1].log and "Traceback" in results[1].traceback
    message = _describe("tests.test_pool._fail_on_rank_one failed", results)  # what `run` raises with
    assert "--- rank 1: ValueError: rank one says no" in message and "about to fail" in message
    assert pool.run(_rank_and_sum) == [(0, 2, 3.0), (1, 2, 3.0)]  # the pool, restarted, runs the next job


def test_a_job_past_its_timeout_restarts_the_pool():
    pool = rank_pool(1)
    pool.run(_rank_and_sum)
    starts = pool.starts
    with pytest.raises(PoolJobError, match="timed out after 1 s"):
        pool.run(_sleep, 30, timeout=1)
    assert pool.run(_rank_and_sum) == [(0, 1, 1.0)]
    assert pool.starts == starts + 1


def test_a_job_leaves_nothing_behind():
    pool = rank_pool(1)
    first = pool.run(_dirty_the_process, "a")[0]
    second = pool.run(_dirty_the_process, "b")[0]
    assert second == first  # environment, cwd, threads, signals, seeded RNG, group timeouts
    assert second["env"] is None and second["sigterm"]


def test_a_job_without_a_group_sees_none():
    assert rank_pool(1).run(dist.is_initialized, group=False) == [False]


def _abort_once_on_rank_one(marker: str) -> int:
    """Rank 1 dies of SIGABRT (as glibc aborts on a corrupted heap) the first time; then all is well."""
    if dist.get_rank() == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        print("crashing now", file=sys.stderr, flush=True)
        os.abort()
    return _rank_and_sum()[2]


def _abort_on_rank_one() -> None:
    if dist.get_rank() == 1:
        os.abort()
    dist.barrier()


def test_a_worker_killed_by_a_signal_gets_the_job_one_more_run_and_says_so(tmp_path):
    pool = rank_pool(2)
    starts = pool.starts
    with pytest.warns(PoolRetryWarning, match=r"(?s)killed by a signal; running it again.*exit -6.*crashing now"):
        assert pool.run(_abort_once_on_rank_one, str(tmp_path / "crashed")) == [3.0, 3.0]
    assert pool.starts == starts + 1
    with pytest.warns(PoolRetryWarning), pytest.raises(PoolJobError, match=r"--- rank 1: the worker died \(exit -6\)"):
        pool.run(_abort_on_rank_one, timeout=60)  # twice: it fails, as any other failure does
    assert pool.run(_rank_and_sum) == [(0, 2, 3.0), (1, 2, 3.0)]
