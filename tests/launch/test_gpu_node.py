"""A node of 8 GPUs read as CUDA and NCCL would run it, guarded on CPU: each test answers CUDA's
question for the CPU (a patched accelerator, a spy, a machine that reports 8 GPUs) and asserts what
that node would get.

1. FSDP2's 1-D mesh takes its device type from the run (`train.device`), not the machine's
   accelerator: a CPU run on a GPU node keeps a CPU mesh under its gloo group.
2. A background checkpoint's DCP write builds no copy-ahead loader on its writer thread: that loader
   asks CUDA for the current stream and synchronizes it, from a thread whose device is GPU 0 on
   every rank (a CUDA context there per rank).
3. `python -m launch.sweep --jobs N` gives each concurrent cell GPUs of its own: `--nproc P` of the
   node's visible GPUs (an existing CUDA_VISIBLE_DEVICES respected), as CUDA_VISIBLE_DEVICES.
4. DDP keeps one gradient: every gradient is a view into DDP's all-reduce buckets, from micro-batch
   to micro-batch (no_sync) and step to step, so no second full gradient is ever allocated.
"""

from __future__ import annotations

import os
import threading

import pytest
import torch
import yaml

from launch.backends.registry import backend_for
from launch.checkpoint.dcp_state import ModelAndOptimizers
from launch.engine.parallelize import build_model
from launch.plan import load_config
from launch.runtime.process_group import DistEnv
from launch.sweep import jobs
from launch.sweep import sweep_cli as sweep
from models import get_preset
from tests.pool import rank_pool

MODEL = dict(n_layer=2, d_model=32, n_head=2, max_seq_len=32, vocab_size=512)


def _fsdp_mesh_on_a_gpu_machine(overrides: list[str]) -> tuple[str, tuple[int, ...]]:
    """An FSDP2 model of a `train.device=cpu` run built where torch's accelerator is CUDA; its
    parameters' mesh (device type, shape)."""
    import torch.distributed as dist

    accelerator = torch._C._get_accelerator
    torch._C._get_accelerator = lambda: torch.device("cuda")  # what a GPU machine answers FSDP2
    try:
        cfg = load_config(None, ["parallel.backend=fsdp", *overrides])
        env = DistEnv(dist.get_rank(), dist.get_world_size(), 0, torch.device("cpu"), "fsdp")
        model = build_model(
            get_preset("tiny", **MODEL), cfg.parallel, 7, env, backend=backend_for(cfg.parallel.backend)
        )
    finally:
        torch._C._get_accelerator = accelerator
    mesh = next(model.parameters()).device_mesh
    return mesh.device_type, tuple(mesh.shape)


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_meshes_take_the_runs_device_not_the_machines_accelerator():
    assert rank_pool(2).run(_fsdp_mesh_on_a_gpu_machine, []) == [("cpu", (2,))] * 2


def test_a_background_save_builds_no_copy_ahead_loader_on_its_writer_thread(tmp_path, monkeypatch):
    from torch.distributed.checkpoint import filesystem

    built: list[tuple[str, int]] = []

    class CopyAheadSpy(filesystem._SerialCpuLoader):
        """Stands in for `_OverlappingCpuLoader` (whose first act asks CUDA for its current stream):
        records where it was built and with what threshold, then loads as the CPU's loader does."""

        def __init__(self, resolve_fun, stream=None, inflight_threshhold: int = 1_000_000) -> None:
            built.append((threading.current_thread().name, inflight_threshhold))
            super().__init__(resolve_fun)

    monkeypatch.setattr(filesystem, "_OverlappingCpuLoader", CopyAheadSpy)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # what DCP's writer asks before building it
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    opt.step()
    wait = ModelAndOptimizers(model, [opt]).stage(tmp_path, None)
    wait()
    assert (tmp_path / "dcp" / ".metadata").is_file()  # written
    assert built == [], f"DCP built its CUDA copy-ahead loader: {built}"


def _ddp_gradient_storage(accum_steps: int, steps: int) -> list[dict]:
    """A DDP TorchEngine stepping with `accum_steps` micro-batches: after each backward from the
    second step on (gradients become bucket views at the first), how the gradients are stored."""
    import torch.distributed as dist

    from launch.engine.torch_engine import TorchEngine

    cfg = load_config(None, ["parallel.backend=ddp", "optim.name=orscale_lm", "optim.ns_dtype=fp32"])
    env = DistEnv(dist.get_rank(), dist.get_world_size(), 0, torch.device("cpu"), "ddp")
    model_cfg = get_preset("tiny", **MODEL)
    engine = TorchEngine(
        backend_for("ddp"), model_cfg, cfg.parallel, cfg.optim, cfg.train, env, torch.float32, accum_steps
    )
    params = list(engine.model.parameters())
    gen = torch.Generator().manual_seed(dist.get_rank())
    seen, first = [], None
    for step in range(steps):
        for micro in range(accum_steps):
            batch = torch.randint(0, model_cfg.vocab_size, (2, 17), generator=gen)
            engine.forward_backward(batch, last_micro_batch=micro == accum_steps - 1)
            storages = {p.grad.untyped_storage().data_ptr(): p.grad.untyped_storage().nbytes() for p in params}
            if step == 0:
                continue
            first = first or storages
            seen.append(
                {
                    "views": all(p.grad._base is not None for p in params),
                    "storages": len(storages),
                    "bytes": sum(storages.values()),
                    "same_as_before": storages == first,
                }
            )
        engine.step(1e-3)
    return [{**s, "params": len(params), "param_bytes": sum(p.numel() * 4 for p in params)} for s in seen]


