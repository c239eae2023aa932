"""Soak the pool of ranks under glibc's heap checks: the tests whose jobs ran in the N-rank pool,
in suite order, many rounds in one session (so one long-lived worker runs hundreds of jobs, as in
the full suite), each process with glibc's debugging malloc, Python's fault handler and core dumps on.
Prints the jobs run, the pool's restarts, every worker killed by a signal (its log tail: the abort's
line and each thread's Python stack) and where a core dump lies.

    python -m bench.heap_soak [--rounds 5] [--nproc 2] [--through TEST] [--checks glibc|valgrind|none]

The first run records which tests use the N-rank pool (one pass of the slow tests, saved in
--jobs); later runs reuse it. `--checks glibc`: LD_PRELOAD=libc_malloc_debug.so.0,
GLIBC_TUNABLES=glibc.malloc.check=3, MALLOC_PERTURB_=165 (with --python-malloc, PYTHONMALLOC=malloc:
every Python object through glibc's malloc too). `--checks valgrind`: the pool's workers under valgrind's memcheck
(invalid reads and writes reported with a stack; slow: take one test, `--only NODEID`). `none`:
the allocator as CI has it. Also a pytest plugin (`-p bench.heap_soak`), which the driver loads.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MALLOC_DEBUG = "/lib/x86_64-linux-gnu/libc_malloc_debug.so.0"
GLIBC_CHECKS = {
    "LD_PRELOAD": MALLOC_DEBUG,
    "GLIBC_TUNABLES": "glibc.malloc.check=3",
    "MALLOC_PERTURB_": "165",
}
# Invalid reads and writes with the stack of the access, of the free and of the allocation; not the
# uninitialised-value reports that OpenMP, oneDNN and CPython's own tricks fill a log with.
VALGRIND = ["valgrind", "--tool=memcheck", "--undef-value-errors=no", "--error-limit=no", "--num-callers=40"]


# ------------------------------------------------------------------ the pytest plugin
def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("heap soak")
    group.addoption("--soak-record", help="append {nproc, test, job} per pool job to this file")
    group.addoption("--soak-rounds", type=int, default=1, help="run the selected tests this many times")
    group.addoption("--soak-summary", help="write the pools' jobs, starts and retries here at the end")
    group.addoption("--soak-valgrind", help="the pool's workers under valgrind, its reports in this directory")


def pytest_configure(config: Any) -> None:
    import tests.pool as pool

    valgrind = config.getoption("--soak-valgrind")
    if valgrind:  # memcheck runs Python 20-50x slower: hours, not minutes, for a start and a job
        pool.WORKER_PREFIX[:] = [*VALGRIND, f"--log-file={valgrind}/valgrind-%p.log"]
        pool.START_TIMEOUT_S = 4 * 3600
    record = config.getoption("--soak-record")
    run_raw = pool.RankPool.run_raw

    def run_raw_soaked(self: pool.RankPool, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if record:
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
            with open(record, "a") as fh:
                fh.write(json.dumps({"nproc": self.nproc, "test": test, "job": pool._name(fn)}) + "\n")
        if valgrind:
            kwargs["timeout"] = 4 * 3600
        return run_raw(self, fn, *args, **kwargs)

    pool.RankPool.run_raw = run_raw_soaked  # type: ignore[method-assign]


def pytest_collection_modifyitems(config: Any, items: list) -> None:
    items[:] = items * config.getoption("--soak-rounds")  # suite order, round after round


def pytest_sessionfinish(session: Any) -> None:
    path = session.config.getoption("--soak-summary")
    if not path:
        return
    import tests.pool as pool

    Path(path).write_text(
        json.dumps(
            {
                "pools": {n: {"jobs": p.jobs, "starts": p.starts} for n, p in pool._POOLS.items()},
                "retries": [r.__dict__ for r in pool.RETRIES],
                "failed": session.testsfailed,
                "tests": session.testscollected,
            }
        )
    )


# ------------------------------------------------------------------ the driver
def _pytest(args: list[str], environ: dict[str, str], basetemp: Path) -> int:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "bench.heap_soak"]
    cmd += ["--basetemp", str(basetemp), *args]
    print("$", " ".join(cmd[:12]), "..." if len(cmd) > 12 else "", flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=environ).returncode


def _record(jobs: Path, environ: dict[str, str], basetemp: Path) -> None:
    """One pass of the slow tests, recording which test ran which job in which pool."""
    jobs.unlink(missing_ok=True)
    _pytest(["-m", "slow", "--soak-record", str(jobs), "tests"], environ, basetemp)


def _tests_of(jobs: Path, nproc: int) -> list[str]:
    tests: dict[str, None] = {}
    for line in jobs.read_text().splitlines():
        row = json.loads(line)
        if row["nproc"] == nproc and "::" in row["test"]:
            tests[row["test"]] = None
    return list(tests)


def _cores(*dirs: Path) -> list[Path]:
    return [p for d in dirs for p in d.rglob("core*") if p.is_file() and p.name.split(".")[0] == "core"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2, help="the pool whose jobs are soaked")
    parser.add_argument("--jobs", type=Path, default=Path(tempfile.gettempdir()) / "heap_soak_jobs.jsonl")
    parser.add_argument("--checks", choices=["glibc", "valgrind", "none"], default="glibc")
    parser.add_argument(
        "--through",
        default="tests/orscale/test_library.py::test_fsdp2_and_ddp_user_loops",
        help="the recorded tests up to the first whose id starts so (default: CI's abort)",
    )
    parser.add_argument("--only", nargs="*", help="these test ids instead of the recorded ones")
    parser.add_argument("--python-malloc", action="store_true", help="PYTHONMALLOC=malloc as well")
    args = parser.parse_args()

    environ = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONFAULTHANDLER="1", PYTHONPATH=str(ROOT))
    basetemp = Path(tempfile.mkdtemp(prefix="heap-soak-"))
    if args.only:
        tests = args.only
    else:
        if not args.jobs.exists():
            _record(args.jobs, environ, basetemp / "record")
        tests = _tests_of(args.jobs, args.nproc)
        last = next((i for i, t in enumerate(tests) if t.startswith(args.through)), len(tests) - 1)
        tests = tests[: last + 1]
    if args.checks == "glibc":
        if not Path(MALLOC_DEBUG).exists():
            raise SystemExit(f"error: {MALLOC_DEBUG} not found: glibc's debugging malloc (glibc >= 2.34) is needed")
        environ.update(GLIBC_CHECKS)
        if args.python_malloc:
            environ["PYTHONMALLOC"] = "malloc"
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    summary = basetemp / "summary.json"
    reports = basetemp / "valgrind"
    extra = []
    if args.checks == "valgrind":
        reports.mkdir(parents=True)
        extra = ["--soak-valgrind", str(reports)]
        environ["PYTHONMALLOC"] = "malloc"  # pymalloc's own reads look invalid to memcheck
    print(f"{len(tests)} tests ran jobs in the {args.nproc}-rank pool; {args.rounds} rounds, checks: {args.checks}")
    start = time.monotonic()
    code = _pytest(
        [f"--soak-rounds={args.rounds}", "--soak-summary", str(summary), *extra, *tests], environ, basetemp / "soak"
    )
    took = time.monotonic() - start
    got = json.loads(summary.read_text()) if summary.exists() else {}
    print(f"\npytest exit {code} after {took:.0f} s: {got.get('tests', '?')} tests, {got.get('failed', '?')} failed")
    for n, pool in sorted(got.get("pools", {}).items()):
        print(f"{n}-rank pool: {pool['jobs']} jobs, started {pool['starts']} times")
    retries = got.get("retries", [])
    print(f"workers killed by a signal: {len(retries)}")
    for r in retries:
        print(json.dumps(r, indent=1)[:6000])
    invalid = 0
    for log in sorted(reports.glob("*.log")) if reports.exists() else []:
        errors = _invalid_accesses(log.read_text(errors="replace"))
        invalid += len(errors)
        print(f"{log}: {len(errors)} invalid reads or writes")
        for block in errors[:3]:
            print(block[:3000])
    cores = _cores(ROOT, basetemp)
    for core in cores:
        print(f"core dump: {core} (gdb {sys.executable} {core} -batch -ex 'thread apply all bt')")
    if not (retries or invalid or cores):
        shutil.rmtree(basetemp, ignore_errors=True)


def _invalid_accesses(text: str) -> list[str]:
    """memcheck's "Invalid read/write" reports in a log (each a block of ==PID== lines)."""
    blocks, block = [], []
    for line in text.splitlines():
        body = re.sub(r"^==\d+== ?", "", line)
        if body.strip():
            block.append(body)
            continue
        if block and block[0].startswith(("Invalid read", "Invalid write")):
            blocks.append("\n".join(block))
        block = []
    return blocks


if __name__ == "__main__":
    main()
