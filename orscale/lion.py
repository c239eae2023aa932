"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2) and its
record in the optimizer table (``orscale.registry``): `optim.name=lion`.

Per parameter p, gradient g, momentum m (fp32, zero at first), learning rate η, weight decay λ:

    u = sign(β1·m + (1−β1)·g)
    p ← p − η·(u + λ·p)        (decoupled decay: p·(1 − ηλ) − η·u)
    m ← β2·m + (1−β2)·g

Its defaults are the paper's, β = (0.9, 0.99); in a run it takes `optim.lr`, `optim.weight_decay` and
its own `optim.lion.betas` (the paper's by default). Every element moves by ±η, so
the paper runs it at an LR 3–10× below AdamW's and a decay as much larger. It routes like LAMB and
LARS: every parameter, decay on tensors of 2 or more dims only (``per_tensor_groups``).

Elementwise with no norms: like ``orscale.cbp.CBP``, the arithmetic runs on ``_local(t)``, so its
FSDP2 subclass (``orscale.distributed.elementwise.sharded_class``) updates each rank's shard with no
collective at all. No host sync; state is created eagerly; a group with lr = 0 is skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, overload

import torch
from torch import Tensor

from orscale.errors import require_all
from orscale.optim_common import ParamsT, call_closure, check_number, grad_of
from orscale.optimizer_spec import OptimizerSpec, elementwise_build, per_tensor_groups

if TYPE_CHECKING:
    from orscale.optim_config import OptimConfig


class Lion(torch.optim.Optimizer):
    """Lion: the sign of an interpolated momentum, decoupled weight decay (see the module doc).

    Params may be plain tensors, ``(name, tensor)`` pairs or param-group dicts; ``lr``,
    ``betas`` and ``weight_decay`` can be overridden per group. ``lr`` must stay a Python float."""

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ) -> None:
        check_number("lr", lr)
        check_number("weight_decay", weight_decay)
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        for p in self.param_groups[-1]["params"]:
            self.state[p].setdefault("exp_avg", torch.zeros_like(p, dtype=torch.float32))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load, keeping the momentum in fp32 for low-precision params (torch casts it to theirs)."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            for p in group["params"]:
                m = self.state[p].get("exp_avg")
                self.state[p]["exp_avg"] = (
                    torch.zeros_like(p, dtype=torch.float32) if m is None else m.to(torch.float32, copy=True)
                )

    def _local(self, t: Tensor) -> Tensor:
        """The tensor the arithmetic runs on (a DTensor's local shard in the sharded subclass)."""
        return t

    def reduce_block_sums(self, sums: Tensor) -> Tensor:
        """The sharded subclass's hook for per-tensor norms: Lion has none, so it is never called."""
        return sums

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = call_closure(closure)
        for group in self.param_groups:
            ps = [p for p in group["params"] if p.grad is not None]
            if group["lr"] == 0 or not ps:  # host float: an lr = 0 step changes nothing
                continue
            if any(grad_of(p).is_sparse for p in ps):
                raise RuntimeError("Lion does not support sparse gradients")
            (b1, b2), lr, wd = group["betas"], group["lr"], group["weight_decay"]
            grads = [g if g.dtype == torch.float32 else g.float() for g in (self._local(grad_of(p)) for p in ps)]
            m = [self._local(self.state[p]["exp_avg"]) for p in ps]
            u = torch._foreach_lerp(m, grads, 1.0 - b1)  # β1·m + (1−β1)·g
            torch._foreach_sign_(u)
            params = [self._local(p) for p in ps]
            for p, d in zip(params, u, strict=True):
                if p.dtype == torch.float32:
                    if wd != 0:
                        p.mul_(1.0 - lr * wd)
                    p.add_(d, alpha=-lr)
                else:  # low-precision weights: the step in fp32, rounded once
                    p.copy_(p.float().mul_(1.0 - lr * wd).add_(d, alpha=-lr))
            torch._foreach_lerp_(m, grads, 1.0 - b2)  # m ← β2·m + (1−β2)·g
        return loss


@dataclass
class LionOptions:
    """`optim.lion`: Lion's two interpolation factors (the paper's by default)."""

    section: ClassVar[str] = "lion"

    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])

    def __post_init__(self) -> None:
        require_all(
            [
                (
                    len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
                    f"optim.lion.betas must be two numbers in [0, 1), got {self.betas}",
                )
            ]
        )


def _kwargs(cfg: OptimConfig) -> dict[str, Any]:
    betas = cfg.own(LionOptions).betas
    return dict(lr=cfg.lr, betas=(betas[0], betas[1]), weight_decay=cfg.weight_decay)


SPECS = (
    OptimizerSpec(
        names=("lion",),
        routing="elementwise",
        build=elementwise_build(Lion, _kwargs),
        labels={"lion": "Lion"},
        groups=per_tensor_groups,
        options=(LionOptions,),
    ),
)
