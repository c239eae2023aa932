"""What real clusters do to runs: divergence, damaged checkpoints, torn logs, requeues
before the first save, two launches on one run dir, untrusted checkpoint files, bad input."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from launch import checkpoint as ckpt
from launch.checkpoint.dcp_safe import UnsafeCheckpointError, load_metadata
from launch.checkpoint.manifest import write_manifest
from launch.features.divergence import SpikeGuard
from launch.loop import main as train_main
from tests.helpers import ROOT, SMALL, TINY, env, metrics, train_cmd, train_in_pool, train_losses

COMMON = ["optim.name=orscale_lm", "train.eval_every=0", "train.ckpt_every=2"]


def _error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("error: ")]
    assert len(err) == 1, err
    return err[0]


def _main(run_dir: Path, *overrides: str) -> int:
    return train_main(["--config", TINY, *SMALL, f"run.dir={run_dir}", *COMMON, *overrides])


@pytest.fixture(scope="module")
def base_runs(tmp_path_factory):
    """A run saved at steps 2 and 4, and the same run straight to step 6."""
    root = tmp_path_factory.mktemp("robust")
    assert _main(root / "saved", "train.max_steps=4") == 0
    assert _main(root / "straight", "train.max_steps=6") == 0
    return root


def _copy(base: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(base / "saved", run_dir)
    return run_dir


# ---------------------------------------------------------------------------------------- divergence
def test_divergence_stops_with_one_line_and_never_saves_or_prunes_a_good_checkpoint(base_runs, tmp_path, capsys):
    run_dir = _copy(base_runs, tmp_path)
    before = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert _main(run_dir, "train.max_steps=12", "optim.lr=1e6", "run.keep_checkpoints=2") == 2
    line = _error_line(capsys)
    assert "training diverged: non-finite" in line and "step_00000004" in line and "optim.lr=" in line
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == before
    assert all(ckpt.check_loadable(p) is None for p in (run_dir / "checkpoints").glob("step_*"))
    strict = [
        json.loads(x, parse_constant=lambda c: pytest.fail(f"bare {c} in metrics.jsonl"))
        for x in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert any(m.get("grad_norm", 0) is None or m.get("train_loss", 0) is None for m in strict)


@pytest.mark.slow
@pytest.mark.distributed
def test_divergence_on_two_ranks_keeps_every_earlier_checkpoint(tmp_path):
    from tests.pool import rank_pool
    from tests.pool_jobs import train_error

    run_dir = tmp_path / "run"
    overrides = [f"run.dir={run_dir}", *COMMON, "parallel.backend=fsdp"]
    train_in_pool([*overrides, "train.max_steps=4"], nproc=2)
    argv = ["--config", TINY, *SMALL, *overrides, "train.max_steps=10", "optim.lr=1e6"]
    errors = rank_pool(2).run(train_error, argv)
    assert errors[0] == errors[1] and "training diverged" in errors[0]  # agreed: every rank stops alike
    steps = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert steps == ["step_00000002", "step_00000004"]
    assert all(ckpt.check_loadable(run_dir / "checkpoints" / s) is None for s in steps)


def test_spike_guard_skips_outliers_and_ignores_non_finite_values():
    import torch

    guard = SpikeGuard(window=4, sigma=3.0, world_size=1)
    for loss in (2.0, 2.1, 1.9, 2.0):
        assert not guard.is_spike(torch.tensor(loss), torch.tensor(1.0))
    assert guard.is_spike(torch.tensor(9.0), torch.tensor(1.0))  # loss far above mean + 3σ
    assert guard.is_spike(torch.tensor(2.0), torch.tensor(50.0))  # grad norm spike
    assert not guard.is_spike(torch.tensor(2.05), torch.tensor(1.0))
    assert not guard.is_spike(torch.tensor(float("nan")), torch.tensor(1.0))  # the divergence guard's job
    assert guard.skipped == 2 and list(guard.history["loss"])[-1] == pytest.approx(2.05)


def test_spike_guard_run_counts_skipped_steps(tmp_path):
    run_dir = tmp_path / "run"
    assert (
        _main(run_dir, "train.max_steps=8", "train.skip_spikes=true", "train.spike_window=2", "train.spike_sigma=0.001")
        == 0
    )
    last = [m for m in metrics(run_dir) if "train_loss" in m][-1]
    assert last["skipped_steps"] >= 1  # with σ this small, a rising loss or norm counts as a spike


@pytest.mark.slow
@pytest.mark.distributed
def test_spike_guard_skips_the_same_steps_on_zero2_as_in_one_process(tmp_path):
    """Under ZeRO the guard decides inside DeepSpeed's step (once its global norm exists): 2 ranks
    skip exactly the updates one process skips, so the losses stay equal."""
    common = [
        "train.max_steps=8",
        "train.log_every=1",
        "train.skip_spikes=true",
        "train.spike_window=2",
        "train.spike_sigma=0.5",
        "optim.name=orscale_lm",
        "train.eval_every=0",
        "train.micro_batch_size=2",
    ]
    train_in_pool([f"run.dir={tmp_path / 'one'}", *common])
    train_in_pool([f"run.dir={tmp_path / 'zero'}", "parallel.backend=zero2", *common], nproc=2)
    one, zero = ([m for m in metrics(tmp_path / d) if "train_loss" in m] for d in ("one", "zero"))
    skipped = [m["skipped_steps"] for m in one]
    assert skipped[1] == 0 and skipped[-1] >= 2, skipped  # updates skipped (here: the rising early grad norm)
    assert [m["skipped_steps"] for m in zero] == skipped
    for a, b in zip(one, zero, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5), a["step"]


# ---------------------------------------------------------------------------------------- damaged files
def _damage(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("victim", ["dcp/__0_0.distcp", "dcp/.metadata", "rank0.pt"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(base_runs, tmp_path, victim, caplog):
    run_dir = _copy(base_runs, tmp_path)
    _damage(run_dir / "checkpoints" / "step_00000004" / victim)
    assert _main(run_dir, "train.max_steps=6") == 0
    assert "step_00000004 is damaged" in caplog.text and victim.split("/")[-1] in caplog.text
    assert train_losses(run_dir) == train_losses(base_runs / "straight")  # bit-exact from step 2


def test_a_torn_metrics_line_is_dropped_with_a_warning(base_runs, tmp_path, caplog):
    run_dir = _copy(base_runs, tmp_path)
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 5, "tokens": 2560, "train_lo')  # what kill -9 during a write leaves
    assert _main(run_dir, "train.max_steps=6") == 0
    assert "do not parse" in caplog.text
    assert train_losses(run_dir) == train_losses(base_runs / "straight")


def _crafted_pickle(marker: Path) -> bytes:
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    return pickle.dumps(Evil())


def test_a_crafted_dcp_metadata_runs_nothing_on_resume_or_export(base_runs, tmp_path, capsys, caplog):
    marker = tmp_path / "pwned"
    with pytest.raises(UnsafeCheckpointError):
        load_metadata(__import__("io").BytesIO(_crafted_pickle(marker)))
    run_dir = _copy(base_runs, tmp_path)
    step4 = run_dir / "checkpoints" / "step_00000004"
    (step4 / "dcp" / ".metadata").write_bytes(_crafted_pickle(marker))
    write_manifest(step4, exclude=("meta.json",))  # so that only the unpickler stands in the way
    from launch.export import main as export_main

    assert export_main(["--checkpoint", str(step4), "--out", str(tmp_path / "hf")]) == 2
    assert "damaged" in _error_line(capsys)
    assert _main(run_dir, "train.max_steps=6") == 0
    assert "step_00000004 is damaged" in caplog.text and "holds objects other than tensors" in caplog.text
    assert not marker.exists()


# ---------------------------------------------------------------------------------------- requeue, launches
def _wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stderr.read()[-3000:]}")
        if (run_dir / "metrics.jsonl").exists() and any(m.get("step", 0) >= step for m in metrics(run_dir)):
            return
        time.sleep(0.2)
    raise AssertionError("timed out waiting for the run")


@pytest.mark.slow
def test_kill_before_the_first_checkpoint_then_the_same_command_starts_over(tmp_path, capsys):
    run_dir = tmp_path / "run"
    overrides = [f"run.dir={run_dir}", *COMMON[:2], "train.max_steps=6", "train.ckpt_every=100"]
    proc = subprocess.Popen(
        train_cmd(overrides),
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    _wait_for_step(run_dir, 2, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert ckpt.latest_checkpoint(run_dir / "checkpoints") is None
    capsys.readouterr()
    assert train_main(["--config", TINY, *SMALL, *overrides]) == 0  # what Slurm --requeue runs
    assert "starting again from step 0" in capsys.readouterr().err
    assert sorted(train_losses(run_dir)) == [1, 2, 3, 4, 5, 6]
    assert list(run_dir.glob("metrics.*.jsonl")), "the first attempt's metrics were not kept"
    # A different run in that directory is still refused.
    shutil.rmtree(run_dir / "checkpoints")
    assert train_main(["--config", TINY, *SMALL, *overrides, "optim.name=adamw"]) == 2
    assert "already holds a run" in _error_line(capsys)


@pytest.mark.slow
def test_a_second_launch_on_a_run_dir_in_use_is_refused_in_one_line(tmp_path, capsys):
    """A running process holds the run dir; a second start (here in this process) is refused."""
    run_dir = tmp_path / "run"
    overrides = [f"run.dir={run_dir}", *COMMON[:2], "train.max_steps=400"]
    first = subprocess.Popen(
        train_cmd(overrides), cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for_step(run_dir, 1, first)
        assert train_main(["--config", TINY, *SMALL, *overrides]) == 2
        line = _error_line(capsys)
        assert "in use by another launch" in line and f"pid {first.pid}" in line
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 0
    steps = [m["step"] for m in metrics(run_dir) if "train_loss" in m]
    assert steps == sorted(set(steps)), "two writers in one metrics.jsonl"


# ---------------------------------------------------------------------------------------- messages
def test_a_finished_run_says_so_and_exits_zero(base_runs, tmp_path, caplog):
    run_dir = _copy(base_runs, tmp_path)
    assert _main(run_dir, "train.max_steps=4") == 0
    assert "run already complete at step 4" in caplog.text
    assert "nan" not in caplog.text


def test_empty_corpus_and_mismatched_format_are_one_line(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert _main(tmp_path / "a", f"data.data_files={empty}") == 2
    assert "no documents" in _error_line(capsys)
    pq = tmp_path / "corpus.parquet"
    import pyarrow as pa
    import pyarrow.parquet as papq

    papq.write_table(pa.table({"text": ["x"]}), pq)
    assert _main(tmp_path / "b", f"data.data_files={pq}", "data.source=json") == 2
    assert "looks like parquet" in _error_line(capsys)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_parquet_corpus_is_recognised_by_its_name(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as papq

    texts = [json.loads(line)["text"] for line in open(ROOT / "assets/corpus/fineweb_sample10BT_first300.jsonl")]
    pq = tmp_path / "corpus.parquet"
    papq.write_table(pa.table({"text": texts}), pq, row_group_size=20)
    assert _main(tmp_path / "run", f"data.data_files={pq}", "train.max_steps=2") == 0
