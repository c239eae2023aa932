"""Hangs that end, in one process: the stack dumps of a stalled step (a data read that does not
return), the keys, what a collective's error becomes, NCCL's error-handling setting. The stalled
rank under torchrun (SIGSTOP, timeout, restart) is tests/launch/test_multinode.py."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from launch.errors import ConfigError
from launch.plan import load_config
from launch.runtime import hangs
from launch.runtime.hangs import CommFailure, comm_failure
from launch.runtime.stack_dumps import StallWatch
from tests.helpers import SMALL, TINY, train_losses

# What torch 2.13's gloo raises in the waiting rank (seen in the SIGSTOP test's runs).
GLOO_TIMEOUT = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms "
    "for recv operation to complete"
)
GLOO_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:28375. This is typically caused by a remote worker crashing."
)


def _a_read_that_does_not_return(release: threading.Event) -> None:
    release.wait(timeout=120)  # the test releases it; bounded so that a failing test cannot hang


def test_a_stalled_data_read_dumps_every_threads_stack_naming_the_step(tmp_path, monkeypatch, capfd, one_thread):
    """Step 3's windows do not come (the reader thread blocks): while it lasts, each
    train.stall_dump_s a header line names the step and the stacks show the blocked read; the run
    is not stopped, and once the read returns it ends with the losses of a run that never stalled."""
    from data.loader import PackedLoader
    from launch.loop import main as train_main

    base = ["--config", TINY, *SMALL, "optim.name=adamw", "train.max_steps=3", "train.eval_every=0"]
    assert train_main([*base, f"run.dir={tmp_path / 'straight'}"]) == 0
    produce, calls, release = PackedLoader._produce, [0], threading.Event()

    def stalling(self):
        calls[0] += 1
        if calls[0] == 3:  # the third step's windows (read ahead by the reader thread)
            _a_read_that_does_not_return(release)
        return produce(self)

    monkeypatch.setattr(PackedLoader, "_produce", stalling)
    dump, dumps = StallWatch._dump, [0]

    def counted(self, step, waited):  # the read returns after step 3's second dump
        dump(self, step, waited)
        dumps[0] += step == 3
        if dumps[0] >= 2:
            release.set()

    monkeypatch.setattr(StallWatch, "_dump", counted)
    assert train_main([*base, f"run.dir={tmp_path / 'stalled'}", "train.stall_dump_s=1"]) == 0
    assert release.is_set() and dumps[0] >= 2
    err = capfd.readouterr().err
    # (A loaded machine's ordinary steps may pass 1 s too: they get their dumps, as they should.)
    headers = [line for line in err.splitlines() if "stall: step 3 has run for" in line]
    assert len(headers) >= 2 and all("train.stall_dump_s=1" in h for h in headers), err[-3000:]
    assert "_a_read_that_does_not_return" in err, "the stack dump does not show the blocked read"
    assert "Thread 0x" in err and "_loop" in err  # every thread: the reader's and the loop waiting for it
    assert train_losses(tmp_path / "stalled") == train_losses(tmp_path / "straight")


def test_the_stall_watch_is_quiet_while_steps_finish_and_off_at_zero(capfd):
    watch = StallWatch(0.5)
    for step in range(1, 9):
        watch.beat(step)
        time.sleep(0.1)
    watch.close()
    assert "stall:" not in capfd.readouterr().err
    off = StallWatch(0)
    off.beat(5)
    assert off.step == 5 and off._thread is None
    off.close()


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("parallel.comm_timeout_s=0", "parallel.comm_timeout_s"),
        ("parallel.init_timeout_s=-1", "parallel.init_timeout_s"),
        ("train.stall_dump_s=-5", "train.stall_dump_s"),
    ],
)
def test_timeouts_that_cannot_be_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key):
        load_config(TINY, [override])


def test_a_collective_error_becomes_one_line_naming_the_timeout_the_step_and_the_way_back():
    args = (0, "in step 9", "parallel.comm_timeout_s=5", "the newest checkpoint is step 5; the same command resumes")
    timed_out = comm_failure(RuntimeError(GLOO_TIMEOUT), *args)
    assert isinstance(timed_out, CommFailure)
    assert str(timed_out).startswith("rank 0: a collective timed out (parallel.comm_timeout_s=5) in step 9")
    assert "checkpoint is step 5" in str(timed_out) and "\n" not in str(timed_out)
    closed = comm_failure(RuntimeError(GLOO_CLOSED), *args)
    assert closed is not None and "connection closed" in str(closed) and "in step 9" in str(closed)
    # gloo's word to the rank's other operations once one recv timed out: no source path in it
    closure = comm_failure(RuntimeError("Application timeout caused pair closure"), *args)
    assert closure is not None and str(closure).startswith("rank 0: a collective timed out")
    nccl = comm_failure(dist.DistBackendError("Watchdog caught collective operation timeout: WorkNCCL(...)"), *args)
    assert nccl is not None and "timed out" in str(nccl)
    # Anything else keeps its traceback.
    assert comm_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"), *args) is None


def test_nccl_timeouts_end_the_process_unless_the_user_chose_otherwise(monkeypatch):
    for name in hangs.ASYNC_ERROR_HANDLING:
        monkeypatch.delenv(name, raising=False)
    assert hangs.nccl_ends_on_timeout() is None
    import os

    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")  # torch's default: also ends it
    assert hangs.nccl_ends_on_timeout() is None
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    warning = hangs.nccl_ends_on_timeout()
    assert warning is not None and "TORCH_NCCL_ASYNC_ERROR_HANDLING=0" in warning and "set it to 1" in warning
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"  # chosen: kept


class _GroupMade(Exception):
    """Raised by the stand-in for `init_process_group`: the environment it saw is the test's answer."""


