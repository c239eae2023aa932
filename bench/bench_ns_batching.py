"""Benchmark (prints, does not assert): the optimizer's Newton–Schulz work at the 125m shapes,
bucketed by stored shape (the old `newton_schulz_many`, reproduced here) against bucketing by the
oriented shape (the library's, which puts MLP up 3072×768 and down 768×3072 in one batch).

    python -m bench.bench_ns_batching [--rounds 7] [--threads 2] [--layers 12] [--steps 5]
                                      [--bf16-layers 1] [--bf16-steps 1] [--dtypes fp32,bf16]

Per layer: qkv 2304×768, attention out 768×768, MLP up 3072×768, MLP down 768×3072 (fp32 inputs,
as the optimizer's momenta are). Rounds are interleaved, old then new, the order alternating
between rounds, so both see the same load on a shared machine; reported: the median of the
per-round ratios old/new and their spread. On a CPU without native bf16 GEMMs a bf16 iteration is
~40× slower than fp32, hence the smaller default bf16 workload (the work per matrix and iteration
is the same, only fewer of them; with one layer old runs 4 calls and new 3). Also checked: the
two bucketings give bit-equal outputs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence

import torch
from torch import Tensor

from orscale.newton_schulz import newton_schulz, newton_schulz_many

SHAPES_125M = [(2304, 768), (768, 768), (3072, 768), (768, 3072)]


def old_newton_schulz_many(matrices: Sequence[Tensor], steps: int, dtype: str) -> list[Tensor]:
    """`newton_schulz_many` before this change: buckets keyed by the stored shape."""
    buckets: dict[tuple, list[int]] = defaultdict(list)
    for i, m in enumerate(matrices):
        buckets[(tuple(m.shape), m.dtype, m.device)].append(i)
    out: dict[int, Tensor] = {}
    for idx in buckets.values():
        if len(idx) == 1:
            out[idx[0]] = newton_schulz(matrices[idx[0]], steps, "polar_express", dtype)
            continue
        stacked = newton_schulz(torch.stack([matrices[i] for i in idx]), steps, "polar_express", dtype)
        for i, q in zip(idx, stacked.unbind(0), strict=True):
            out[i] = q
    return [out[i] for i in range(len(matrices))]


def new_newton_schulz_many(matrices: Sequence[Tensor], steps: int, dtype: str) -> list[Tensor]:
    return newton_schulz_many(matrices, steps, "polar_express", dtype)


def timed(fn, mats: list[Tensor], steps: int, dtype: str) -> tuple[float, list[Tensor]]:
    start = time.perf_counter()
    out = fn(mats, steps, dtype)
    return time.perf_counter() - start, out


def bench(dtype: str, layers: int, steps: int, rounds: int) -> None:
    gen = torch.Generator().manual_seed(0)
    mats = [torch.randn(s, generator=gen) * 1e-3 for _ in range(layers) for s in SHAPES_125M]
    variants = {"old": old_newton_schulz_many, "new": new_newton_schulz_many}
    # Warm-up on one layer (the same shapes, so the same kernels), outside the timing.
    for fn in variants.values():
        fn(mats[: len(SHAPES_125M)], 1, dtype)
    print(f"\n{dtype}: {layers} layer(s), {len(mats)} matrices, {steps} step(s), {rounds} rounds")
    times: dict[str, list[float]] = {"old": [], "new": []}
    ratios = []
    for r in range(rounds):
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        outs = {}
        for name in order:
            t, outs[name] = timed(variants[name], mats, steps, dtype)
            times[name].append(t)
        ratios.append(times["old"][-1] / times["new"][-1])
        if r == 0:
            same = all(torch.equal(a, b) for a, b in zip(outs["old"], outs["new"], strict=True))
            print(f"  outputs bit-equal old vs new: {same}")
        print(
            f"  round {r} ({order[0]} first): old {times['old'][-1]:7.2f} s  new {times['new'][-1]:7.2f} s  "
            f"old/new {ratios[-1]:.3f}",
            flush=True,
        )
    for name, ts in times.items():
        print(
            f"  {name}: median {statistics.median(ts):.2f} s, min {min(ts):.2f}, max {max(ts):.2f} "
            f"(spread (max-min)/median {(max(ts) - min(ts)) / statistics.median(ts):.0%})"
        )
    print(f"  {dtype} old/new: median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=12, help="fp32 workload")
    ap.add_argument("--steps", type=int, default=5, help="fp32 Newton–Schulz iterations")
    ap.add_argument("--bf16-layers", type=int, default=1)
    ap.add_argument("--bf16-steps", type=int, default=1)
    ap.add_argument("--dtypes", default="fp32,bf16")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads")
    for dtype in args.dtypes.split(","):
        if dtype == "fp32":
            bench("fp32", args.layers, args.steps, args.rounds)
        else:
            bench(dtype, args.bf16_layers, args.bf16_steps, args.rounds)


if __name__ == "__main__":
    main()
