"""Layer-wise trust-ratio optimizers LARS and LAMB, the baselines of CBP (docs/cbp.md), and their
records in the optimizer table (``orscale.registry``).

Per parameter tensor p (one block), gradient g, weight decay λ, step t:

LAMB (You et al. 2020, Alg. 2, with Adam's bias correction):
    m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;  u = m̂ / (√v̂ + ε)
    d = u + λ·p;  r = ‖p‖ / ‖d‖ (1 where either norm is 0);  p ← p − η·r·d
LARS (You et al. 2017, Alg. 1, SGD-style: the global η multiplies the momentum buffer, which equals
the paper's form for a constant η):
    r = η_tr·‖p‖ / (‖g‖ + λ‖p‖ + ε) (1 where either norm is 0);  d = r·(g + λ·p)
    b ← μ·b + d;  p ← p − η·b

Each group has a flag ``trust``: False gives the update without the ratio (r ≡ 1). Biases and norm
gains (1-D tensors) are conventionally excluded from both the ratio and the decay:
``trust_ratio_param_groups`` builds such groups. Like ``orscale.cbp.CBP``: no host sync, eager state,
step counts as Python ints, every norm of the step in ONE tensor of sums of squares through
``reduce_block_sums``, arithmetic on ``_local(t)``; a group with lr = 0 is skipped entirely.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, overload

import torch
from torch import Tensor

from orscale.errors import require_all
from orscale.optim_common import ParamsT, TensorList, call_closure, check_number, grad_of, sums_of_squares
from orscale.optimizer_spec import OptimizerSpec, elementwise_build, per_tensor_groups

if TYPE_CHECKING:
    from orscale.optim_config import OptimConfig


def trust_ratio_param_groups(named_params: Iterable[tuple[str, Tensor]], weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: tensors with ndim ≥ 2 (trust ratio, decay λ) and 1-D/0-D ones (biases, norm
    gains: no trust ratio, no decay). Empty groups are dropped."""
    mats: list[tuple[str, Tensor]] = []
    vecs: list[tuple[str, Tensor]] = []
    for name, p in named_params:
        (mats if p.ndim >= 2 else vecs).append((name, p))
    groups = [
        dict(params=mats, trust=True, weight_decay=weight_decay),
        dict(params=vecs, trust=False, weight_decay=0.0),
    ]
    return [g for g in groups if g["params"]]


def _ratio(num: Tensor, den: Tensor, w_norm: Tensor, other_norm: Tensor) -> Tensor:
    """num/den where both norms are > 0, else 1 (a zero-norm weight or update is left unscaled)."""
    ok = (w_norm > 0) & (other_norm > 0)
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.ones_like(num))


