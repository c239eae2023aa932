"""Memory traffic and matmul FLOPs of a piece of code, counted op by op (usually on `meta` tensors, so
a 1.1b-sized step costs no memory and no time): every ATen operator the code dispatches, with the
bytes it reads and writes and, for matrix products, its FLOPs.

    counts = count_ops(lambda: opt.step())
    counts.non_matmul_bytes, counts.matmul_flops, counts.outputs(dtype=torch.bfloat16)

What an op moves is counted as one pass over memory: each distinct input element read once, each
output element written once (an in-place op's `self` both; an `out=` or `copy_` destination written
only); views move nothing. Custom operators (`torch.library`) count as one op at their inputs and
outputs: that is what the one kernel they stand for moves on a GPU. Eager code that runs several ops
where a GPU would fuse them is counted op by op, so the count is an upper bound of the GPU's
traffic. An estimate, not a measurement: caches, tiling and partial reads are not modelled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten
MATMULS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "_scaled_mm"}
# Custom operators that are matrix products: their FLOPs from their arguments.
CUSTOM_MATMULS: dict[str, Callable[[tuple], float]] = {
    # acc [V, d] += grad_logitsᵀ [V, rows] · h [rows, d]
    "fused_loss::accumulate_grad_w": lambda args: 2.0 * args[0].numel() * args[1].shape[0],
}
WRITE_ONLY = {"copy_", "fill_", "zero_", "normal_", "uniform_", "empty", "empty_like", "empty_strided"}
FREE = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}  # allocation, no traffic


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor view addresses (broadcast dimensions count once)."""
    n = 1
    for size, stride in zip(t.shape, t.stride(), strict=True):
        n *= size if stride != 0 else 1
    return n * t.element_size()


@dataclass
class OpRecord:
    name: str  # e.g. "aten::add_.Tensor" or "fused_loss::accumulate_grad_w"
    read: int  # bytes
    written: int
    flops: float  # matrix products only
    outputs: list[tuple[tuple[int, ...], torch.dtype]]  # shape and dtype of each tensor written


@dataclass
class OpCounts:
    ops: list[OpRecord] = field(default_factory=list)

    @property
    def matmul_flops(self) -> float:
        return sum(op.flops for op in self.ops)

    @property
    def matmul_bytes(self) -> int:
        return sum(op.read + op.written for op in self.ops if op.flops)

    @property
    def non_matmul_bytes(self) -> int:
        return sum(op.read + op.written for op in self.ops if not op.flops)

    def named(self, fragment: str) -> list[OpRecord]:
        return [op for op in self.ops if fragment in op.name]

    def outputs(self, shape: tuple[int, ...] | None = None, dtype: torch.dtype | None = None) -> list[str]:
        """Names of the ops that wrote a tensor of `shape` and/or `dtype`."""
        return [
            op.name
            for op in self.ops
            for s, d in op.outputs
            if (shape is None or s == shape) and (dtype is None or d == dtype)
        ]


class _Recorder(TorchDispatchMode):
    def __init__(self, counts: OpCounts) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        schema = func._schema
        base = schema.name.split("::")[-1]
        if func.is_view or base in ("detach", "alias", "lift_fresh", "_unsafe_view", "view", "t"):
            return out
        written_ids: set[int] = set()
        read = written = 0
        outputs: list[tuple[tuple[int, ...], torch.dtype]] = []
        # Arguments the schema writes: in-place `self` (read and written), `out=` (written only).
        for i, arg in enumerate(schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            tensors = [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
            mutable = arg.alias_info is not None and arg.alias_info.is_write
            for t in tensors:
                if mutable:
                    written += tensor_bytes(t)
                    written_ids.add(id(t))
                    outputs.append((tuple(t.shape), t.dtype))
                    if arg.is_out or base in WRITE_ONLY:
                        continue
                if base not in FREE:
                    read += tensor_bytes(t)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and id(t) not in written_ids and not any(t is a for a in args):
                if base not in FREE:
                    written += tensor_bytes(t)
                outputs.append((tuple(t.shape), t.dtype))
        flops = 0.0
        if str(schema.name) in CUSTOM_MATMULS:
            flops = CUSTOM_MATMULS[str(schema.name)](args)
        elif base in MATMULS:
            mats = [a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 2]
            k = mats[-1].shape[-2]  # the contracted dimension: rows of the right-hand matrix
            result = tree_flatten(out)[0][0]
            flops = 2.0 * result.numel() * k
        self.counts.ops.append(OpRecord(str(schema.name) + (f".{func._overloadname}"), read, written, flops, outputs))
        return out


def count_ops(fn: Callable[[], Any]) -> tuple[Any, OpCounts]:
    """Run `fn()` and record every ATen (or custom) operator it dispatches: (its result, the counts)."""
    counts = OpCounts()
    with _Recorder(counts):
        result = fn()
    return result, counts
