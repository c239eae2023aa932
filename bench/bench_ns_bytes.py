"""Memory traffic of one Muon-family optimizer step outside its matrix products, counted on `meta` at a
preset's real shapes (no memory, no time: `bench/op_bytes.py`), with the Newton–Schulz matmul FLOPs
beside it. An estimate of what a GPU moves (docs/gpu.md): each op counted as one pass over memory.

    python -m bench.bench_ns_bytes [--preset 1.1b] [--optim orscale_lm] [--ns-dtype bf16]

The count covers `MuonFamily.step` on one process (one GPU): momentum, Nesterov, Newton–Schulz's
normalisation and iterations, the trust ratio's norms and the update, over every 2-D matrix of
the blocks. Gradient clipping and AdamW's parameters are not in it.
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch

from bench.op_bytes import OpCounts, count_ops
from orscale.muon_spec import MuonOptions


def muon_step_counts(
    preset: str = "1.1b", optim: str = "orscale_lm", ns_dtype: str = "bf16", steps: int = 1
) -> OpCounts:
    """The ops of the `steps`-th optimizer step (the first ones calibrate and allocate alike) of
    `optim` over `preset`'s matrices, built on `meta` with fp32 weights and gradients."""
    from models import GPT, get_preset
    from orscale import MuonFamily, OptimConfig
    from orscale.muon_spec import muon_family_kwargs
    from orscale.routing import route_parameters

    with torch.device("meta"):
        model = GPT(get_preset(preset))
    cfg = OptimConfig(name=optim).with_options(
        MuonOptions(ns_dtype=ns_dtype, compile_passes=False)
    )  # meta: each pass counted as one op
    matrices = route_parameters(model, cfg).matrices
    opt = MuonFamily(matrices, **muon_family_kwargs(cfg))
    for _, p in matrices:
        p.grad = torch.empty_like(p)
    counts = OpCounts()
    for _ in range(steps):
        _, counts = count_ops(opt.step)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="1.1b")
    ap.add_argument("--optim", default="orscale_lm")
    ap.add_argument("--ns-dtype", default="bf16", choices=["bf16", "fp32"])
    args = ap.parse_args()
    counts = muon_step_counts(args.preset, args.optim, args.ns_dtype, steps=2)
    print(
        f"{args.optim} on {args.preset}'s matrices, NS in {args.ns_dtype}, one step (meta): "
        f"{counts.non_matmul_bytes / 1e9:.1f} GB outside the matmuls in {sum(not op.flops for op in counts.ops)} ops; "
        f"matmuls {counts.matmul_flops / 1e12:.1f} TFLOP, {counts.matmul_bytes / 1e9:.1f} GB"
    )
    heavy = Counter()
    for op in counts.ops:
        if not op.flops:
            heavy[op.name] += op.read + op.written
    for name, nbytes in heavy.most_common(8):
        print(f"  {nbytes / 1e9:7.2f} GB  {name}")


if __name__ == "__main__":
    main()
