"""Small parameter sets and gradient sequences for the optimizer formula tests."""

from __future__ import annotations

import math

import torch
from torch import nn

SHAPES = [(6, 4), (4,), (5, 6), (5,), (3, 5)]


def make_params(seed: int = 0, shapes=SHAPES) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]


def grad_seq(steps: int, seed: int = 1, shapes=SHAPES, spread: float = 3.0) -> list[list[torch.Tensor]]:
    """Random gradients whose block scales differ by up to e^±spread (so the M1 clip binds)."""
    gen = torch.Generator().manual_seed(seed)
    scales = [math.exp(spread * (2 * torch.rand((), generator=gen).item() - 1)) for _ in shapes]
    return [[k * torch.randn(s, generator=gen) for k, s in zip(scales, shapes, strict=True)] for _ in range(steps)]


def run(opt: torch.optim.Optimizer, params: list[nn.Parameter], grads) -> list[list[torch.Tensor]]:
    """Apply the gradient sequence; returns the params after each step."""
    out = []
    for gs in grads:
        for p, g in zip(params, gs, strict=True):
            p.grad = g.to(p.dtype, copy=True)
        opt.step()
        out.append([p.detach().clone() for p in params])
    return out


def assert_close_lists(a, b, rtol=2e-5, atol=1e-6):
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x.double(), y.double(), rtol=rtol, atol=atol)
