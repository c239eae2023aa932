"""The pool of ranks itself (tests/pool.py): each rank's result, a failing rank's error and log
tail, a timeout that restarts the pool, and jobs that leave nothing behind for the next."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from tests.helpers import ROOT, env
from tests.pool import RETRIES, PoolJobError, PoolRetryWarning, _describe, rank_pool

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


def _abort_once_on_rank_one(marker: str) -> float:
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
    pool.run(_rank_and_sum)  # started
    starts, retries = pool.starts, len(RETRIES)
    with pytest.warns(PoolRetryWarning, match=r"(?s)killed by a signal; running it again.*exit -6.*crashing now"):
        assert pool.run(_abort_once_on_rank_one, str(tmp_path / "crashed")) == [3.0, 3.0]
    assert pool.starts == starts + 1
    with pytest.warns(PoolRetryWarning), pytest.raises(PoolJobError, match=r"--- rank 1: the worker died \(exit -6\)"):
        pool.run(_abort_on_rank_one, timeout=60)  # twice: it fails, as any other failure does
    assert pool.run(_rank_and_sum) == [(0, 2, 3.0), (1, 2, 3.0)]
    once, twice = RETRIES[retries:]
    assert (once.job, once.killed, once.outcome) == (
        f"{__name__}._abort_once_on_rank_one",
        ["rank 1 (SIGABRT)"],
        "passed on the second run",
    )
    assert once.test.endswith("::test_a_worker_killed_by_a_signal_gets_the_job_one_more_run_and_says_so")
    assert "crashing now" in once.log and "Fatal Python error: Aborted" in once.log  # the worker's fault handler
    assert (
        twice.outcome
        == "failed again: rank 0: no answer: the job's pool was restarted; rank 1: the worker died (exit -6)"
    )
    del RETRIES[retries:]  # expected here: not retries of this session's jobs to report at its end


def _abort_the_first_time(marker: str) -> str:
    if not os.path.exists(marker):
        open(marker, "w").close()
        print("crashing now", file=sys.stderr, flush=True)
        os.abort()
    return "ran again"


RETRIED = """
import pytest

from tests.pool import rank_pool
from tests.test_pool import _abort_the_first_time


@pytest.mark.slow
def test_crashes_once(tmp_path):
    assert rank_pool(1).run(_abort_the_first_time, str(tmp_path / "crashed"), group=False) == ["ran again"]
"""


def test_a_retried_job_is_in_the_last_lines_of_the_report(tmp_path):
    """What a CI log's tail shows: the test, the job, the rank and its signal, the second run's outcome and
    the worker's last lines, just above pytest's counts (not only in the warnings summary)."""
    (tmp_path / "test_retried.py").write_text(RETRIED)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
    cmd += ["-c", str(ROOT / "pyproject.toml"), "-p", "tests.conftest"]  # this suite's settings and hooks
    proc = subprocess.run(
        [*cmd, str(tmp_path / "test_retried.py")], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    last = proc.stdout.splitlines()[-25:]
    assert re.fullmatch(r"1 passed, 1 warning in .*", last[-1]), last
    heads = [i for i, line in enumerate(last) if "job(s) run again after a worker was killed by a signal" in line]
    assert heads, last
    record = last[heads[0] + 1 :]
    assert re.fullmatch(
        r"test_retried.py::test_crashes_once: tests.test_pool._abort_the_first_time: rank 0 \(SIGABRT\) "
        r"killed by a signal; passed on the second run",
        record[0],
    ), record
    assert any("_abort_the_first_time" in line for line in record[1:])  # the fault handler's stack