class _TrustRatioOptimizer(torch.optim.Optimizer):
    """Shared plumbing: eager state, named params, the sums hook, the two-phase step."""

    _state_keys: tuple[str, ...] = ()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            st = self.state[p]
            for key in self._state_keys:
                if key not in st:
                    st[key] = torch.zeros_like(p, dtype=torch.float32)
            st.setdefault("step", 0)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load, keeping fp32 state for low-precision params (torch casts it to the param dtype)."""
        super().load_state_dict(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for sid, p in zip(saved_ids, params, strict=True):
            saved = state_dict["state"].get(sid, {})
            for key in self._state_keys:
                value = saved.get(key)
                if isinstance(value, Tensor):
                    self.state[p][key] = value.to(device=p.device, dtype=torch.float32, copy=True)
                elif key not in self.state[p]:
                    self.state[p][key] = torch.zeros_like(p, dtype=torch.float32)
            self.state[p].setdefault("step", 0)

    def _local(self, t: Tensor) -> Tensor:
        """The tensor the arithmetic runs on (a DTensor's local shard in a sharded subclass)."""
        return t

    def reduce_block_sums(self, sums: Tensor) -> Tensor:
        """Hook for sharded execution: ``sums`` [n_blocks, 2] of local sums of squares (the two
        norms of each trust-ratio block); a sharded subclass all-reduces (SUM) it. Identity here."""
        return sums

    def _groups(self) -> list[tuple[dict[str, Any], list[Tensor]]]:
        out = []
        for group in self.param_groups:
            if group["lr"] == 0:  # host float: an lr = 0 step changes nothing
                continue
            ps = [p for p in group["params"] if p.grad is not None]
            if any(grad_of(p).is_sparse for p in ps):
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            if ps:
                out.append((group, ps))
        return out

    def _fp32(self, ts: Iterable[Tensor]) -> list[Tensor]:
        return [t if t.dtype == torch.float32 else t.float() for t in map(self._local, ts)]

    @staticmethod
    def _apply(params: TensorList, directions: TensorList, coef: TensorList) -> None:
        """p ← p + coef·d per tensor; coef are 0-d device tensors (no host sync)."""
        for p, d, k in zip(params, directions, coef, strict=True):
            if p.dtype == torch.float32:
                p.addcmul_(d, k)
            else:
                p.add_((d * k).to(p.dtype))

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = call_closure(closure)
        work = self._groups()
        if not work:
            return loss
        prepared = [self._prepare(group, ps) for group, ps in work]
        cols = [c for (g, _), (_, c) in zip(work, prepared, strict=True) if g["trust"] and c is not None]
        sums = self.reduce_block_sums(torch.cat(cols)) if cols else None
        row = 0
        for (group, ps), (dirs, _) in zip(work, prepared, strict=True):
            n = len(ps)
            if group["trust"] and sums is not None:
                norms = sums[row : row + n].clamp_min(0).sqrt()
                row += n
                r = self._trust(group, norms)
            else:
                r = torch.ones(n, dtype=torch.float32, device=dirs[0].device)
            self._finish(group, ps, dirs, r)
        return loss

    def _prepare(self, group: dict[str, Any], ps: list[Tensor]) -> tuple[TensorList, Tensor | None]:
        raise NotImplementedError

    def _trust(self, group: dict[str, Any], norms: Tensor) -> Tensor:
        raise NotImplementedError

    def _finish(self, group: dict[str, Any], ps: list[Tensor], dirs: TensorList, r: Tensor) -> None:
        raise NotImplementedError


class LAMB(_TrustRatioOptimizer):
    """LAMB: Adam direction plus decay λp, scaled per tensor by ‖p‖/‖u + λp‖ (see module doc)."""

    _state_keys = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        trust: bool = True,
    ) -> None:
        for name, value in (("lr", lr), ("weight_decay", weight_decay), ("eps", eps)):
            check_number(name, value)
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, trust=trust))

    def _prepare(self, group: dict[str, Any], ps: list[Tensor]) -> tuple[TensorList, Tensor | None]:
        (b1, b2), eps, wd = group["betas"], group["eps"], group["weight_decay"]
        states = [self.state[p] for p in ps]
        for st in states:
            st["step"] += 1
        steps = [st["step"] for st in states]
        grads = self._fp32(grad_of(p) for p in ps)
        m = [self._local(st["exp_avg"]) for st in states]
        v = [self._local(st["exp_avg_sq"]) for st in states]
        torch._foreach_lerp_(m, grads, 1.0 - b1)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, grads, grads, value=1.0 - b2)
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, [math.sqrt(1.0 - b2**t) for t in steps])
        torch._foreach_add_(denom, eps)  # √v̂ + ε
        d = torch._foreach_div(m, denom)
        torch._foreach_div_(d, [1.0 - b1**t for t in steps])  # u = m̂/(√v̂ + ε)
        weights = self._fp32(ps)
        if wd != 0:
            torch._foreach_add_(d, weights, alpha=wd)  # d = u + λp
        cols = torch.stack([sums_of_squares(weights), sums_of_squares(d)], dim=1) if group["trust"] else None
        return d, cols

    def _trust(self, group: dict[str, Any], norms: Tensor) -> Tensor:
        w, d = norms[:, 0], norms[:, 1]
        return _ratio(w, d, w, d)

    def _finish(self, group: dict[str, Any], ps: list[Tensor], dirs: TensorList, r: Tensor) -> None:
        self._apply([self._local(p) for p in ps], dirs, list((-group["lr"] * r).unbind(0)))


