"""Pieces every optimizer in ``orscale`` shares: the params type, the closure call and the
per-tensor sums of squares that each step's single all-reduce carries."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor

ParamsT = Union[Iterable[Tensor], Iterable[tuple[str, Tensor]], Iterable[dict[str, Any]]]


def call_closure(closure: Optional[Callable[[], float]]) -> Optional[float]:
    """torch.optim's contract: re-evaluate the loss with gradients enabled inside a no-grad step."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def sums_of_squares(xs: list[Tensor]) -> Tensor:
    """[len(xs)] tensor of Σx² per tensor. _foreach_norm is one fused kernel per dtype/device on
    GPU; squaring back is exact enough (fp32 relative error ~1e-7) and keeps each entry a sum of
    squares, so partial sums over shards add up under all-reduce."""
    return torch.stack(torch._foreach_norm(xs)).square()
