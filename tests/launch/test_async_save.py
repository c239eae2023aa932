"""Checkpoints written in the background (`run.async_save`): the checkpointer's rules hold for
them (visible only once complete, one write in flight, a failed write leaves the previous one), the
staged copy is the state at its step, and a whole run's async checkpoints equal its sync ones and
resume bit-equal under every backend; kill -9 mid-write loses nothing complete.

The fast tests drive the checkpointer on one process with a tiny model (no process group); the slow
ones train on the pool of ranks, and the kill test launches one real process."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

from launch.checkpoint import checkpointer as ckpt
from launch.checkpoint.async_writer import TEST_DELAY_ENV
from launch.checkpoint.dcp_state import ModelAndOptimizers
from launch.checkpoint.manifest import verify_manifest
from launch.runtime.process_group import DistEnv
from models import GPT, get_preset

ONE = DistEnv(0, 1, 0, torch.device("cpu"), "none")


def _model() -> tuple[GPT, torch.optim.Optimizer]:
    model = GPT(get_preset("tiny", n_layer=1, d_model=32, n_head=2, max_seq_len=16, vocab_size=64))
    opt = torch.optim.AdamW(model.parameters())
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()  # AdamW state exists, as in a checkpoint taken during training
    return model, opt


class _Gated:
    """The engine part, whose background write waits for `gate` first (a slow disk), or fails."""

    def __init__(self, inner: ModelAndOptimizers, gate: threading.Event, fail: OSError | None = None) -> None:
        self.inner, self.gate, self.fail = inner, gate, fail

    def save(self, directory: Path) -> None:
        self.inner.save(directory)

    def load(self, directory: Path) -> None:
        self.inner.load(directory)

    def stage(self, directory: Path, group: object):
        write = self.inner.stage(directory, group)

        def slow_write() -> None:
            assert self.gate.wait(30), "the test never opened the gate"
            write()
            if self.fail is not None:
                raise self.fail

        return slow_write


def _checkpointer(root: Path, part) -> ckpt.Checkpointer:
    checkpointer = ckpt.Checkpointer(root, ONE, sharded=[part], per_rank={})
    checkpointer.enable_background()  # no process group here: nothing to make
    return checkpointer


def test_a_background_checkpoint_is_published_only_once_written_and_one_write_is_in_flight(tmp_path):
    """While the write of step 2 is in flight, step 1 is the newest checkpoint and step 2 exists only
    as .tmp_step_2; a synchronous save of step 3 waits for it; both end up complete and intact."""
    model, opt = _model()
    gate = threading.Event()
    checkpointer = _checkpointer(tmp_path, _Gated(ModelAndOptimizers(model, [opt]), gate))
    first = checkpointer.save(1, {"note": "sync"})
    checkpointer.save(2, {"note": "async"}, background=True)
    time.sleep(0.05)
    assert ckpt.latest_checkpoint(tmp_path) == first
    assert (tmp_path / ".tmp_step_00000002").is_dir() and not ckpt.step_dir(tmp_path, 2).exists()
    threading.Timer(0.15, gate.set).start()
    started = time.perf_counter()
    third = checkpointer.save(3, {"note": "sync"})  # waits for step 2 first: at most one write at a time
    assert time.perf_counter() - started >= 0.15
    assert [p.name for p in ckpt.checkpoint_dirs(tmp_path)] == ["step_00000001", "step_00000002", "step_00000003"]
    assert ckpt.latest_checkpoint(tmp_path) == third
    assert all(verify_manifest(p) is None for p in ckpt.checkpoint_dirs(tmp_path))
    assert ckpt.read_meta(ckpt.step_dir(tmp_path, 2))["note"] == "async"


def test_a_background_write_that_fails_raises_at_the_next_wait_and_leaves_the_previous_checkpoint(tmp_path):
    model, opt = _model()
    gate = threading.Event()
    gate.set()
    full = OSError(errno.ENOSPC, "No space left on device")
    checkpointer = _checkpointer(tmp_path, _Gated(ModelAndOptimizers(model, [opt]), gate, fail=full))
    first = checkpointer.save(1, {})
    checkpointer.save(2, {}, background=True)  # the failure is the writer thread's: nothing raised here
    with pytest.raises(ckpt.SaveError) as err:
        checkpointer.wait()
    assert len(str(err.value).splitlines()) == 1 and "step 2 not written: no space left" in str(err.value)
    assert f"step 1 ({first}) is the latest intact" in str(err.value)
    assert ckpt.latest_checkpoint(tmp_path) == first and not list(tmp_path.glob(".tmp_*"))
    assert checkpointer.wait() is None  # the failure is reported once


def test_the_staged_copy_is_the_state_at_its_step_whatever_training_does_meanwhile(tmp_path, monkeypatch):
    """DCP's write held back until the weights and AdamW's moments have changed: the checkpoint holds
    the values of its step (the staging copied them; nothing the writer reads is shared)."""
    import torch.distributed.checkpoint.state_dict_saver as saver

    model, opt = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    moments = [opt.state[p]["exp_avg"].clone() for p in model.parameters()]
    gate, real_save = threading.Event(), saver.save

    def held_save(*args, **kwargs):
        assert gate.wait(30)
        return real_save(*args, **kwargs)

    monkeypatch.setattr(saver, "save", held_save)  # what DCP's async writer thread calls
    part = ModelAndOptimizers(model, [opt])
    checkpointer = _checkpointer(tmp_path, part)
    checkpointer.save(1, {}, background=True)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
            opt.state[p]["exp_avg"].add_(1.0)
    gate.set()
    checkpointer.wait()
    monkeypatch.undo()
    fresh_model, fresh_opt = _model()
    ModelAndOptimizers(fresh_model, [fresh_opt]).load(ckpt.step_dir(tmp_path, 1))
    for name, value in fresh_model.state_dict().items():
        assert torch.equal(value, before[name]), name
    for p, want in zip(fresh_model.parameters(), moments, strict=True):
        assert torch.equal(fresh_opt.state[p]["exp_avg"], want)


def test_the_runs_saves_go_to_the_background_but_a_stop_or_the_last_step_waits_for_every_write(tmp_path):
    """launch.trainer.Trainer.save (launch.features.checkpointing) with run.async_save: an interval save
    returns with its write in flight; a stop signal's save (wait=True, as the loop makes it on SIGTERM)
    first waits for that write, then writes its own before returning, as the last step's save does:
    nothing in flight."""
    from types import SimpleNamespace

    from launch.features.checkpointing import Checkpointing
    from launch.plan import load_config
    from launch.trainer import Trainer
    from tests.helpers import SMALL, TINY

    model, opt = _model()
    gate = threading.Event()
    run = Trainer.__new__(Trainer)  # the fields a save reads; the rest of a run is not needed here
    run.cfg = load_config(TINY, [*SMALL, f"run.dir={tmp_path}", "run.async_save=true", "train.max_steps=9"])
    run.features = [Checkpointing(run.cfg)]
    run.checkpointer = _checkpointer(tmp_path, _Gated(ModelAndOptimizers(model, [opt]), gate))
    run.meter, run.meta = SimpleNamespace(divergence=lambda: None), {}
    run.state = SimpleNamespace(step=3, tokens=0)
    run.save()
    assert run.checkpointer._pending is not None and not ckpt.step_dir(tmp_path, 3).exists()
    threading.Timer(0.1, gate.set).start()
    run.state.step = 5
    run.save(wait=True)  # SIGTERM's save
    assert run.checkpointer._pending is None
    assert [p.name for p in ckpt.checkpoint_dirs(tmp_path)] == ["step_00000003", "step_00000005"]
    run.state.step = 9
    run.save()  # the last step
    assert run.checkpointer._pending is None and ckpt.latest_checkpoint(tmp_path) == ckpt.step_dir(tmp_path, 9)


# ---------------------------------------------------------------- whole runs (the pool, one launch)
ASYNC = ["optim.name=orscale_lm", "train.eval_every=0", "train.ckpt_every=2", "train.max_steps=3"]


def _same_checkpoint(a: Path, b: Path) -> None:
    """Two checkpoints hold the same weights, optimizer state (by name, whole) and per-rank states."""
    from launch.checkpoint.portable import read_optimizer_state, read_weights

    wa, wb = read_weights(a), read_weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    shapes = {k: v.shape for k, v in wa.items()}
    sa, sb = read_optimizer_state(a, shapes), read_optimizer_state(b, shapes)
    assert sa.keys() == sb.keys() and sa
    assert _equal(sa, sb)
    for rank_file in sorted(a.glob("rank*.pt")):
        ra, rb = (torch.load(d / rank_file.name, weights_only=True) for d in (a, b))
        for part in ("loader", "train_state"):  # the meter's window holds wall-clock times
            assert _equal(ra[part], rb[part]), (rank_file.name, part)


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.slow
@pytest.mark.parametrize(
    ("nproc", "backends"),
    [(1, ["none"]), pytest.param(2, ["fsdp", "zero2"], marks=pytest.mark.distributed)],
)
def test_async_checkpoints_equal_sync_ones_and_resume_bit_equal(tmp_path, nproc, backends):
    """Per backend: a sync run and an async run (3 steps, an interval checkpoint at step 2, written in
    the background while step 3 trains) have the same losses and the same checkpoint at step 2,
    tensor for tensor; a third run resumed from the async one's step 2 trains step 3 bit-equal."""
    from tests.helpers import run_many, train_losses

    runs = []
    for backend in backends:
        common = [*ASYNC, f"parallel.backend={backend}"]
        d = tmp_path / backend
        async_step_2 = ckpt.step_dir(d / "async" / "checkpoints", 2)
        runs += [
            [f"run.dir={d / 'sync'}", *common],
            [f"run.dir={d / 'async'}", *common, "run.async_save=true"],
            [f"run.dir={d / 'resumed'}", *common, "run.async_save=true", f"run.resume={async_step_2}"],
        ]
    run_many(runs, nproc)
    for backend in backends:
        d = tmp_path / backend
        sync, async_ = train_losses(d / "sync"), train_losses(d / "async")
        assert sorted(sync) == [1, 2, 3] and async_ == sync, backend
        assert train_losses(d / "resumed") == {3: sync[3]}, backend
        _same_checkpoint(ckpt.step_dir(d / "sync" / "checkpoints", 2), ckpt.step_dir(d / "async" / "checkpoints", 2))


