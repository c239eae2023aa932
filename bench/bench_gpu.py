"""Training throughput, MFU and peak memory: FSDP2 + bf16 + per-block compile, synthetic tokens.

    torchrun --nproc_per_node=1 -m bench.bench_gpu                       # 125m and 1.1b, adamw and orscale_lm
    torchrun --nproc_per_node=1 -m bench.bench_gpu --presets 125m --optims orscale_lm --steps 20
    python -m bench.bench_gpu --device cpu --presets tiny --steps 3        # a smoke test without a GPU

MFU uses the model's training FLOPs per token (6N + attention) against a per-GPU dense bf16 peak.
Synthetic tokens keep the data pipeline out of the measurement. Prints one line per run; asserts
nothing.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from launch.config import load_config
from launch.engine.parallelize import build_model
from launch.run.meter import peak_tflops
from launch.runtime.process_group import compute_dtype, init_distributed, shutdown
from orscale import build_optimizers
from orscale.schedule import set_lr

SEQ = {"tiny": 256, "125m": 1024, "399m": 2048, "545m": 4096, "1.1b": 4096}


def run(preset: str, optim: str, args) -> None:
    seq = SEQ[preset]
    overrides = [
        f"model.preset={preset}",
        f"data.seq_len={seq}",
        f"optim.name={optim}",
        "parallel.backend=fsdp",
        f"parallel.compile={str(args.compile).lower()}",
        f"parallel.activation_checkpointing={str(args.ac).lower()}",
        f"train.device={args.device}",
        f"train.micro_batch_size={args.micro_batch}",
        f"train.tokens_per_step={args.micro_batch * seq}",
        "data.val_tokens=" + str(seq),
        "optim.diagnostics=false",
    ]
    cfg = load_config(None, overrides)
    env = init_distributed(cfg.parallel.backend, cfg.train.device)
    from models import get_preset

    model_cfg = get_preset(preset)
    dtype = compute_dtype(cfg.train.dtype, env.device)
    model = build_model(model_cfg, cfg.parallel, cfg.train.seed, env, dtype)
    optimizers = build_optimizers(model, cfg.optim, backend=cfg.parallel.backend, mode=cfg.parallel.muon_mode)
    set_lr(optimizers, cfg.optim.lr)
    tokens = torch.randint(0, 50257, (args.micro_batch, seq + 1), device=env.device)
    if env.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()

    def step() -> None:
        with torch.autocast(env.device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):  # compilation and allocator warm-up
        step()
    sync = torch.cuda.synchronize if env.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    elapsed = time.perf_counter() - t0
    tok_s = args.steps * args.micro_batch * seq * env.world_size / elapsed
    mfu = model.flops_per_token(seq) * tok_s / env.world_size / ((peak_tflops(env.device) or float("nan")) * 1e12)
    mem = torch.cuda.max_memory_allocated() / 2**30 if env.device.type == "cuda" else float("nan")
    if env.is_main:
        print(
            f"{preset:>5} {optim:>11}: {tok_s:,.0f} tokens/s, MFU {mfu * 100:.1f}%, peak memory {mem:.1f} GiB "
            f"(micro-batch {args.micro_batch} x {seq}, {env.world_size} GPU(s), compile={args.compile})",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--presets", nargs="+", default=["125m", "1.1b"])
    parser.add_argument("--optims", nargs="+", default=["adamw", "orscale_lm"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--ac", action=argparse.BooleanOptionalAction, default=False, help="activation checkpointing")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: bench_gpu.py needs a CUDA GPU (use --device cpu for a smoke test)")
    try:
        for preset in args.presets:
            for optim in args.optims:
                run(preset, optim, args)
    finally:
        shutdown()


if __name__ == "__main__":
    main()
