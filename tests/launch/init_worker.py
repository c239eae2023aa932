"""Initial weights under each backend (a job for 2 ranks of the pool, tests/pool.py): the full state
dicts that FSDP2 (meta-device build), DDP and DeepSpeed ZeRO-2 start from, for
tests/launch/test_distributed.py to compare, bit for bit, with a single-process `GPT(cfg, seed)`."""

from __future__ import annotations

import torch

from launch.backends.registry import backend_for
from launch.config import Config
from launch.engine.parallelize import build_model
from launch.runtime.process_group import init_distributed
from models import get_preset

MODEL = dict(n_layer=2, d_model=64, n_head=4, max_seq_len=32, vocab_size=50257, center_mlp=True)
SEED = 11


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().clone() for k, v in sd.items()}


def initial_states() -> dict[str, dict[str, torch.Tensor]] | None:
    """{backend: full initial state dict} on rank 0 (None on the others)."""
    cfg = Config()
    cfg.parallel.backend = "fsdp"
    cfg.train.device = "cpu"
    cfg.train.seed = SEED
    env = init_distributed(backend_for(cfg.parallel.backend), cfg.train.device)
    results = {}
    for backend in ("fsdp", "ddp"):
        cfg.parallel.backend = backend
        model = build_model(
            get_preset("tiny", **MODEL), cfg.parallel, cfg.train.seed, env, backend=backend_for(cfg.parallel.backend)
        )
        results[backend] = full_state(model)
    from launch.engine.deepspeed_engine import DeepSpeedEngine

    cfg.parallel.backend = "zero2"
    zero_model = dict(MODEL, center_mlp=False)  # ZeRO does not run the centred MLP
    engine = DeepSpeedEngine(
        backend_for(cfg.parallel.backend),
        get_preset("tiny", **zero_model),
        cfg.parallel,
        cfg.optim,
        cfg.train,
        env,
        torch.float32,
        accum_steps=1,
    )
    results["zero2"] = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    return results if env.rank == 0 else None
