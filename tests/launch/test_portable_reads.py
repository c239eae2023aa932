"""A resume from another backend's checkpoint (ZeRO-2 and DDP either way, FSDP2 to DDP, DDP to FSDP2)
reads it once, on rank 0, and hands it to the other ranks one tensor at a time
(launch/checkpoint/portable.py): on 2 gloo ranks, the bytes of checkpoint tensors each rank reads,
and each rank's peak host memory during the load against a same-backend resume's. What the resumed
steps compute is tests/launch/test_portable_checkpoints.py's."""

from __future__ import annotations

import ctypes
import os
import shutil
import threading
from pathlib import Path

import pytest

from tests.helpers import SMALL, TINY, run_many
from tests.pool import rank_pool

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

# Large enough that the state (17 MB of weights, 21 MB of optimizer state) stands out of a pool
# worker's memory noise; two steps saved, one more resumed.
BIGGER = ["model.n_layer=4", "model.d_model=256", "model.n_head=4", "optim.name=orscale_lm", "train.eval_every=0"]
WEIGHTS_BYTES = 4 * (4 * 12 * 256 * 256 + 4096 * 256)  # fp32 matrices and the (tied) embedding


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _measured_resume(argv: list[str]) -> dict[str, int]:
    """`train.py ARGV` (a resume) on this rank: the checkpoint tensor bytes it read (safetensors
    tensors and slices, DCP's storage reads) and the rise of its resident memory while the engine
    loaded the checkpoint (sampled every millisecond)."""
    from safetensors import safe_open
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    import launch.checkpoint.portable as portable
    import orscale.distributed.zero_checkpoint as zero_checkpoint
    from launch.engine.deepspeed_engine import DeepSpeedEngine
    from launch.engine.torch_engine import TorchEngine
    from tests.pool_jobs import train_runs

    read = [0]

    class Counted:
        """safe_open, counting the bytes of every tensor and slice read through it."""

        def __init__(self, *args, **kwargs):
            self._fh = safe_open(*args, **kwargs)

        def __enter__(self):
            self._fh.__enter__()
            return self

        def __exit__(self, *exc):
            return self._fh.__exit__(*exc)

        def get_tensor(self, key):
            t = self._fh.get_tensor(key)
            read[0] += t.nbytes
            return t

        def get_slice(self, key):
            piece = self._fh.get_slice(key)

            class Slice:
                def get_shape(self):
                    return piece.get_shape()

                def __getitem__(self, index):
                    t = piece[index]
                    read[0] += t.nbytes
                    return t

            return Slice()

        def __getattr__(self, name):
            return getattr(self._fh, name)

    def read_data(self, plan, planner):
        read[0] += sum(self.storage_data[item.storage_index].length for item in plan.items)
        return dcp_read(self, plan, planner)

    peak, before = [0], [0]

    def measured(load):
        def run(self, directory):
            done = threading.Event()

            def sample():
                while not done.wait(0.001):
                    peak[0] = max(peak[0], _rss())

            ctypes.CDLL("libc.so.6").malloc_trim(0)  # memory freed by earlier jobs: back to the system
            before[0] = peak[0] = _rss()
            sampler = threading.Thread(target=sample)
            sampler.start()
            try:
                return load(self, directory)
            finally:
                done.set()
                sampler.join()
                peak[0] = max(peak[0], _rss())

        return run

    dcp_read = FileSystemReader.read_data
    saved = {
        (portable, "safe_open"): portable.safe_open,
        (zero_checkpoint, "safe_open"): zero_checkpoint.safe_open,
        (FileSystemReader, "read_data"): dcp_read,
        (TorchEngine, "load"): TorchEngine.load,
        (DeepSpeedEngine, "load"): DeepSpeedEngine.load,
    }
    portable.safe_open = zero_checkpoint.safe_open = Counted
    FileSystemReader.read_data = read_data
    TorchEngine.load, DeepSpeedEngine.load = measured(TorchEngine.load), measured(DeepSpeedEngine.load)
    try:
        train_runs([argv])
    finally:
        for (owner, name), value in saved.items():
            setattr(owner, name, value)
    return {"read": read[0], "rss_rise": peak[0] - before[0]}


def _resume(source: Path, backend: str, tmp: Path) -> list[dict[str, int]]:
    run_dir = tmp / f"{source.name}-as-{backend}"
    shutil.copytree(source, run_dir)
    argv = ["--config", TINY, *SMALL, *BIGGER, f"parallel.backend={backend}", "train.max_steps=3", f"run.dir={run_dir}"]
    return rank_pool(2).run(_measured_resume, argv)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("reads")
    common = [*BIGGER, "train.max_steps=2", "train.ckpt_every=2"]
    run_many([[*common, f"parallel.backend={b}", f"run.dir={root / b}"] for b in ("ddp", "fsdp", "zero2")], 2)
    return root


def _read_once(saved: Path, source: str, target: str, tmp: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Rank 0's and rank 1's figures of `source`'s checkpoint resumed under `target`, after checking
    that rank 0 read every tensor of it once and rank 1 none."""
    reader, other = _resume(saved / source, target, tmp)
    print(f"{source} -> {target} on 2 ranks: {reader}, {other}")  # the figures, with pytest -s
    assert other["read"] == 0, f"rank 1 read {other['read']} bytes of the checkpoint"
    stored = _tensor_bytes(saved / source / "checkpoints" / "step_00000002")
    assert 0.99 * stored <= reader["read"] <= stored  # once (a scalar two rank files both hold: read once)
    return reader, other


@pytest.mark.parametrize("source, target", [("zero2", "ddp"), ("ddp", "zero2")])
def test_a_cross_backend_resume_reads_the_checkpoint_once_on_rank_0(saved, tmp_path, source, target):
    """Rank 0 reads every tensor of the checkpoint once (the ZeRO layout's rank files and
    model.safetensors, or DCP's model and optimizer entries in one read); rank 1 reads none, and holds
    less than the reader by at least half the weights (they reach it one tensor at a time)."""
    reader, other = _read_once(saved, source, target, tmp_path)
    assert other["rss_rise"] < reader["rss_rise"] - WEIGHTS_BYTES // 2, (reader, other)


@pytest.mark.parametrize("source, target", [("fsdp", "ddp"), ("ddp", "fsdp")])
def test_a_resume_between_fsdp2_and_ddp_reads_the_checkpoint_once_on_rank_0(saved, tmp_path, source, target):
    """DCP's own load would have every rank read the whole checkpoint (FSDP2's shards into DDP's
    replicas, DDP's whole tensors into FSDP2's shards): rank 0 reads it once, rank 1 none. Rank 1's
    memory is printed, not bounded: under DDP, torch's optimizer-state load holds what rank 1 receives
    beside the state it replaces, which leaves it within allocator noise of the reader's on this model."""
    _read_once(saved, source, target, tmp_path)


def _tensor_bytes(checkpoint: Path) -> int:
    """The bytes of every tensor a checkpoint stores (model and optimizer state), as the readers count them."""
    from safetensors import safe_open

    from launch.checkpoint.dcp_safe import load_metadata

    if (checkpoint / "dcp").is_dir():
        with open(checkpoint / "dcp" / ".metadata", "rb") as fh:
            md = load_metadata(fh)
        return sum(
            item.length for index, item in md.storage_data.items() if index.fqn.startswith(("model.", "optim.state."))
        )
    total = 0
    for f in [checkpoint / "model.safetensors", *sorted((checkpoint / "zero").glob("rank*.safetensors"))]:
        with safe_open(str(f), framework="pt") as fh:
            total += sum(fh.get_tensor(k).nbytes for k in fh.keys())
    return total