def _init_as_on_a_gpu_node(monkeypatch, device: str, run_dir) -> dict[str, str]:
    """`init_distributed` as rank 3 of 8 on a node whose torch reports 8 GPUs (CUDA's answers patched
    in); the environment its `init_process_group` call would have seen."""
    import os

    import torch
    import torch.distributed.distributed_c10d as c10d

    from launch.backends.registry import backend_for
    from launch.runtime.process_group import init_distributed

    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if "NCCL" not in k and "FR_" not in k})
    for key, value in {"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ[key] = value
    os.environ["MASTER_PORT"] = "29500"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(c10d, "default_pg_timeout", c10d.default_pg_timeout)  # set_default_timeout's, put back
    monkeypatch.setattr(c10d, "default_pg_nccl_timeout", c10d.default_pg_nccl_timeout)
    seen: dict[str, str] = {}

    def made(backend, **kwargs):
        seen.update(os.environ, BACKEND=backend)
        raise _GroupMade

    monkeypatch.setattr(dist, "init_process_group", made)
    with pytest.raises(_GroupMade):
        init_distributed(backend_for("ddp"), device, 60.0, run_dir)
    return seen


def test_nccl_groups_are_made_with_the_flight_recorder_dumping_beside_the_run(tmp_path, monkeypatch):
    """A stuck NCCL collective is named by NCCL's flight recorder, not by a host stack: the NCCL path
    turns it on (ring, dump at a timeout, dumps in the run directory) before the group exists."""
    seen = _init_as_on_a_gpu_node(monkeypatch, "auto", tmp_path / "run")
    assert seen["BACKEND"] == "nccl"
    assert seen["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert seen["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    prefix = str((tmp_path / "run").resolve() / "nccl_trace_rank_")
    assert seen["TORCH_FR_DUMP_TEMP_FILE"] == prefix
    assert seen["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    # Not their deprecated names too: c10d would log a warning for each in every rank.
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in seen and "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in seen


def test_the_flight_recorder_is_set_by_the_names_an_older_torch_reads(tmp_path, monkeypatch):
    """torch before 2.9 knows only TORCH_NCCL_TRACE_BUFFER_SIZE and TORCH_NCCL_DEBUG_INFO_TEMP_FILE."""
    import os

    import torch
    from torch.torch_version import TorchVersion

    from launch.runtime.hangs import nccl_flight_recorder

    monkeypatch.setattr(os, "environ", {})
    monkeypatch.setattr(torch, "__version__", TorchVersion("2.8.0+cu128"))
    prefix = str(tmp_path.resolve() / "nccl_trace_rank_")
    wanted = {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
    }
    assert nccl_flight_recorder(tmp_path) == wanted and os.environ == wanted


# A fresh process (c10d reads the recorder's settings once, when its first group is made, and warns
# once): the recorder's settings as the trainer makes them, then a gloo group of one and a collective.
# On a CPU build too, c10d's flight recorder reads its settings there.
_RECORDER_ON_A_GROUP = """
import sys, torch, torch.distributed as dist
from launch.runtime.hangs import nccl_flight_recorder
print(sorted(nccl_flight_recorder(sys.argv[1])))
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
dist.all_reduce(torch.ones(2))
dist.destroy_process_group()
"""


@pytest.mark.slow  # a Python process of its own
def test_the_flight_recorders_settings_draw_no_deprecation_warning_from_torch(tmp_path):
    import subprocess
    import sys

    from tests.helpers import env

    clean = {k: v for k, v in env().items() if not k.startswith(("TORCH_NCCL", "TORCH_FR"))}
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", _RECORDER_ON_A_GROUP, str(run_dir), str(tmp_path / "store")],
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TORCH_FR_BUFFER_SIZE" in done.stdout and "TORCH_FR_DUMP_TEMP_FILE" in done.stdout  # this torch's names
    assert "deprecated" not in done.stderr, done.stderr[-3000:]
    assert not run_dir.exists()  # no timeout: nothing dumped


def test_the_flight_recorder_keeps_a_users_settings_and_stays_off_gloo(tmp_path, monkeypatch):
    import os

    from launch.runtime.hangs import nccl_flight_recorder

    monkeypatch.setattr(os, "environ", {"TORCH_FR_BUFFER_SIZE": "0", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x/fr_"})
    assert nccl_flight_recorder(tmp_path) == {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}  # the two chosen ones kept
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ and "TORCH_FR_DUMP_TEMP_FILE" not in os.environ
    seen = _init_as_on_a_gpu_node(monkeypatch, "cpu", tmp_path)  # train.device=cpu on a GPU node: gloo
    assert seen["BACKEND"] == "gloo"
    assert not any(k.startswith(("TORCH_NCCL", "TORCH_FR")) for k in seen)


def _rank_1s_reader_fails(argv: list[str], fail_at: int) -> dict:
    """`train.py ARGV` on the pool's ranks with rank 1's reader failing for good at the windows of
    step `fail_at`: the error each rank stopped with, when, and when rank 1's reader failed."""
    import os

    from data import DataError
    from data.loader import PackedLoader
    from tests.pool_jobs import train_runs

    rank, produce, calls, failed_at = int(os.environ["RANK"]), PackedLoader._produce, [0], [0.0]

    def failing(self):
        calls[0] += 1
        if rank == 1 and calls[0] >= fail_at:
            failed_at[0] = failed_at[0] or time.time()
            raise DataError("stand-in: row group 3 of a.parquet could not be read after 5 attempts")
        return produce(self)

    PackedLoader._produce = failing
    try:
        train_runs([argv])
    except DataError as err:
        return {"error": str(err), "at": time.time(), "failed_at": failed_at[0]}
    finally:
        PackedLoader._produce = produce
    return {"error": None}


def test_a_reader_that_fails_reading_ahead_stops_the_run_saying_so(tmp_path, monkeypatch, capfd):
    """The reader fails on step 5's windows while the loop still trains the steps it read before: the
    run saves and stops saying that the data reader failed (no signal was sent), then exits with the
    read's one line."""
    from data import DataError
    from data.loader import PackedLoader
    from launch.checkpoint import latest_checkpoint, read_meta
    from launch.loop import main as train_main

    produce, calls = PackedLoader._produce, [0]

    def failing(self):
        calls[0] += 1
        if calls[0] >= 5:
            raise DataError("stand-in: row group 3 of a.parquet could not be read after 5 attempts")
        return produce(self)

    monkeypatch.setattr(PackedLoader, "_produce", failing)
    argv = ["--config", TINY, *SMALL, "optim.name=adamw", "train.max_steps=8", "train.eval_every=0"]
    assert train_main([*argv, "train.ckpt_every=0", "data.prefetch_steps=2", f"run.dir={tmp_path}"]) == 2
    err = capfd.readouterr().err
    stops = [line for line in err.splitlines() if "saving a checkpoint at step" in line]
    assert len(stops) == 1 and "the data reader of rank 0 failed on a step it read ahead" in stops[0], err[-3000:]
    assert "signal" not in err, err[-3000:]
    assert "error: stand-in: row group 3 of a.parquet could not be read after 5 attempts" in err
    saved = read_meta(latest_checkpoint(tmp_path / "checkpoints"))["step"]
    assert 1 <= saved <= 4 and f"saving a checkpoint at step {saved} " in stops[0]


@pytest.mark.slow
@pytest.mark.distributed
def test_a_rank_whose_reader_fails_stops_every_rank_at_the_step_boundary_and_saves(tmp_path):
    """Rank 1's reader fails for good at step 3's windows with nothing queued: rank 0 must not wait
    in step 3's collectives until parallel.comm_timeout_s (30 s here). Every rank agrees before
    them, step 2 is saved, and each stops with one line (rank 0's names rank 1 and its read)."""
    from launch.checkpoint import latest_checkpoint, read_meta
    from tests.pool import rank_pool

    argv = ["--config", TINY, *SMALL, "parallel.backend=ddp", "optim.name=adamw", "train.max_steps=6"]
    argv += ["train.eval_every=0", "train.ckpt_every=0", "parallel.comm_timeout_s=30", f"run.dir={tmp_path}"]
    argv += ["data.prefetch_steps=0"]  # read in the step: nothing queued when the read fails
    rank0, rank1 = rank_pool(2).run(_rank_1s_reader_fails, argv, 3)
    assert rank1["error"] == "stand-in: row group 3 of a.parquet could not be read after 5 attempts"
    assert rank0["error"] == f"rank 1 could not read step 3: {rank1['error']}"
    assert rank0["at"] - rank1["failed_at"] < 10, "rank 0 waited for rank 1 in a collective"  # 0.3 s here
    assert read_meta(latest_checkpoint(tmp_path / "checkpoints"))["step"] == 2


@pytest.mark.slow
@pytest.mark.distributed
def test_a_rank_whose_reader_fails_reading_ahead_is_named_by_rank_0(tmp_path):
    """Rank 1's reader fails on step 5's windows while both ranks still train steps read before: they
    stop together after saving, rank 0 saying whose reader failed (it holds no failure itself), rank 1
    with the read's line."""
    from launch.checkpoint import latest_checkpoint, read_meta
    from tests.pool import rank_pool

    argv = ["--config", TINY, *SMALL, "parallel.backend=ddp", "optim.name=adamw", "train.max_steps=8"]
    argv += ["train.eval_every=0", "train.ckpt_every=0", "data.prefetch_steps=2", f"run.dir={tmp_path}"]
    rank0, rank1 = rank_pool(2).run_results(_rank_1s_reader_fails, argv, 5)
    assert rank0.value == {"error": None} and rank1.value["error"].startswith("stand-in: row group 3"), rank1.log
    saved = read_meta(latest_checkpoint(tmp_path / "checkpoints"))["step"]
    stop = f"the data reader of rank 1 failed on a step it read ahead: saving a checkpoint at step {saved} and exiting"
    assert stop in rank0.log and "signal" not in rank0.log, rank0.log
    assert f"stopped on a failed data read at step {saved}" in rank0.log, rank0.log