class LARS(_TrustRatioOptimizer):
    """LARS: SGD with momentum on r·(g + λp), r = η_tr‖p‖/(‖g‖ + λ‖p‖ + ε) (see module doc)."""

    _state_keys = ("momentum_buffer",)

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1.0,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 1e-3,
        eps: float = 1e-8,
        trust: bool = True,
    ) -> None:
        for name, value in (("lr", lr), ("weight_decay", weight_decay), ("eps", eps)):
            check_number(name, value)
        check_number("trust_coefficient", trust_coefficient, lambda x: x > 0, "> 0")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        super().__init__(
            params,
            dict(
                lr=lr,
                momentum=momentum,
                weight_decay=weight_decay,
                trust_coefficient=trust_coefficient,
                eps=eps,
                trust=trust,
            ),
        )

    def _prepare(self, group: dict[str, Any], ps: list[Tensor]) -> tuple[TensorList, Tensor | None]:
        for p in ps:
            self.state[p]["step"] += 1
        grads = self._fp32(grad_of(p) for p in ps)
        weights = self._fp32(ps)
        cols = torch.stack([sums_of_squares(weights), sums_of_squares(grads)], dim=1) if group["trust"] else None
        wd = group["weight_decay"]
        d = torch._foreach_add(grads, weights, alpha=wd) if wd != 0 else grads  # g + λp
        return d, cols

    def _trust(self, group: dict[str, Any], norms: Tensor) -> Tensor:
        w, g = norms[:, 0], norms[:, 1]
        den = g + group["weight_decay"] * w + group["eps"]
        return _ratio(group["trust_coefficient"] * w, den, w, g)

    def _finish(self, group: dict[str, Any], ps: list[Tensor], dirs: TensorList, r: Tensor) -> None:
        bufs = [self._local(self.state[p]["momentum_buffer"]) for p in ps]
        torch._foreach_mul_(bufs, group["momentum"])
        for b, d, k in zip(bufs, dirs, r.unbind(0), strict=True):
            b.addcmul_(d, k)  # b ← μb + r·(g + λp)
        params = [self._local(p) for p in ps]
        if all(p.dtype == torch.float32 for p in params):
            torch._foreach_add_(params, bufs, alpha=-group["lr"])
        else:
            for p, b in zip(params, bufs, strict=True):
                p.add_((b * -group["lr"]).to(p.dtype))


# ---------------------------------------------------------------- in the optimizer table (orscale.registry)
def _betas_ok(betas: list[float]) -> bool:
    return len(betas) == 2 and all(0 <= b < 1 for b in betas)


@dataclass
class LAMBOptions:
    """`optim.lamb`: LAMB's moments."""

    section: ClassVar[str] = "lamb"

    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8

    def __post_init__(self) -> None:
        require_all(
            [
                (_betas_ok(self.betas), f"optim.lamb.betas must be two numbers in [0, 1), got {self.betas}"),
                (0 < self.eps < math.inf, f"optim.lamb.eps must be > 0, got {self.eps}"),
            ]
        )


@dataclass
class LARSOptions:
    """`optim.lars`: LARS's momentum and trust coefficient η_tr."""

    section: ClassVar[str] = "lars"

    momentum: float = 0.95
    trust_coefficient: float = 1e-3
    eps: float = 1e-8

    def __post_init__(self) -> None:
        require_all(
            [
                (0 <= self.momentum < 1, f"optim.lars.momentum must be in [0, 1), got {self.momentum}"),
                (
                    0 < self.trust_coefficient < math.inf,
                    f"optim.lars.trust_coefficient must be > 0, got {self.trust_coefficient}",
                ),
                (0 < self.eps < math.inf, f"optim.lars.eps must be > 0, got {self.eps}"),
            ]
        )


def _lamb_kwargs(cfg: OptimConfig) -> dict[str, Any]:
    o = cfg.own(LAMBOptions)
    return dict(lr=cfg.lr, betas=(o.betas[0], o.betas[1]), eps=o.eps, weight_decay=cfg.weight_decay)


def _lars_kwargs(cfg: OptimConfig) -> dict[str, Any]:
    o = cfg.own(LARSOptions)
    return dict(
        lr=cfg.lr, momentum=o.momentum, weight_decay=cfg.weight_decay, trust_coefficient=o.trust_coefficient, eps=o.eps
    )


SPECS = (
    OptimizerSpec(
        names=("lamb",),
        routing="elementwise",
        build=elementwise_build(LAMB, _lamb_kwargs),
        labels={"lamb": "LAMB"},
        groups=per_tensor_groups,
        options=(LAMBOptions,),
    ),
    OptimizerSpec(
        names=("lars",),
        routing="elementwise",
        build=elementwise_build(LARS, _lars_kwargs),
        labels={"lars": "LARS"},
        groups=per_tensor_groups,
        options=(LARSOptions,),
    ),
)
