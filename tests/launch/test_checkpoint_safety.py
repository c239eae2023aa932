"""Nothing on disk is lost to a failure: checkpoints that cannot be read are never
overwritten by a fresh start; a full disk, a run directory that is a file and a poisoned file are
each one line; a damaged newer checkpoint survives pruning."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys

import pytest
import torch

from launch.checkpoint import check_loadable, checkpoint_dirs
from launch.checkpoint.disk import dir_bytes, size_text
from launch.checkpoint.manifest import write_manifest
from launch.loop import main as train_main
from tests.helpers import ROOT, SMALL, TINY, env, metrics, train_cmd, train_losses

pytestmark = pytest.mark.slow
COMMON = ["optim.name=adamw", "train.eval_every=0", "train.ckpt_every=1", "run.keep_checkpoints=0"]


def _train(run_dir, *overrides: str) -> int:
    return train_main(["--config", TINY, *SMALL, f"run.dir={run_dir}", *COMMON, *overrides])


def _digest(root) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _one_error(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(err) == 1, err
    return err[0]


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory, one_thread):
    run = tmp_path_factory.mktemp("safety") / "run"
    assert _train(run, "train.max_steps=2") == 0
    return run


@pytest.mark.parametrize("damage", ["truncate every file", "garbage meta.json"])
def test_all_damaged_checkpoints_stop_the_run_and_restart_moves_them_aside(two_steps, tmp_path, capsys, caplog, damage):
    run = tmp_path / "run"
    shutil.copytree(two_steps, run)
    for step in checkpoint_dirs(run / "checkpoints"):
        for f in step.rglob("*"):
            if f.is_file() and (damage == "truncate every file" or f.name == "meta.json"):
                f.write_bytes(
                    f.read_bytes()[: len(f.read_bytes()) // 3] if damage.startswith("truncate") else b"{not json"
                )
    before = _digest(run / "checkpoints")
    capsys.readouterr()
    caplog.clear()
    assert _train(run, "train.max_steps=4") == 2
    err = capsys.readouterr().err.splitlines()
    at = next(i for i, x in enumerate(err) if x.startswith("error: "))
    line, detail = err[at], err[at + 1 :]
    # One short line: the newest damaged step and the two ways on; each checkpoint's failing file under it.
    assert line.startswith("error: no intact checkpoint in ") and len(line) < 300 + len(str(run)), line
    assert "step_00000002 and the 1 before it are damaged" in line and "step_00000001" not in line, line
    assert "run.resume=restart" in line and "run.resume=PATH" in line and "stopped before" not in line
    failing = "meta.json" if damage == "garbage meta.json" else "manifest.json"
    assert [x.split(":")[0] for x in detail] == ["  step_00000002", "  step_00000001"], err
    assert all(failing in x and str(run) not in x for x in detail), detail
    assert "is damaged" not in caplog.text  # no warning per checkpoint before the error: it says it once
    assert _digest(run / "checkpoints") == before  # nothing written, nothing deleted

    assert _train(run, "train.max_steps=2", "run.resume=restart") == 0
    aside = [p for p in run.iterdir() if p.name.startswith("checkpoints.old-")]
    assert len(aside) == 1 and _digest(aside[0]) == before  # moved aside intact, not deleted
    assert sorted(train_losses(run)) == [1, 2] and check_loadable(run / "checkpoints/step_00000002") is None


def test_a_damaged_newer_checkpoint_is_moved_aside_not_pruned_or_overwritten(two_steps, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(two_steps, run)
    newest = run / "checkpoints/step_00000002/rank0.pt"
    newest.write_bytes(newest.read_bytes()[:100])
    damaged = _digest(run / "checkpoints/step_00000002")
    assert _train(run, "train.max_steps=4", "run.keep_checkpoints=1") == 0  # resumes from step 1
    names = sorted(p.name for p in (run / "checkpoints").iterdir() if p.is_dir())
    aside = [n for n in names if n.startswith("step_00000002.damaged-")]
    assert aside and _digest(run / "checkpoints" / aside[0]) == damaged, names
    assert [p.name for p in checkpoint_dirs(run / "checkpoints")] == ["step_00000004"]  # keep 1, newest intact


def test_a_save_that_finds_no_space_is_one_line_and_keeps_the_last_checkpoint(
    tmp_path, capsys, monkeypatch, one_thread
):
    real_save, calls = torch.save, []

    def full_disk(obj, f, *args, **kwargs):
        if str(f).endswith("rank0.pt"):
            calls.append(str(f))
            if len(calls) == 2:  # the second checkpoint's per-rank file: the disk is full
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk)
    run = tmp_path / "run"
    assert _train(run, "train.max_steps=3") == 2
    line = _one_error(capsys)
    assert line.startswith("error: checkpoint step 2 not written: no space left on "), line
    # Sized by the checkpoint before it (the same state), not by what the failed save got to write.
    step1 = run / "checkpoints/step_00000001"
    assert f"(needs ~{size_text(dir_bytes(step1))}, the size of step 1; " in line, line
    assert " free); step 1 (" in line and "latest intact" in line, line
    assert not list((run / "checkpoints").glob(".tmp_*"))  # the temporary directory is gone
    assert [p.name for p in checkpoint_dirs(run / "checkpoints")] == ["step_00000001"]
    assert check_loadable(run / "checkpoints/step_00000001") is None

    calls.clear()  # train.on_save_error=continue: the line is logged, training goes on, the next save works
    run2 = tmp_path / "run2"
    assert _train(run2, "train.max_steps=3", "train.on_save_error=continue") == 0
    assert [p.name for p in checkpoint_dirs(run2 / "checkpoints")] == ["step_00000001", "step_00000003"]


def test_a_real_full_tmpfs(tmp_path):
    """The same on a real 6 MB tmpfs: one 4.3 MB checkpoint fits, the second does not (needs mount: root on
    Linux; skipped elsewhere)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root, or no mount namespace)")
    try:
        proc = subprocess.run(
            train_cmd([f"run.dir={mnt / 'run'}", *COMMON, "train.max_steps=3"]),
            cwd=ROOT,
            env=env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        lines = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
        assert "not written: no space left on " + str(mnt) in lines[0] and "step 1" in lines[0], lines[0]
        assert "Traceback" not in proc.stderr
        assert not list((mnt / "run/checkpoints").glob(".tmp_*"))
        assert check_loadable(mnt / "run/checkpoints/step_00000001") is None
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_run_dir_that_is_a_file_and_a_poisoned_file_are_one_line(tmp_path, capsys, one_thread):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert _train(afile, "train.max_steps=1") == 2
    assert "exists and is not a directory" in _one_error(capsys)
    assert _train(afile / "sub", "train.max_steps=1") == 2
    assert "cannot be created or written" in _one_error(capsys)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    run = tmp_path / "run"
    assert _train(run, "train.max_steps=1") == 0
    step = run / "checkpoints/step_00000001"
    torch.save({"x": Evil()}, step / "rank0.pt")
    write_manifest(step, exclude=("meta.json",))  # a poisoned copy with a consistent manifest
    problem = check_loadable(step)
    assert problem is not None and "refused" in problem and "weights_only" not in problem, problem


def test_warmup_longer_than_the_run_is_said(tmp_path, caplog, one_thread):
    assert _train(tmp_path / "run", "train.max_steps=2", "optim.warmup_steps=50") == 0
    assert "optim.warmup_steps (50) is more than train.max_steps (2)" in caplog.text


def test_the_tiny_default_runs_on_two_ranks_and_user_errors_are_one_line(tmp_path):
    """`torchrun --nproc_per_node=2 train.py --config configs/tiny.yaml` (on 2 ranks of the pool):
    backend auto (FSDP2 on 2 ranks), the micro-batch of 16 set to a rank's share of 8, with one line
    saying so; a refusal under the launcher is its one line alone."""
    from tests.pool import rank_pool
    from tests.pool_jobs import train_runs

    argv = ["--config", "configs/tiny.yaml", f"run.dir={tmp_path / 'run'}", "train.max_steps=2"]
    argv += ["train.eval_every=0", "train.progress=false"]
    rank0 = rank_pool(2).run_results(train_runs, [argv])[0]
    assert "using 8" in rank0.log and '"world_size": 2' in (tmp_path / "run/run.log").read_text()
    assert sorted(m["step"] for m in metrics(tmp_path / "run") if "train_loss" in m) == [1, 2]
    cmd = [
        sys.executable,
        "-m",
        "launch.launcher",
        "--standalone",
        "--nproc_per_node=2",
        "train.py",
        "--config",
        "configs/tiny.yaml",
        f"run.dir={tmp_path / 'run'}",
        "train.max_steps=2",
        "train.eval_every=0",
        "train.progress=false",
    ]
    bad = subprocess.run(
        [*cmd, "data.logical_shards=3"], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600
    )
    errors = [x for x in bad.stderr.splitlines() if x.startswith("error: ")]
    assert bad.returncode == 2 and len(errors) == 1 and "data.logical_shards (3)" in errors[0], bad.stderr[-3000:]
    # alone: no traceback, no failure report, no "Sending process N closing signal SIGTERM" after it
    assert bad.stderr.strip().splitlines() == errors, bad.stderr[-3000:]
    assert "launch.launcher" not in errors[0]  # the pointer to the short form is for plain torchrun only
