"""Benchmark (prints, asserts nothing): M1 equalisation of per-layer gradient-block norms at init
(seed 000 §6.1, Figure 2), next to the paper's numbers.

    OMP_NUM_THREADS=1 python -m bench.bench_cbp_equalization [--seeds 10] [--depth 24] [--width 48]

Setup as the paper states it: a 24-hidden-layer tanh MLP of width 48 (the width of all its
synthetic studies) on the six-arm spiral (2-D input, 6 classes, cross-entropy), weights
N(0, (1.2·σ_Xavier)²) with σ_Xavier² = 2/(fan_in + fan_out), biases N(0, 0.25²) ("randomly offset
biases"), every layer including the output one. The Frobenius norm of each layer's weight-gradient
block is measured on a full batch (the 60 % training split, 1800 points, of
bench_cbp_spiral's data). Disparity = max_l ‖g_l‖ / min_l ‖g_l‖, raw and after one application of
the M1 scaling s_l = clip(c/√q_l, 0.1, 4), q_l = ‖g_l‖², c = (mean_j q_j)^½ (the function
``orscale.cbp.equalization_scales`` that the optimizer itself uses). The spiral's noise level for
this study is not in the seed text (Appendix C); ours is bench_cbp_spiral's default.
Paper: raw 16 ± 10 → 2.1 ± 1.0 after M1 (mean ± sd over ten seeds), earliest layers weakest.
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch
from torch import nn
from torch.nn import functional as F

from bench.bench_cbp_spiral import make_spiral, split
from orscale.cbp import equalization_scales


def saturating_tanh_mlp(
    seed: int, depth: int, width: int, gain: float, bias_std: float, d_in: int = 2, d_out: int = 6
) -> nn.Sequential:
    gen = torch.Generator().manual_seed(seed)
    dims = [d_in] + [width] * depth + [d_out]
    layers: list[nn.Module] = []
    for i, (fi, fo) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        lin = nn.Linear(fi, fo)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(fo, fi, generator=gen) * gain * math.sqrt(2.0 / (fi + fo)))
            lin.bias.copy_(torch.randn(fo, generator=gen) * bias_std)
        layers.append(lin)
        if i < len(dims) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def block_norms(seed: int, args: argparse.Namespace) -> torch.Tensor:
    """‖∂L/∂W_l‖_F for every layer (input side first), full batch."""
    x, y = split(*make_spiral(seed, noise=args.noise))["train"]
    model = saturating_tanh_mlp(seed, args.depth, args.width, args.gain, args.bias_std)
    F.cross_entropy(model(x), y).backward()
    return torch.stack([m.weight.grad.norm() for m in model if isinstance(m, nn.Linear)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--depth", type=int, default=24, help="hidden layers")
    ap.add_argument("--width", type=int, default=48)
    ap.add_argument("--gain", type=float, default=1.2, help="multiple of the Xavier std")
    ap.add_argument("--bias-std", type=float, default=0.25)
    ap.add_argument("--noise", type=float, default=0.30, help="spiral angular noise (ours)")
    ap.add_argument("--s-min", type=float, default=0.1)
    ap.add_argument("--s-max", type=float, default=4.0)
    args = ap.parse_args()
    torch.set_num_threads(1)

    raw_r, eq_r, profiles, clipped = [], [], [], []
    print(
        f"# {args.depth}-hidden-layer tanh MLP, width {args.width}, weights {args.gain}x Xavier, "
        f"bias std {args.bias_std}; full batch; clip [{args.s_min}, {args.s_max}]"
    )
    print(
        f"{'seed':>4s} {'raw max/min':>12s} {'M1 max/min':>11s} {'argmin layer':>12s} "
        f"{'blocks at s_max':>15s} {'at s_min':>8s}"
    )
    for seed in range(args.seeds):
        g = block_norms(seed, args)
        _, s = equalization_scales(g.square(), args.s_min, args.s_max)
        e = s * g
        raw_r.append((g.max() / g.min()).item())
        eq_r.append((e.max() / e.min()).item())
        profiles.append(g)
        clipped.append(((s >= args.s_max).sum().item(), (s <= args.s_min).sum().item()))
        print(
            f"{seed:4d} {raw_r[-1]:12.1f} {eq_r[-1]:11.2f} {int(g.argmin()) + 1:12d} "
            f"{clipped[-1][0]:15d} {clipped[-1][1]:8d}"
        )

    def ms(v: list[float]) -> str:
        return f"{statistics.mean(v):.1f} ± {statistics.stdev(v):.1f}" if len(v) > 1 else f"{v[0]:.1f}"

    print(f"\n{'':28s}{'ours':>16s}{'paper':>14s}")
    print(f"{'raw disparity (mean ± sd)':28s}{ms(raw_r):>16s}{'16 ± 10':>14s}")
    print(f"{'after one M1 scaling':28s}{ms(eq_r):>16s}{'2.1 ± 1.0':>14s}")
    print(f"{'raw, median over seeds':28s}{statistics.median(raw_r):16.1f}")
    print(f"{'M1, median over seeds':28s}{statistics.median(eq_r):16.2f}")
    med = torch.stack(profiles).median(0).values
    print("\nmedian block norm per layer (input → output):")
    print(" ".join(f"{v:.2e}" for v in med.tolist()))


if __name__ == "__main__":
    main()
