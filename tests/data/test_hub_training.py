"""Training and pre-tokenising from the Hub, end to end, against the stand-in Hub on 127.0.0.1:
`python train.py --config configs/tiny.yaml data.source=HuggingFaceFW/fineweb-edu data.hub.subset=
sample-10BT` trains exactly as on the same parquet files read locally; a read that fails past its
budget saves and exits in one line; a kill -9 and a resume read no finished row group again; 2
ranks under faults on every read path read disjoint row groups and train on exactly the fault-free
windows; `python -m data.prepare` from the Hub writes the local files' shards and resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from data import DataConfig, build_val_set, load_tokenizer, open_documents
from data.prepare import prepare
from launch.checkpoint import latest_checkpoint, read_meta
from tests.data.hub_repo import REPO, SUBSET, fineweb_edu_files, hub_env, hub_overrides, local_copy, run_python
from tests.helpers import BPE4K, ROOT, metrics, run_many, run_train, train_cmd, train_losses
from tests.hub_server import FAULTS, StandInHub

pytestmark = pytest.mark.slow

STEPS = 24
COMMON = [f"train.max_steps={STEPS}", "train.ckpt_every=4", "train.record_windows=true"]
GROUPS_PER_FILE = 6
ROWS_PER_GROUP = 2


@pytest.fixture(scope="module")
def hub():
    with StandInHub(REPO, fineweb_edu_files(rows_per_group=ROWS_PER_GROUP), stall_s=2.0, retry_after_s=0) as server:
        yield server


@pytest.fixture(autouse=True)
def _fresh(hub):
    hub.clear()
    hub.delay_s = 0.0
    yield
    assert hub.unexpected == [], "the clients called routes the stand-in does not serve"


def hub_files(hub: StandInHub) -> dict[str, bytes]:
    return {path: f.data for path, f in hub.files.items()}


@pytest.fixture(scope="module")
def reference(hub, tmp_path_factory) -> Path:
    """The uninterrupted runs, in one launch: the parquet files read locally, then from the Hub."""
    tmp = tmp_path_factory.mktemp("reference")
    files = local_copy(hub_files(hub), tmp / "files")
    run_many(
        [
            [*COMMON, f"run.dir={tmp / 'local'}", "data.source=parquet", f"data.data_files=[{files}]"],
            [*COMMON, f"run.dir={tmp / 'hub'}", *hub_overrides()],
        ],
        environ=hub_env(hub, tmp / "hf"),
    )
    reads = {"row_group": len(hub.reads("row_group")), "footer": len(hub.reads("footer")), "api": len(hub.reads("api"))}
    (tmp / "reads.json").write_text(json.dumps(reads))  # the function-scoped fixture clears the log next
    return tmp


def windows(run_dir: Path) -> Counter:
    """(step, window hash) of every window every rank trained on."""
    return Counter(
        tuple(line.split()) for f in run_dir.glob("windows_rank*.txt") for line in f.read_text().splitlines()
    )


def piece_of(served) -> int:
    return int(served.file.split("/")[-1][:3]) * GROUPS_PER_FILE + served.row_group


def validation_end(hub: StandInHub, tmp: Path) -> tuple[int, set[int]]:
    """The first training piece and the pieces the validation set reads (on every launch), as the
    trainer computes them from tests.helpers.SMALL's data settings."""
    files = local_copy(hub_files(hub), tmp)
    cfg = DataConfig(
        source="parquet", data_files=[files], tokenizer=BPE4K, val_tokens=1024, logical_shards=4, seq_len=64
    )
    _, (piece, row) = build_val_set(cfg, open_documents(cfg, load_tokenizer(BPE4K)))
    return piece, set(range(piece + 1 if row else piece))


def test_training_from_the_hub_equals_training_on_the_same_local_files(reference):
    local, hub_run = reference / "local", reference / "hub"
    print(f"\nuninterrupted run from the Hub, requests by class: {(reference / 'reads.json').read_text()}")
    assert train_losses(hub_run) == train_losses(local) and len(train_losses(hub_run)) == STEPS
    assert windows(hub_run) == windows(local)  # the same windows at every step, so the same documents in order
    val = [[m["val_loss"] for m in metrics(d) if "val_loss" in m] for d in (hub_run, local)]
    assert val[0] == val[1] and len(val[0]) >= 1
    assert {m["data_retries"] for m in metrics(hub_run) if "train_loss" in m} == {0}


