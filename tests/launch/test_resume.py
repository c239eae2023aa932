"""Exact resume: SIGKILL + auto-resume, SIGTERM, interrupted saves, elastic 2 -> 1 ranks."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from stat import S_IMODE

import pytest
import torch

from launch.checkpoint import checkpointer as ckpt
from launch.checkpoint.dcp_state import ModelAndOptimizers
from tests.helpers import ROOT, env, metrics, train_cmd, train_in_pool, train_losses

pytestmark = pytest.mark.slow


def _wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 300, poll_s: float = 0.2) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stderr.read()[-3000:]}")
        path = run_dir / "metrics.jsonl"
        if path.exists() and any(m.get("step", 0) >= step for m in metrics(run_dir)):
            return
        time.sleep(poll_s)
    raise AssertionError("timed out waiting for the run")


def _survivors(run_dir: Path, timeout: float = 20) -> list[int]:
    """Processes still running with `run_dir` on their command line, after up to `timeout` s."""
    import psutil

    deadline = time.time() + timeout
    while True:
        alive = []
        for p in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if any(str(run_dir) in part for part in p.info["cmdline"] or []) and p.info["status"] != "zombie":
                    alive.append(p.info["pid"])
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.5)


def _kill_and_resume(run_dir: Path, overrides: list[str], nproc: int, kill_after: int) -> None:
    proc = subprocess.Popen(
        train_cmd([f"run.dir={run_dir}", *overrides], nproc),
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    _wait_for_step(run_dir, kill_after, proc)
    # torchrun's process group: its workers live in sessions of their own, so only their
    # parent-death signal can take them down with it.
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _survivors(run_dir) == [], "a worker outlived its launcher"
    assert ckpt.latest_checkpoint(run_dir / "checkpoints") is not None
    train_in_pool([f"run.dir={run_dir}", *overrides], nproc)  # run.resume=auto is the default


@pytest.mark.distributed
def test_a_launcher_killed_during_start_up_takes_its_workers_along(tmp_path):
    """kill -9 of torchrun while its workers are still starting, then the same command at once
    (same rendezvous port, as a requeue runs it): a worker that missed its parent's death notices
    it was adopted by init and exits, instead of joining the relaunch's rendezvous or training as
    an orphan into the run directory; the relaunch runs normally."""
    import psutil

    from launch.launcher.parent_death import init_cmdline

    if any(name in init_cmdline() for name in ("python", "torchrun", "accelerate", "deepspeed")):
        pytest.skip("PID 1 here is a launcher-like process: an adopted worker cannot tell")
    run_dir = tmp_path / "run"
    cmd = train_cmd([f"run.dir={run_dir}", "parallel.backend=ddp", "train.max_steps=3", "train.eval_every=0"], nproc=2)
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 120
    while time.time() < deadline:  # the workers exist: kill now, while they import torch
        workers = [
            c
            for c in psutil.Process(proc.pid).children(recursive=True)
            if any("train.py" in part for part in c.cmdline())
        ]
        if len(workers) == 2:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("torchrun started no workers")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    again = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(train_losses(run_dir)) == [1, 2, 3]
    assert _survivors(run_dir) == [], "a worker outlived its launcher"


def test_sigkill_then_auto_resume_is_bit_exact_one_process(tmp_path):
    """kill -9 mid-run (after step 5, checkpoints every 3), then the same command: every step once,
    bit for bit, the window audit and validation too. OrScale-LM (its calibration constants ride the
    checkpoint); the kill's handling does not depend on the optimizer (AdamW's state resumes in
    test_distributed's 2 -> 1 and the portability matrix)."""
    common = [
        "optim.name=orscale_lm",
        "train.max_steps=8",
        "train.ckpt_every=3",
        "train.eval_every=4",
        "train.record_windows=true",
    ]
    train_in_pool([f"run.dir={tmp_path / 'straight'}", *common])
    _kill_and_resume(tmp_path / "killed", common, nproc=1, kill_after=5)
    straight, resumed = train_losses(tmp_path / "straight"), train_losses(tmp_path / "killed")
    assert resumed == straight  # bit for bit, every step once
    steps = [m["step"] for m in metrics(tmp_path / "killed") if "train_loss" in m]
    assert steps == sorted(set(steps)), "duplicate steps in metrics.jsonl"
    windows = [(d / "windows_rank0.txt").read_text() for d in (tmp_path / "killed", tmp_path / "straight")]
    assert windows[0] == windows[1], "the window audit holds a step twice or misses one"
    vals = lambda d: [m["val_loss"] for m in metrics(d) if "val_loss" in m]
    assert vals(tmp_path / "killed") == vals(tmp_path / "straight")


