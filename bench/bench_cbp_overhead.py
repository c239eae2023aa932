"""Benchmark (prints, asserts nothing): per-iteration wall time of CBP ÷ Adam on an MLP width sweep
(seed 000 §5.6, Table 4), next to the paper's numbers.

    OMP_NUM_THREADS=1 python -m bench.bench_cbp_overhead [--widths 256,1024,4096] [--iters 60]
        [--warmup 5] [--batch 128] [--threads 1]

Architecture read off Table 4's parameter counts: 784 → w → w → w → w → 10 (four hidden ReLU
layers; 0.40 M / 4.0 M / 53.6 M parameters at w = 256 / 1024 / 4096), batch 128, random MNIST-shaped
inputs. One iteration = forward, backward, optimizer step, and for the full CBP also the M2 mean
update with the bias transport (every Linear a CenteredLinear). Columns: SGD, Adam (torch's default
CPU path), CBP without M2 (the optimizer alone) and the full CBP. The arms are timed round-robin,
one iteration each per round, so they share the machine's noise; we report the mean over --iters
rounds after --warmup. Paper: two threads, mean of 60 timed iterations, a per-tensor PyTorch CBP.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from models.centered_linear import CenteredLinear, update_means
from orscale.cbp import CBP

# Table 4: width -> (params M, SGD ms, Adam ms, CBP ms, ×Adam)
PAPER = {256: (0.40, 2.2, 3.8, 7.8, 2.1), 1024: (4.0, 23.2, 36.5, 69.5, 1.9), 4096: (53.6, 281, 654, 1061, 1.6)}


def mlp(width: int, centered: bool, d_in: int = 784, d_out: int = 10, hidden: int = 4) -> nn.Sequential:
    dims = [d_in] + [width] * hidden + [d_out]
    layers: list[nn.Module] = []
    for i, (fi, fo) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        layers.append(CenteredLinear(fi, fo) if centered else nn.Linear(fi, fo))
        if i < hidden:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def weight_bias_groups(model: nn.Module) -> list[dict]:
    named = list(model.named_parameters())
    return [
        dict(params=[(n, p) for n, p in named if p.ndim >= 2]),
        dict(params=[(n, p) for n, p in named if p.ndim < 2]),
    ]


def make_arms(width: int) -> dict[str, Callable[[], None]]:
    """name -> a closure running one training iteration of that arm."""
    gen = torch.Generator().manual_seed(0)
    arms = {}
    specs = [
        ("SGD", False, lambda m: torch.optim.SGD(m.parameters(), lr=1e-3)),
        ("Adam", False, lambda m: torch.optim.Adam(m.parameters(), lr=1e-3)),
        ("CBP (M1+M3)", False, lambda m: CBP(weight_bias_groups(m), lr=1e-3)),
        ("CBP (full)", True, lambda m: CBP(weight_bias_groups(m), lr=1e-3)),
    ]
    for name, centered, make_opt in specs:
        torch.manual_seed(0)
        model = mlp(width, centered)
        opt = make_opt(model)
        x = torch.randn(128, 784, generator=gen)
        y = torch.randint(0, 10, (128,), generator=gen)

        def one(model=model, opt=opt, x=x, y=y, centered=centered) -> None:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if centered:
                update_means(model)

        arms[name] = one
    return arms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", default="256,1024,4096")
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"# CPU, {args.threads} thread(s), batch {args.batch}; mean of {args.iters} round-robin "
        f"iterations after {args.warmup} warm-up"
    )
    print(
        f"{'width':>6s} {'params':>7s} {'SGD ms':>8s} {'Adam ms':>8s} {'CBP-opt ms':>10s} "
        f"{'CBP ms':>8s} {'×Adam':>6s} {'med ×Adam':>9s} | paper: params, SGD, Adam, CBP, ×Adam"
    )
    for width in (int(w) for w in args.widths.split(",")):
        arms = make_arms(width)
        n_params = sum(p.numel() for p in mlp(width, False).parameters()) / 1e6
        names = list(arms)
        times: dict[str, list[float]] = {n: [] for n in names}
        for it in range(args.warmup + args.iters):
            order = names[it % len(names) :] + names[: it % len(names)]  # rotate who goes first
            for name in order:
                t0 = time.perf_counter()
                arms[name]()
                dt = time.perf_counter() - t0
                if it >= args.warmup:
                    times[name].append(dt * 1e3)
        mean = {n: statistics.mean(v) for n, v in times.items()}
        ratios = [c / a for c, a in zip(times["CBP (full)"], times["Adam"], strict=True)]
        p = PAPER.get(width)
        paper = f"{p[0]}M, {p[1]}, {p[2]}, {p[3]}, {p[4]}" if p else ""
        print(
            f"{width:6d} {n_params:6.2f}M {mean['SGD']:8.1f} {mean['Adam']:8.1f} "
            f"{mean['CBP (M1+M3)']:10.1f} {mean['CBP (full)']:8.1f} "
            f"{mean['CBP (full)'] / mean['Adam']:6.2f} {statistics.median(ratios):9.2f} | {paper}",
            flush=True,
        )
        del arms


if __name__ == "__main__":
    main()