def _launch(run_dir: Path, environ: dict[str, str], overrides: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        train_cmd([f"run.dir={run_dir}", *COMMON, *overrides]),
        cwd=ROOT,
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_an_outage_saves_and_exits_in_one_line_then_a_kill_and_resumes_read_no_finished_row_group(
    hub, reference, tmp_path
):
    run_dir, environ, overrides = tmp_path / "run", hub_env(hub, tmp_path / "hf"), hub_overrides(retries=2)
    # 1. The Hub fails one row group for good (file 000's last: piece 5, first read near step 12).
    hub.inject(
        "row_group", "503", times=1000, where=lambda s: s.file.endswith("000_00000.parquet") and s.row_group == 5
    )
    proc = _launch(run_dir, environ, overrides)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 2, stderr[-3000:]
    error = stderr.strip().splitlines()[-1]
    assert error.startswith("error: data file 'hf://datasets/HuggingFaceFW/fineweb-edu@")
    assert "000_00000.parquet' row group 5 could not be read: HTTP 503 after 3 attempts" in error
    assert sum("data: hub GET" in line and "HTTP 503; retry" in line for line in stderr.splitlines()) == 2
    saved = read_meta(latest_checkpoint(run_dir / "checkpoints"))["step"]
    assert 4 < saved < STEPS and saved == max(train_losses(run_dir))  # saved at the last step it trained
    # 2. The requeue (the same command) resumes; a slow Hub, so that the kill -9 lands mid-run.
    hub.clear()
    hub.delay_s = 0.2
    proc = _launch(run_dir, environ, overrides)
    deadline = time.time() + 300
    while read_meta(latest_checkpoint(run_dir / "checkpoints"))["step"] <= saved and time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else ""
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed_from = latest_checkpoint(run_dir / "checkpoints")
    assert read_meta(resumed_from)["step"] < STEPS
    state = torch.load(resumed_from / "rank0.pt", weights_only=True)["loader"]["shards"]  # before it is pruned
    # 3. The next requeue finishes; the losses are the uninterrupted run's, bit for bit.
    hub.clear()
    run_train([f"run.dir={run_dir}", *COMMON, *overrides], environ=environ)
    assert train_losses(run_dir) == train_losses(reference / "hub")
    # What the last launch read: no training row group that the checkpoint had finished.
    first, validation = validation_end(hub, tmp_path / "files")
    finished, current = set(), set()
    for shard, s in state.items():
        pieces = [p for p in range(first, 3 * GROUPS_PER_FILE) if (p - first) % 4 == shard]
        done = int(s["cursor"]) + (int(s["row"]) >= ROWS_PER_GROUP)  # at its group's last row: finished too
        finished |= set(pieces[:done])
        current |= set(pieces[done : done + 1])
    read = Counter(piece_of(s) for s in hub.reads("row_group"))  # (the validation set's: on every launch)
    assert not (set(read) & (finished - validation)), "a resume read a row group it had finished"
    assert all(read[p] == 1 for p in current - validation)  # the one it was in: once, read from its row on
    print(f"\nlast launch: {sum(read.values())} row-group reads of {3 * GROUPS_PER_FILE}; finished: {sorted(finished)}")


@pytest.mark.distributed
def test_two_ranks_under_faults_on_every_read_path_train_on_exactly_the_fault_free_windows(hub, reference, tmp_path):
    hub.inject("api", *[k for k in FAULTS if k != "short"])
    hub.inject("footer", *FAULTS)
    hub.inject("row_group", *FAULTS)
    run_dir = tmp_path / "run"
    proc = run_train(
        [f"run.dir={run_dir}", *COMMON, *hub_overrides(retries=10), "parallel.backend=ddp"],  # 7 faults on one read
        nproc=2,
        environ=hub_env(hub, tmp_path / "hf"),
    )
    assert windows(run_dir) == windows(reference / "hub")  # every window once, on one rank or the other
    ref = train_losses(reference / "hub")
    assert all(abs(loss - ref[step]) <= 1e-5 * abs(ref[step]) for step, loss in train_losses(run_dir).items())
    injected = 3 * len(FAULTS) - 1
    assert hub.pending_faults() == 0
    assert sum(m["data_retries"] for m in metrics(run_dir) if "train_loss" in m) == injected
    assert sum("data: hub " in line for line in proc.stderr.splitlines()) == injected
    print(f"\n2 ranks: {injected} faults, {injected} retries; {len(hub.reads('row_group'))} clean row-group reads")
    # Disjoint shares: no training row group was read whole by both ranks.
    read = Counter(piece_of(s) for s in hub.reads("row_group"))
    _, validation = validation_end(hub, tmp_path / "files")
    assert all(n == 1 for p, n in read.items() if p not in validation), read


def test_prepare_from_the_hub_writes_the_local_shards_and_resumes_after_a_kill(hub, tmp_path):
    files = local_copy(hub_files(hub), tmp_path / "files")
    local = prepare(
        DataConfig(source="parquet", data_files=[files], tokenizer=BPE4K), tmp_path / "local", progress=False
    )
    out, environ = tmp_path / "hub", hub_env(hub, tmp_path / "hf")
    cmd = ["-m", "data.prepare", "--out", str(out), "--workers", "1", "--no-progress", f"data.tokenizer={BPE4K}"]
    cmd += hub_overrides()
    hub.delay_s = 0.15  # ~1 s a file: the kill lands after the first file's shard
    proc = subprocess.Popen([sys.executable, *cmd], cwd=ROOT, env=environ, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "00000.json").exists() and time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists()
    hub.clear()
    hub.inject("row_group", "503", "reset", "stall")  # the resumed run meets the Hub's bad moments too
    done = run_python(cmd, environ)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sum("data: hub GET" in line for line in done.stderr.splitlines()) == 3
    assert not any(s.file.endswith("000_00000.parquet") for s in hub.reads("row_group"))  # finished: not read
    manifest = json.loads((out / "manifest.json").read_text())
    assert [e["documents"] for e in manifest["files"]] == [e["documents"] for e in local["files"]]
    assert manifest["tokens"] == local["tokens"] and manifest["tokenizer"] == local["tokenizer"]
    for a, b in zip(manifest["files"], local["files"], strict=True):
        assert (out / a["tokens"]).read_bytes() == (tmp_path / "local" / b["tokens"]).read_bytes()
        assert np.array_equal(np.load(out / a["offsets"]), np.load(tmp_path / "local" / b["offsets"]))
    assert manifest["source"]["source"] == REPO and manifest["source"]["subset"] == SUBSET