@pytest.mark.distributed
def test_sigkill_then_auto_resume_is_bit_exact_fsdp_two_ranks(tmp_path):
    """The same under torchrun: the launcher killed with its workers, FSDP2's sharded checkpoint."""
    common = [
        "optim.name=orscale_lm",
        "parallel.backend=fsdp",
        "train.max_steps=6",
        "train.ckpt_every=3",
        "train.eval_every=0",
    ]
    train_in_pool([f"run.dir={tmp_path / 'straight'}", *common], nproc=2)
    _kill_and_resume(tmp_path / "killed", common, nproc=2, kill_after=4)
    assert train_losses(tmp_path / "killed") == train_losses(tmp_path / "straight")


ZERO_RUN = [
    "optim.name=orscale_lm",
    "parallel.backend=zero2",
    "train.max_steps=6",
    "train.ckpt_every=3",
    "train.eval_every=0",
]


@pytest.fixture(scope="module")
def zero2_straight(tmp_path_factory) -> Path:
    """An uninterrupted 2-rank ZeRO-2 run of 6 steps, checkpoints at steps 3 and 6."""
    run_dir = tmp_path_factory.mktemp("zero2") / "straight"
    train_in_pool([f"run.dir={run_dir}", *ZERO_RUN], nproc=2)
    return run_dir


@pytest.mark.distributed
def test_sigkill_then_auto_resume_is_bit_exact_zero2_two_ranks(tmp_path, zero2_straight):
    _kill_and_resume(tmp_path / "killed", ZERO_RUN, nproc=2, kill_after=4)
    assert train_losses(tmp_path / "killed") == train_losses(zero2_straight)


@pytest.mark.distributed
def test_zero2_checkpoint_of_two_ranks_resumes_on_one_with_zero1(tmp_path, zero2_straight):
    """ZeRO state is saved by parameter name: a 2-rank ZeRO-2 checkpoint continues on 1 rank under
    ZeRO-1 (other partitions, other owners) with the same losses and calibration constants."""
    run_dir = tmp_path / "one"
    train_in_pool(
        [
            f"run.dir={run_dir}",
            f"run.resume={ckpt.step_dir(zero2_straight / 'checkpoints', 3)}",
            *ZERO_RUN[:1],
            "parallel.backend=zero1",
            *ZERO_RUN[2:],
        ],
        nproc=1,
    )
    straight, resumed = train_losses(zero2_straight), train_losses(run_dir)
    assert sorted(resumed) == [4, 5, 6]
    for step, loss in resumed.items():
        assert loss == pytest.approx(straight[step], rel=1e-5), step
    c_straight, c_resumed = _calibration(zero2_straight), _calibration(run_dir)
    assert c_straight and c_resumed == pytest.approx(c_straight, rel=1e-6)


@pytest.mark.distributed
def test_every_file_of_a_zero_checkpoint_gets_the_umasks_mode(zero2_straight):
    """safetensors writes through a temporary file (0600) renamed into place: the ZeRO files (each rank's
    state, the weights) get the mode of the rest of the checkpoint, the one the umask gives."""
    umask = os.umask(0)
    os.umask(umask)
    step = zero2_straight / "checkpoints/step_00000003"
    modes = {str(p.relative_to(step)): oct(S_IMODE(p.stat().st_mode)) for p in step.rglob("*") if p.is_file()}
    assert {"zero/rank0.safetensors", "zero/rank1.safetensors", "model.safetensors", "meta.json"} <= set(modes)
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes


def _calibration(run_dir: Path) -> dict[str, float]:
    """The calibration constants (per matrix class) in the last training line of metrics.jsonl."""
    last = [m for m in metrics(run_dir) if "train_loss" in m][-1]
    return {k: v for k, v in last.items() if k.endswith("/c")}


