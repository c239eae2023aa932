"""A pool of ranks for the tests that need N processes of a process group but not a launch.

Starting Python, torch and the project costs ~2 CPU-s per process and torchrun's agent more, so a
test that only needs "2 ranks of gloo" should not pay a launch. `rank_pool(n)` starts n worker
processes once per test session (`tests/pool_worker.py`: torch and the project imported once), and
`pool.run(fn, *args)` runs `fn(*args)` in every rank and returns each rank's result:

    results = rank_pool(2).run(train_job, overrides)        # [rank 0's value, rank 1's value]

`fn` is any module-level function (pickled by name; the worker imports its module). By default each
job runs inside a fresh default process group (gloo, one per job, destroyed after it); with
`group=False` it runs with none, as a plain `python train.py` of backend `none` does (on a pool of
n ranks: n independent processes, each told its index by `POOL_RANK`, e.g. two runs side by side).
A job leaves nothing behind for the next: the worker restores the environment, working
directory, signal handlers, logging, thread count, RNG seeds, torch.compile's caches and the
process-group timeouts after every job (`tests/pool_worker.py`).

A job that raises on any rank, or runs past its timeout, fails only its test: the error lines and
each rank's log tail come back in the AssertionError (or, from `run_raw`, as values), and a pool
that may be left inconsistent (a rank still inside a collective, a timeout) is restarted before the
next job. A worker killed by a signal (a native crash: glibc's heap check aborted a long-lived
worker once, in a FSDP2/DDP job after hundreds of jobs, not reproduced in isolation) restarts the
pool and the job runs once more, with a `PoolRetryWarning` carrying the crash's log tail; a second
crash fails the test. Each such retry is also kept in `RETRIES`, which tests/conftest.py prints as the
last lines of pytest's report. Anchors read before writing this: PyTorch's `MultiProcContinuousTest`
(torch/testing/_internal/common_distributed.py) and OLMo-core's `run_distributed_test`.
"""

from __future__ import annotations

import atexit
import os
import pickle
import queue
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener, wait
from pathlib import Path
from typing import Any

from tests.helpers import ROOT, env

START_TIMEOUT_S = 120.0
JOB_TIMEOUT_S = 600.0
# After one rank fails, how long the others get to come back before the pool is restarted.
PEER_GRACE_S = 20.0


@dataclass
class RankResult:
    rank: int
    value: Any = None
    error: str | None = None  # "Type: message" of an exception the job raised on this rank
    traceback: str = ""
    log: str = ""  # what this rank wrote to stdout/stderr during the job (its tail)


class PoolJobError(AssertionError):
    """A pool job failed on some rank or timed out: every rank's error and log tail."""


class PoolRetryWarning(UserWarning):
    """A worker was killed by a signal during a job, which then ran again on a fresh pool."""


@dataclass
class Retry:
    """A job whose worker was killed by a signal, and what its second run gave."""

    test: str  # the test that ran it (pytest's id)
    job: str
    killed: list[str]  # "rank 1 (SIGABRT)", one per rank a signal killed
    log: str  # the killed ranks' log tails: the native error's line, each thread's Python stack
    outcome: str = "running again"  # then "passed on the second run" or "failed again: ..."

    def lines(self, log_lines: int = 20) -> list[str]:
        """The record as printed at the end of pytest's report: one line, then the log's last lines
        (without the fault handler's list of extension modules, one very long line)."""
        head = f"{self.test}: {self.job}: {', '.join(self.killed)} killed by a signal; {self.outcome}"
        log = [line for line in self.log.splitlines() if not line.startswith("Extension modules:")]
        return [head, *("    " + line for line in log[-log_lines:])]


RETRIES: list[Retry] = []  # this session's, in order (tests/conftest.py prints them last)
# A command the workers run under (a debugger or memory checker: bench/heap_soak.py's valgrind).
WORKER_PREFIX: list[str] = []