@pytest.mark.slow
def test_kill_9_during_a_background_write_keeps_the_previous_checkpoint_and_resumes_exactly(tmp_path):
    """One process, checkpoints every 3 steps written in the background; the write of step 6 is held
    (the test-only delay) while training goes on to step 8, then kill -9: step 3 is the newest
    checkpoint, intact, step 6 only an unpublished .tmp; the same command resumes from step 3 and
    trains every step bit-equal to an uninterrupted run."""
    from tests.helpers import ROOT, env, metrics, train_cmd, train_in_pool, train_losses
    from tests.launch.test_resume import _wait_for_step

    common = ["optim.name=orscale_lm", "train.max_steps=9", "train.ckpt_every=3", "train.eval_every=0"]
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        train_cmd([f"run.dir={killed}", *common, "run.async_save=true"]),
        cwd=ROOT,
        env={**env(), TEST_DELAY_ENV: "6:300"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for_step(killed, 8, proc)
        held = killed / "checkpoints" / ".tmp_step_00000006"
        assert held.is_dir() and (held / "dcp" / ".metadata").is_file(), "step 6's files are written, unpublished"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    latest = ckpt.latest_checkpoint(killed / "checkpoints")
    assert latest == ckpt.step_dir(killed / "checkpoints", 3) and verify_manifest(latest) is None
    assert not ckpt.step_dir(killed / "checkpoints", 6).exists()
    train_in_pool([f"run.dir={killed}", *common, "run.async_save=true"])  # the same command, no delay
    train_in_pool([f"run.dir={tmp_path / 'straight'}", *common])
    assert train_losses(killed) == train_losses(tmp_path / "straight")
    steps = [m["step"] for m in metrics(killed) if "train_loss" in m]
    assert steps == sorted(set(steps)) == list(range(1, 10)), "a step is missing or there twice"
