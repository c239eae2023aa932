"""Per-group learning rates as each engine applies them: the worker of
tests/orscale/test_adamw_lr.py. Builds the engine of `--backend` (none, fsdp, zero2) with
`optim.adamw_lr`, trains a few steps on fixed tokens and records, after each step, every param
group's LR and whether it holds only hidden matrices, read from the optimizers themselves (ZeRO: the
client's groups and, for the CBP family, its owner-side optimizer's groups). `run_all` is a job for
the pool of ranks (tests/pool.py); each rank returns its record, as JSON carries it.
"""

from __future__ import annotations

import json

import torch

from launch.plan import load_config
from orscale.schedule import lr_at
from tests.orscale.optim_helpers import gpt_hidden

STEPS = 4
SEQ = 16
OVERRIDES = [
    "model.n_layer=2",
    "model.d_model=32",
    "model.n_head=2",
    f"model.max_seq_len={SEQ}",
    f"data.seq_len={SEQ}",
    f"data.val_tokens={SEQ}",
    "model.vocab_size=256",
    "train.micro_batch_size=2",
    "train.device=cpu",
    "train.dtype=fp32",
    f"train.max_steps={STEPS}",
    "optim.lr=0.01",
    "optim.adamw_lr=0.04",
    "optim.warmup_steps=2",
    "optim.ns_dtype=fp32",
]


def _groups(engine) -> list[tuple[str, float]]:
    """(kind, lr) of every param group this rank's optimizers hold. kind: "hidden" (only the blocks'
    2-D weights), "adamw" (everything else: embedding, norms), or "zero-matrix" (ZeRO's client group
    that feeds its owner-side optimizer, which runs the hidden matrices or, for the CBP family,
    every tensor: its LR is optim.lr's and the owner's groups carry the scales)."""
    optimizers = list(getattr(engine, "optimizers", None) or [engine.optimizer])
    owner = getattr(optimizers[0], "_muon", None)  # ZeRO: the owner-side optimizer over whole tensors
    out = []
    for opt in optimizers + ([owner] if owner is not None else []):
        for i, group in enumerate(opt.param_groups):
            role = group.get("orscale_role")  # ZeRO's client groups hold flat partitions, not named tensors
            if role == "matrix":
                out.append(("zero-matrix", group["lr"]))
                continue
            if role is not None:  # an AdamW group of ZeRO's client: its tensors' names from its layout
                names = opt._layouts[i].names
                hidden = all(
                    n.startswith("blocks.") and len(s) == 2 for n, s in zip(names, opt._layouts[i].shapes, strict=True)
                )
            else:
                hidden = all(gpt_hidden(n, p) for n, p in zip(group["param_names"], group["params"], strict=True))
            out.append(("hidden" if hidden else "adamw", group["lr"]))
    return out


def run(backend: str, optim: str) -> dict:
    from launch.backends.registry import backend_for
    from launch.runtime.process_group import compute_dtype, init_distributed

    cfg = load_config(None, [*OVERRIDES, f"optim.name={optim}", f"parallel.backend={backend}"])
    env = init_distributed(backend_for(backend), "cpu")
    dtype = compute_dtype(cfg.train.dtype, env.device)
    engine = backend_for(backend).build_engine(cfg.model.resolve(), cfg.parallel, cfg.optim, cfg.train, env, dtype, 1)
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (STEPS, 2 * env.world_size, SEQ + 1), generator=gen)
    steps = []
    for step in range(STEPS):
        lr = lr_at(step, cfg.optim.lr, cfg.optim.warmup_steps, STEPS, cfg.optim.min_lr_ratio)
        rows = data[step, 2 * env.rank : 2 * env.rank + 2]
        engine.forward_backward(rows, last_micro_batch=True)
        engine.step(lr)
        steps.append({"lr": lr, "groups": _groups(engine)})
    return {"steps": steps}


def run_all(backend: str, optims: list[str]) -> dict:
    torch.set_num_threads(1)
    return json.loads(json.dumps({optim: run(backend, optim) for optim in optims}))