@pytest.mark.slow
@pytest.mark.distributed
def test_ddp_gradients_are_views_of_its_buckets_through_accumulation_and_steps():
    for rank in rank_pool(2).run(_ddp_gradient_storage, 2, 3):
        assert len(rank) == 4  # steps 2 and 3, two micro-batches each
        for seen in rank:
            assert seen["views"] and seen["same_as_before"], seen
            assert seen["storages"] < seen["params"] and seen["bytes"] == seen["param_bytes"], seen


class _Cell:
    """What the sweep's `subprocess.Popen` returns in the tests below: a cell that failed at once
    (rc 1, so the sweep goes on to the next) the first time it is polled."""

    def __init__(self, gpus: str | None, live: list[_Cell]) -> None:
        self.gpus, self.returncode, self._live = gpus, None, live

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = 1
            self._live.remove(self)
        return self.returncode


def _sweep_on_a_node(
    tmp_path, monkeypatch, gpus: int, argv: list[str], device: str = "auto"
) -> tuple[int, list[list[str | None]]]:
    """`python -m launch.sweep` of 8 cells on a machine whose torch reports `gpus` GPUs: its exit
    status and, at each cell's start, the CUDA_VISIBLE_DEVICES of every cell then running."""
    spec = {
        "base": "configs/tiny.yaml",
        "runs_dir": str(tmp_path / "runs"),
        "overrides": {"parallel.backend": "ddp", "train.device": device},
        "scales": ["tiny"],
        "optimizers": ["adamw", "orscale_lm"],
        "lrs": [1e-3, 3e-3],
        "seeds": [0, 1],
    }
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    live: list[_Cell] = []
    starts: list[list[str | None]] = []

    def popen(argv, env, **kwargs):
        live.append(_Cell(env.get("CUDA_VISIBLE_DEVICES"), live))
        starts.append([c.gpus for c in live])
        return live[-1]

    monkeypatch.setattr(jobs.subprocess, "Popen", popen)
    return sweep.main([str(tmp_path / "s.yaml"), *argv]), starts


def test_concurrent_sweep_cells_get_disjoint_gpus_of_a_node(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    rc, starts = _sweep_on_a_node(tmp_path, monkeypatch, 8, ["--jobs", "4", "--nproc", "2"])
    assert rc == 1 and len(starts) == 8  # every cell started (and failed at once: the stand-in)
    assert starts[3] == ["0,1", "2,3", "4,5", "6,7"]  # four cells at once, four disjoint pairs
    for running in starts:
        held = [g for gpus in running for g in gpus.split(",")]
        assert len(running) <= 4 and len(held) == len(set(held)) == 2 * len(running), running
    assert "CUDA_VISIBLE_DEVICES=6,7 " in capsys.readouterr().out  # each cell's line names its GPUs


def test_a_sweep_asking_for_more_gpus_than_visible_runs_fewer_at_once_or_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3,4,6,7")  # what the node let this shell use: kept
    rc, starts = _sweep_on_a_node(tmp_path, monkeypatch, 5, ["--jobs", "4", "--nproc", "2"])
    assert rc == 1 and len(starts) == 8 and max(len(s) for s in starts) == 2
    assert starts[1] == ["1,3", "4,6"]
    assert "at most 2 GPU cells run at once" in capsys.readouterr().out
    rc, starts = _sweep_on_a_node(tmp_path, monkeypatch, 5, ["--jobs", "2", "--nproc", "8"])
    err = capsys.readouterr().err
    assert rc == 2 and starts == [] and err.count("\n") == 1 and "lower --nproc to at most 5" in err, err


def test_a_cpu_node_or_a_cpu_sweep_leaves_cuda_visible_devices_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    rc, starts = _sweep_on_a_node(tmp_path, monkeypatch, 0, ["--jobs", "4", "--nproc", "2"])
    assert rc == 1 and len(starts) == 8 and starts[3] == [None] * 4
    assert jobs.visible_gpus() == [] and "CUDA_VISIBLE_DEVICES" not in os.environ
    rc, starts = _sweep_on_a_node(tmp_path / "cpu", monkeypatch, 8, ["--jobs", "4", "--nproc", "2"], "cpu")
    assert rc == 1 and len(starts) == 8 and starts[3] == [None] * 4  # train.device=cpu on a GPU node