@pytest.mark.distributed
def test_save_on_two_ranks_resume_on_one_sees_every_window_once(tmp_path):
    run_dir = tmp_path / "run"
    common = [f"run.dir={run_dir}", "optim.name=orscale_lm", "train.record_windows=true", "train.eval_every=0"]
    train_in_pool([*common, "parallel.backend=fsdp", "train.max_steps=4"], nproc=2)
    c_before = _calibration(run_dir)
    train_in_pool([*common, "train.max_steps=8"], nproc=1)
    c_after = _calibration(run_dir)
    # Calibration constants travel with the checkpoint; recomputing them from the trained weights
    # would give other values.
    assert c_before and c_after == pytest.approx(c_before, rel=1e-6)
    rows = []
    for f in run_dir.glob("windows_rank*.txt"):
        rows += [line.split() for line in f.read_text().splitlines()]
    per_step = Counter(int(step) for step, _ in rows)
    assert sorted(per_step) == list(range(1, 9)) and set(per_step.values()) == {512 // 64}
    hashes = [h for _, h in rows]
    assert len(hashes) == len(set(hashes)) == 8 * 8, "a window was seen twice"
    # The uninterrupted single-process stream holds exactly the same windows.
    ref = tmp_path / "ref"
    train_in_pool(
        [
            f"run.dir={ref}",
            "optim.name=orscale_lm",
            "train.record_windows=true",
            "train.eval_every=0",
            "train.max_steps=8",
        ]
    )
    ref_hashes = [line.split()[1] for line in (ref / "windows_rank0.txt").read_text().splitlines()]
    assert set(hashes) == set(ref_hashes)


def test_a_resume_rolls_the_window_audit_back_to_its_step(tmp_path):
    """A kill at step 37, a resume from 30: windows_rank*.txt holds steps 31-37 once, as metrics.jsonl
    does; rank 0 also rolls back the file of a rank the resumed run no longer has; a new start keeps
    the old files under new names."""
    from launch.run.run_dir import WindowAudit

    for rank in (0, 1):
        lines = "".join(f"{step} {step * 10 + rank}\n" for step in range(1, 38))
        (tmp_path / f"windows_rank{rank}.txt").write_text(lines + "38 3")  # the last line cut by the kill
    audit = WindowAudit.resume(tmp_path, rank=0, world_size=1, start_step=30)
    for step in range(31, 41):
        audit.record(step, torch.full((1, 4), step))
    audit.close()
    steps = [[int(line.split()[0]) for line in (tmp_path / f"windows_rank{r}.txt").open()] for r in (0, 1)]
    assert steps == [list(range(1, 41)), list(range(1, 31))], "the audit holds a step twice"
    WindowAudit.resume(tmp_path, rank=0, world_size=1, start_step=0).close()
    assert (tmp_path / "windows_rank0.txt").read_text() == "" and not (tmp_path / "windows_rank1.txt").exists()
    assert len(list(tmp_path.glob("windows_rank[01].*.txt"))) == 2


def test_sigterm_saves_a_checkpoint_and_exits_zero(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        train_cmd([f"run.dir={run_dir}", "optim.name=adamw", "train.max_steps=500", "train.eval_every=0"]),
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_step(run_dir, 2, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()[-2000:]
    latest = ckpt.latest_checkpoint(run_dir / "checkpoints")
    assert latest is not None and 2 <= ckpt.read_meta(latest)["step"] < 500


@pytest.mark.distributed
@pytest.mark.parametrize("target", ["launcher", "process group"])
def test_sigterm_under_the_launcher_checkpoints_and_exits_zero(tmp_path, target):
    """launch/launcher/forwarding.py (what launch/scripts/torchrun.sh and slurm.sbatch run): SIGTERM to it, or to
    its whole process group as a terminal or a scheduler would, ends 2 ranks with a checkpoint and
    exit status 0 (plain torchrun exits 1 and kills the workers after 30 s)."""
    import sys

    from tests.helpers import SMALL, TINY

    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "launch.launcher",
        "--standalone",
        "--nproc_per_node=2",
        str(ROOT / "train.py"),
        "--config",
        TINY,
        *SMALL,
        f"run.dir={run_dir}",
        "parallel.backend=fsdp",
        "optim.name=adamw",
        "train.max_steps=500",
        "train.eval_every=0",
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    _wait_for_step(run_dir, 2, proc)
    if target == "launcher":
        proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=180) == 0, proc.stderr.read()[-3000:]
    latest = ckpt.latest_checkpoint(run_dir / "checkpoints")
    assert latest is not None and 2 <= ckpt.read_meta(latest)["step"] < 500
    assert _survivors(run_dir) == []


def test_a_save_interrupted_halfway_leaves_latest_valid(tmp_path, monkeypatch):
    import torch

    from launch.runtime.process_group import DistEnv
    from models import GPT, get_preset

    model = GPT(get_preset("tiny", n_layer=1, d_model=32, n_head=2, max_seq_len=16, vocab_size=64))
    opt = torch.optim.AdamW(model.parameters())
    env1 = DistEnv(0, 1, 0, torch.device("cpu"), "none")
    root = tmp_path / "checkpoints"
    checkpointer = ckpt.Checkpointer(root, env1, sharded=[ModelAndOptimizers(model, [opt])], per_rank={})
    good = checkpointer.save(1, {"note": "ok"})

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed mid-save")

    # Everything but meta.json is written when the "crash" comes: the worst moment.
    monkeypatch.setattr(ckpt, "_write_durable", crash)
    with pytest.raises(KeyboardInterrupt):
        checkpointer.save(2, {"note": "bad"})
    assert ckpt.latest_checkpoint(root) == good
    assert ckpt.read_meta(good)["note"] == "ok"
    monkeypatch.undo()
    checkpointer.save(2, {"note": "ok2"})
    assert ckpt.latest_checkpoint(root).name == "step_00000002"
    assert not list(root.glob(".tmp_*")), "debris of the interrupted save was not cleaned"


def test_resume_guards_refuse_incompatible_changes_and_allow_harmless_ones(tmp_path, capsys, caplog):
    from launch.loop import main as train_main
    from tests.helpers import SMALL_ADAMW, TINY

    gpt2 = ["data.tokenizer=assets/tokenizers/gpt2", "model.vocab_size=50304"]  # room for Mistral's 32k below
    base = ["--config", TINY, *SMALL_ADAMW, *gpt2, f"run.dir={tmp_path}", "optim.name=adamw", "train.eval_every=0"]
    assert train_main([*base, "train.max_steps=2"]) == 0
    for change, key in (
        ("optim.name=orscale_lm", "config.optim.name"),
        ("model.d_model=32", "d_model"),
        ("data.tokenizer=assets/tokenizers/mistral_v1", "tokenizer"),
        ("data.logical_shards=8", "logical_shards"),
        ("optim.adamw_lr=0.01", "optim.adamw_lr"),  # adamw's param groups split for it
    ):
        capsys.readouterr()
        assert train_main([*base, "train.max_steps=4", change]) == 2, change
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "cannot resume" in err[0] and key in err[0], err
    caplog.clear()
    assert train_main([*base, "train.max_steps=3", "train.log_every=2", "optim.lr=0.002"]) == 0
    changed = caplog.text.split("changed settings")[-1]
    assert "optim.lr" in changed and "train.max_steps: 2 -> 3" in changed and "log_every" not in changed
    from tests.helpers import train_losses

    assert sorted(train_losses(tmp_path)) == [1, 2, 3]


def test_checkpoints_of_an_older_format_are_refused_in_one_line_and_still_export(tmp_path, capsys):
    """Before the data path addressed documents by piece (format 1, no "format" in meta.json) the
    loader state meant something else: resuming is refused clearly; the weights still export."""
    import json

    from launch.export import main as export_main
    from launch.loop import main as train_main
    from tests.helpers import SMALL_ADAMW, TINY

    base = ["--config", TINY, *SMALL_ADAMW, f"run.dir={tmp_path / 'run'}", "optim.name=adamw", "train.eval_every=0"]
    base.append("optim.warmup_steps=1")  # no warmup warning beside the one error line
    assert train_main([*base, "train.max_steps=1"]) == 0
    latest = ckpt.latest_checkpoint(tmp_path / "run" / "checkpoints")
    meta = json.loads((latest / "meta.json").read_text())
    del meta["format"]
    (latest / "meta.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert train_main([*base, "train.max_steps=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "older trainer" in err[0] and "launch.export" in err[0], err
    assert export_main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
