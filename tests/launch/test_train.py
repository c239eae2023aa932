"""train.py end to end on the bundled corpus, and its handling of bad input."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest
import torch

from launch.loop import main as train_main
from launch.run.lock import RunLock
from tests.conftest import ROOT
from tests.helpers import BPE4K

TINY = str(ROOT / "configs/tiny.yaml")
FAST = [
    f"data.tokenizer={BPE4K}",  # a 4k vocabulary: GPT-2's 50k head would be most of each step
    "model.vocab_size=4096",
    "model.n_layer=2",
    "data.seq_len=64",
    "model.max_seq_len=64",
    "data.val_tokens=2048",
    "train.tokens_per_step=512",
    "train.micro_batch_size=8",
    "train.progress=false",
    "data.logical_shards=8",
]


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("optim", ["adamw", "orscale_lm"])
def test_short_run_loss_falls_and_run_dir_is_complete(tmp_path, optim):
    run_dir = tmp_path / "run"
    rc = train_main(
        [
            "--config",
            TINY,
            *FAST,
            f"run.dir={run_dir}",
            f"optim.name={optim}",
            "train.max_steps=40",
            "optim.warmup_steps=5",
            "train.log_every=5",
            "train.eval_every=20",
        ]
    )
    assert rc == 0
    metrics = read_metrics(run_dir)
    train_lines = [m for m in metrics if "train_loss" in m]
    val_lines = [m for m in metrics if "val_loss" in m]
    assert [m["step"] for m in val_lines] == [20, 40]
    assert train_lines[0]["step"] == 1 and train_lines[-1]["step"] == 40
    for key in ("tokens", "lr", "grad_norm", "tokens_per_s"):
        assert key in train_lines[-1]
    assert train_lines[0]["train_loss"] - train_lines[-1]["train_loss"] >= 1.0, train_lines
    assert train_lines[0]["train_loss"] - val_lines[-1]["val_loss"] >= 1.0
    assert (run_dir / "config.yaml").is_file()
    log = (run_dir / "run.log").read_text()
    assert "git commit" in log and "environment" in log and "resolved config" in log
    env = json.loads(log.split("environment: ", 1)[1].splitlines()[0])
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and env["packages"]["torch"]
    # stderr is not a terminal here: one line per log_every step takes the bar's place.
    steps = [int(line.split("step ")[1].split("/")[0]) for line in log.splitlines() if "/40 | loss " in line]
    assert steps == [1, 5, 10, 15, 20, 25, 30, 35, 40], steps
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_00000040"


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optim.name=sgdx"], "optim.name"),
        (["data.seq_len=512"], "exceeds the model's context"),
        (["data.data_files=[/nonexistent/corpus.jsonl]"], "not found"),
        (["data.data_files=[configs]"], "data file 'configs' is a directory with no data files in it (.parquet"),
        (
            ["data.data_files=[assets/corpus]"],
            "is a directory: name its files, e.g. data.data_files=['assets/corpus/*.jsonl']",
        ),
        (["run.resume=/nonexistent/step_00000002"], "run.resume='/nonexistent/step_00000002' is not a complete"),
        (["data.tokenizer=/nonexistent/tok.json"], "not found"),
        (["model.preset=7b"], "unknown model.preset"),
        (["train.micro_batch_size=3"], "not a multiple"),
        (["optim.lr=-1"], "optim.lr must be a finite number > 0"),
    ],
)
def test_bad_input_is_one_error_line_and_no_run_dir(tmp_path, capsys, overrides, message):
    run_dir = tmp_path / "run"
    rc = train_main(["--config", TINY, *FAST, f"run.dir={run_dir}", *overrides])
    assert rc == 2
    line = _error_line(capsys)
    assert line.startswith("error: ") and message in line
    assert not run_dir.exists()


def test_existing_run_is_never_overwritten(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    (run_dir / "config.yaml").write_text("precious\n")
    # max_steps above tiny.yaml's warmup of 15: no warning line beside the error (refused before training)
    rc = train_main(["--config", TINY, *FAST, f"run.dir={run_dir}", "train.max_steps=20"])
    assert rc == 2 and "already holds a run" in _error_line(capsys)
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert (run_dir / "config.yaml").read_text() == "precious\n"


def test_a_start_that_fails_leaves_nothing_the_user_did_not_have(tmp_path, capsys):
    """The lock is taken before the resume point is checked: a refused start removes the lock file
    and the directories made for it, and leaves a directory that was there as it was."""
    bad = ["--config", TINY, *FAST, "run.resume=/nonexistent/step_00000002"]
    assert train_main([*bad, f"run.dir={tmp_path / 'new' / 'runs' / 'run'}"]) == 2
    assert "is not a complete checkpoint" in _error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("kept")
    assert train_main([*bad, f"run.dir={mine}"]) == 2
    assert "is not a complete checkpoint" in _error_line(capsys)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"] and (mine / "notes.txt").read_text() == "kept"


def test_a_lock_removed_by_a_failed_start_is_not_held_twice(tmp_path):
    """A launch waiting on the lock of a start that fails and removes the lock file must lock the
    file that is there afterwards, not the removed one: else a third launch could hold it too."""
    first, second = RunLock(tmp_path / "run"), RunLock(tmp_path / "run")
    assert first.acquire(grace_s=0) is None
    # a holder on another node: whether it is going away cannot be seen from here, so the second waits
    (tmp_path / "run" / ".lock").write_text(json.dumps({"pid": os.getpid(), "host": "another-node", "since": "-"}))
    result: list[str | None] = []
    waiter = threading.Thread(target=lambda: result.append(second.acquire(grace_s=10)))
    waiter.start()
    time.sleep(0.5)  # the second launch has opened the lock file and retries its flock
    first.release(discard=True)  # a refused start: the lock file and the run dir it created go
    waiter.join(timeout=20)
    assert result == [None]
    assert "pid" in RunLock(tmp_path / "run").acquire(grace_s=0)  # a third is refused: one holder
    second.release()


def test_a_lock_held_by_a_live_launch_here_is_refused_without_waiting_the_grace(tmp_path):
    """The grace is for a holder going away (its launcher killed); a holder running on this host
    with its launcher (here: this process) is a live launch, refused at once."""
    first = RunLock(tmp_path / "run")
    assert first.acquire(grace_s=0) is None
    started = time.monotonic()
    holder = RunLock(tmp_path / "run").acquire(grace_s=60)
    assert holder is not None and f"pid {os.getpid()} " in holder
    assert time.monotonic() - started < 30, "waited for a live holder"
    gone = int(open("/proc/sys/kernel/pid_max").read()) + 1  # a pid no process here can have
    (tmp_path / "run" / ".lock").write_text(json.dumps({"pid": gone, "host": socket.gethostname()}))
    started = time.monotonic()
    assert RunLock(tmp_path / "run").acquire(grace_s=1) is not None  # a holder gone from here: the grace
    assert time.monotonic() - started >= 1
    first.release()


def test_a_run_that_ends_removes_its_lock_file_and_a_killed_runs_is_taken_over(tmp_path):
    """The lock file lives while its run does: released, it is gone (the run directory stays); one
    left by a killed run (the flock went with the process) still names its holder, and the next
    launch takes it over at once."""
    run = tmp_path / "run"
    lock = RunLock(run)
    assert lock.acquire(grace_s=0) is None and (run / ".lock").is_file()
    lock.release()
    assert not (run / ".lock").exists() and run.is_dir()
    gone = int(open("/proc/sys/kernel/pid_max").read()) + 1  # a pid no process here can have
    (run / ".lock").write_text(json.dumps({"pid": gone, "host": socket.gethostname(), "since": "-"}))
    started = time.monotonic()
    again = RunLock(run)
    assert again.acquire(grace_s=30) is None and time.monotonic() - started < 5
    assert json.loads((run / ".lock").read_text())["pid"] == os.getpid()
    again.release()


def test_the_step_layout_line_counts_in_good_grammar():
    from launch.plan import step_shape

    assert step_shape(1, 1, 4, 64) == "1 rank x 1 micro-batch of 4 x 64 per step"
    assert step_shape(2, 3, 8, 128) == "2 ranks x 3 micro-batches of 8 x 128 per step"
