"""A node of 8 GPUs read as CUDA and NCCL would run it, guarded on CPU: each test answers CUDA's
question for the CPU (a patched accelerator, a spy, a machine that reports 8 GPUs) and asserts what
that node would get.

1. FSDP2's 1-D mesh takes its device type from the run (`train.device`), not the machine's
   accelerator: a CPU run on a GPU node keeps a CPU mesh under its gloo group.
"""

from __future__ import annotations

import pytest
import torch

from launch.config import load_config
from launch.engine.parallelize import build_model
from launch.runtime.process_group import DistEnv
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
        model = build_model(get_preset("tiny", **MODEL), cfg.parallel, 7, env)
    finally:
        torch._C._get_accelerator = accelerator
    mesh = next(model.parameters()).device_mesh
    return mesh.device_type, tuple(mesh.shape)


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_meshes_take_the_runs_device_not_the_machines_accelerator():
    assert rank_pool(2).run(_fsdp_mesh_on_a_gpu_machine, []) == [("cpu", (2,))] * 2
