"""Pieces every optimizer in ``orscale`` shares: the params type, the check of a hyper-parameter, the
closure call, what a copy of an optimizer carries, and the per-tensor sums of squares that each step's
single all-reduce carries."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

ParamsT = Iterable[Tensor] | Iterable[tuple[str, Tensor]] | Iterable[dict[str, Any]]
# What torch._foreach_* take and return (their outputs are tuples).
TensorList = list[Tensor] | tuple[Tensor, ...]


def check_number(
    name: str, value: object, holds: Callable[[float], bool] = lambda x: x >= 0, bound: str = "≥ 0"
) -> None:
    """Raise, in one line, unless `value` is a finite Python number (not a bool) for which `holds` is
    true; `bound` says that condition in words ("≥ 0", "in [0, 1)")."""
    said = f"{name} must be a finite number {bound}, got {value!r} ({type(value).__name__})"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(said)
    if not (math.isfinite(value) and holds(value)):
        raise ValueError(said)


def grad_of(p: Tensor) -> Tensor:
    """`p.grad`, for a parameter already selected as having one."""
    g = p.grad
    if g is None:
        raise RuntimeError("a parameter selected for this step has no gradient")
    return g


def call_closure(closure: Callable[[], float] | None) -> float | None:
    """torch.optim's contract: re-evaluate the loss with gradients enabled inside a no-grad step."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


# What torch.optim.Optimizer sets on an instance besides defaults, state and param_groups: its hooks
# (torch's copies drop them: a hook may not pickle) and a name `_patch_step_function` sets again.
_TORCH_ATTRS = frozenset(
    {
        "_optimizer_step_pre_hooks",
        "_optimizer_step_post_hooks",
        "_optimizer_state_dict_pre_hooks",
        "_optimizer_state_dict_post_hooks",
        "_optimizer_load_state_dict_pre_hooks",
        "_optimizer_load_state_dict_post_hooks",
        "_zero_grad_profile_name",
    }
)


def copy_state(opt: torch.optim.Optimizer, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a copy of `opt` (``copy.deepcopy``, pickle, ``torch.save(opt)``) carries, for its
    ``__getstate__``: torch's three entries and every attribute the optimizer set on itself, but
    torch's hooks, functions patched onto the instance (an LR scheduler's or accelerate's ``step``
    wrapper: the copy would step the original) and `exclude` (caches its ``__setstate__`` rebuilds)."""
    state = dict(torch.optim.Optimizer.__getstate__(opt))
    for key, value in vars(opt).items():
        if key not in state and key not in _TORCH_ATTRS and key not in exclude and not callable(value):
            state[key] = value
    return state


def sums_of_squares(xs: TensorList) -> Tensor:
    """[len(xs)] tensor of Σx² per tensor. _foreach_norm is one fused kernel per dtype/device on
    GPU; squaring back is exact enough (fp32 relative error ~1e-7) and keeps each entry a sum of
    squares, so partial sums over shards add up under all-reduce."""
    return torch.stack(torch._foreach_norm(xs)).square()


def placed_state_value(group: dict[str, Any], param: Tensor, key: Any, value: Any) -> Any:
    """Where ``torch.optim.Optimizer.load_state_dict`` puts a loaded state value, for state written
    into ``opt.state`` by hand (a ZeRO partition's, a re-chosen AdamW implementation's): ``step``
    stays where it is unless `group` runs fused or capturable (their kernels read it on the
    parameter's device: a host ``step`` there is a host pointer handed to a CUDA kernel); anything
    else goes to the parameter's device, in its dtype when the parameter is floating point."""
    if not isinstance(value, Tensor):
        return value
    if key == "step":
        fused = group.get("fused") or group.get("capturable")
        return value.to(dtype=torch.float32, device=param.device) if fused else value
    if param.is_floating_point():
        return value.to(dtype=param.dtype, device=param.device)
    return value.to(device=param.device)


def place_loaded_state(opt: torch.optim.Optimizer) -> None:
    """Apply `placed_state_value` to every state value of `opt`, with each group's current flags."""
    for group in opt.param_groups:
        for p in group["params"]:
            state = opt.state.get(p)
            if state:
                opt.state[p] = {k: placed_state_value(group, p, k, v) for k, v in state.items()}