class RankPool:
    """n worker processes, started on first use and kept for the session."""

    def __init__(self, nproc: int) -> None:
        self.nproc = nproc
        self._procs: list[subprocess.Popen] = []
        self._conns: list[Connection] = []
        self._logs: list[Path] = []
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.starts = 0  # how many times the workers were started (a restart counts)
        self.jobs = 0

    # ------------------------------------------------------------------ life cycle
    def _start(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix=f"rank-pool-{self.nproc}-")
        authkey = secrets.token_bytes(16)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        host, port = listener.address
        environ = env()
        environ["ORSCALE_POOL_AUTHKEY"] = authkey.hex()
        self._logs = [Path(self._tmp.name) / f"rank{r}.log" for r in range(self.nproc)]
        for rank in range(self.nproc):
            where = [host, str(port), str(rank), str(self.nproc)]
            cmd = [*WORKER_PREFIX, sys.executable, "-m", "tests.pool_worker", *where]
            with open(self._logs[rank], "wb") as log:
                self._procs.append(
                    subprocess.Popen(cmd, cwd=ROOT, env=environ, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
                )
        conns: dict[int, Connection] = {}
        accepted: queue.Queue = queue.Queue()

        def accept() -> None:  # Listener.accept has no timeout: wait for it on a thread
            try:
                for _ in range(self.nproc):
                    accepted.put(listener.accept())
            except OSError as err:  # the listener was closed: start-up gave up
                accepted.put(err)

        threading.Thread(target=accept, daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while len(conns) < self.nproc:
                got = accepted.get(timeout=max(0.1, deadline - time.monotonic()))
                if isinstance(got, BaseException):
                    raise got
                conns[got.recv()] = got
            ordered = [conns[r] for r in range(self.nproc)]
            for i, conn in enumerate([ordered[0], *ordered]):  # rank 0's store port, then "ready" from all
                if not conn.poll(max(0.1, deadline - time.monotonic())):
                    raise TimeoutError("a pool worker did not get ready")
                got = conn.recv()
                if i == 0:
                    for other in ordered[1:]:
                        other.send(got)
        except BaseException as err:
            listener.close()
            tails = "\n".join(f"--- rank {r}:\n{_tail(p)}" for r, p in enumerate(self._logs))
            self._conns = list(conns.values())
            self._kill()
            raise PoolJobError(f"the {self.nproc}-rank pool did not start: {err!r}\n{tails}") from None
        listener.close()
        self._conns = [conns[r] for r in range(self.nproc)]
        self.starts += 1

    def _kill(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self._procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)  # "exit"
            except OSError:
                pass
        deadline = time.monotonic() + 10
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self._kill()

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.poll() is None for p in self._procs)

    # ------------------------------------------------------------------ jobs
    def run_raw(
        self, fn: Callable[..., Any], *args: Any, group: bool = True, timeout: float = JOB_TIMEOUT_S, **kwargs: Any
    ) -> list[RankResult]:
        """`fn(*args, **kwargs)` on every rank; each rank's RankResult, errors included. Raises
        PoolJobError only when the job timed out or a worker died; a worker killed by a signal gets
        the job one more run on a fresh pool (with a PoolRetryWarning)."""
        results, killed = self._run_once(fn, args, kwargs, group, timeout)
        if killed:
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
            log = "\n".join(f"--- rank {rank}:\n{results[rank].log.rstrip()}" for rank in killed)
            retry = Retry(
                test, _name(fn), [f"rank {rank} ({_signal_name(code)})" for rank, code in killed.items()], log
            )
            RETRIES.append(retry)
            warnings.warn(
                PoolRetryWarning(_describe(f"{_name(fn)}: a worker was killed by a signal; running it again", results)),
                stacklevel=2,
            )
            try:
                results, _ = self._run_once(fn, args, kwargs, group, timeout)
            except PoolJobError as err:
                retry.outcome = f"failed again: {str(err).splitlines()[0]}"
                raise
            failed = [f"rank {r.rank}: {r.error}" for r in results if r.error]
            retry.outcome = f"failed again: {'; '.join(failed)}" if failed else "passed on the second run"
        return results

    def _run_once(
        self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any], group: bool, timeout: float
    ) -> tuple[list[RankResult], dict[int, int]]:
        """One run of the job: each rank's result, and the ranks a signal killed with their exit codes
        (their peers are not waited for: a peer may wait in a collective, and the pool restarts)."""
        if not self.alive:
            self._kill()
            self._start()
        payload = pickle.dumps((fn, args, kwargs, group, timeout))
        offsets = [p.stat().st_size for p in self._logs]
        self.jobs += 1
        for conn in self._conns:
            conn.send_bytes(payload)
        results: dict[int, RankResult] = {}
        deadline = time.monotonic() + timeout
        pending = {conn: rank for rank, conn in enumerate(self._conns)}
        killed: dict[int, int] = {}
        while pending and not killed:
            if results and any(r.error for r in results.values()):  # a peer may wait in a collective
                deadline = min(deadline, time.monotonic() + PEER_GRACE_S)
            ready = wait(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for conn in ready:
                rank = pending.pop(conn)  # type: ignore[index]
                try:
                    results[rank] = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    try:
                        code = self._procs[rank].wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        code = None
                    results[rank] = RankResult(rank, error=f"the worker died (exit {code})")
                    if code is not None and code < 0:
                        killed[rank] = code
        unanswered = f"no answer within {timeout:g} s" if not killed else "no answer: the job's pool was restarted"
        for rank in range(self.nproc):
            tail = _tail(self._logs[rank], offsets[rank]) if self._logs else ""
            results.setdefault(rank, RankResult(rank, error=unanswered)).log = tail
        ordered = [results[r] for r in range(self.nproc)]
        if pending or any(r.error for r in ordered):
            # A rank that timed out, died or may have left a collective half done: start afresh.
            self._kill()
        if pending and not killed:
            raise PoolJobError(_describe(f"{_name(fn)} timed out after {timeout:g} s", ordered))
        return ordered, killed

    def run_results(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[RankResult]:
        """`fn(*args, **kwargs)` on every rank; each rank's RankResult (its value and log tail).
        PoolJobError (an AssertionError, so the test fails with it) naming every rank's error and
        log tail if any rank raised."""
        results = self.run_raw(fn, *args, **kwargs)
        if any(r.error for r in results):
            raise PoolJobError(_describe(f"{_name(fn)} failed", results))
        return results

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """As `run_results`, the values by rank."""
        return [r.value for r in self.run_results(fn, *args, **kwargs)]


def _name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"


def _describe(what: str, results: list[RankResult]) -> str:
    lines = [what]
    for r in results:
        lines.append(f"--- rank {r.rank}: {r.error or 'ok'}")
        if r.traceback:
            lines.append(r.traceback[-3000:])
        if r.log:
            lines.append(f"log tail:\n{r.log[-3000:]}")
    return "\n".join(lines)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _tail(path: Path, offset: int = 0, limit: int = 8000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(offset, fh.seek(0, os.SEEK_END) - limit))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


_POOLS: dict[int, RankPool] = {}
FAST_TEST: str | None = None  # set by tests/conftest.py while a test of the fast loop runs


def rank_pool(nproc: int) -> RankPool:
    """The session's pool of `nproc` ranks (1, 2 or 4), started on first use."""
    if FAST_TEST is not None:
        raise RuntimeError(f"{FAST_TEST} uses the pool of ranks but is not marked slow")
    if nproc not in _POOLS:
        _POOLS[nproc] = RankPool(nproc)
    return _POOLS[nproc]


def close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


atexit.register(close_pools)
