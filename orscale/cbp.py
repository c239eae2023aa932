"""Conditioned Backpropagation (CBP, docs/cbp.md): the optimizer half, M1 and M3.

Per parameter tensor l (one block), gradient g_l, step t = 1, 2, … (all in fp32):

    M1  s_l = clip(c / √q_l, s_min, s_max),  c = (mean_j q_j)^½     from the stored q (through t−1);
        s_l = 1 at t = 1.  Then q_l ← ρ·q_l + (1−ρ)·‖g_l‖²  (the energy estimate for the next step).
        g̃_l = s_l·g_l
        m ← β1·m + (1−β1)·g̃;  m̂ = m / (1 − β1^t)
    M3  θ ← θ − η·m̂ / (√v̂_{t−1} + ζ),  v̂_{t−1} = v_{t−1} / (1 − β2^{t−1});  P_1 = I, i.e. θ ← θ − η·m̂
        at t = 1.  Then v ← β2·v + (1−β2)·g̃²  (the second moment for the next step).

Both statistics are read before they are refreshed (the paper's one-step lag, which makes the
step-t operator a function of the past only). M2, activation centring, is a reparameterisation of
the model, not of the update: ``models.centered_linear.CenteredLinear``.

Switches (the paper's ablations, Tables 6/7): ``equalize=False`` gives s ≡ 1; ``precondition=False``
gives P ≡ I, i.e. the bias-corrected heavy-ball base ``θ ← θ − η·m̂`` (no v is kept). With both off
and β1 = 0 the step is plain SGD.

q starts at 0 and is not bias-corrected: c/√q_l is invariant to a factor common to all q, so the
(1 − ρ^t) correction would cancel. A block with q = 0 (no gradient energy seen yet) gets s = 1 and
is left out of c's mean; at t = 1 every q is 0, which yields the paper's s ≡ 1 without a host branch.
c is taken over the blocks of one param group that have a gradient at this step (put blocks that
should not share a target, or should not be equalised at all, in their own group).

The step never syncs with the host: scales stay on the device, step counts are Python ints, and
every block norm of the step goes through ``reduce_block_sums`` in ONE tensor of sums of squares (a
sharded subclass all-reduces partial sums there; arithmetic runs on ``_local(t)``, a DTensor's local
shard in such a subclass). State is created eagerly; a param group whose ``lr`` is 0 is skipped
entirely (nothing changes: weights, moments, q, step), so a checkpoint helper's zero-gradient,
lr = 0 dry-run step is a no-op.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, overload

import torch
from torch import Tensor

from orscale.optim_common import ParamsT, TensorList, call_closure, check_number, grad_of, sums_of_squares


def mean_energy(q: Tensor) -> Tensor:
    """c² of M1: the mean of the block energies `q` [n] over the blocks with q > 0 (0 if none)."""
    has = q > 0
    return torch.where(has, q, torch.zeros_like(q)).sum() / has.sum().clamp_min(1)


def equalization_scales(q: Tensor, s_min: float, s_max: float, c2: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """M1 scales (raw c/√q_l, clipped) for block energies ``q`` [n]; blocks with q = 0 get 1.

    c² is the mean of q over the blocks with q > 0 (all of them once every block has seen a
    gradient), so this is eq. (6) of the paper; no tensor value steers Python control flow. ``c2``
    given: that mean, taken over more blocks than ``q`` holds (owner-rank execution under ZeRO).
    """
    has = q > 0
    if c2 is None:
        c2 = mean_energy(q)
    ratio = torch.where(has, c2 / torch.where(has, q, torch.ones_like(q)), torch.ones_like(q))
    raw = ratio.sqrt()
    return raw, torch.where(has, raw.clamp(s_min, s_max), torch.ones_like(q))


@dataclass
class _Work:
    """The params of one group that have a gradient at this step (lr > 0 groups only)."""

    group: dict[str, Any]
    params: list[Tensor]
    names: list[str]


class CBP(torch.optim.Optimizer):
    """Conditioned-Backpropagation update (M1 block equalisation + M3 damped lagged preconditioner).

    Params may be plain tensors, ``(name, tensor)`` pairs (e.g. ``model.named_parameters()``;
    torch keeps the names in the group key ``param_names``) or param-group dicts; every keyword
    below can be overridden per group. ``lr`` must stay a Python float. Weight decay is not part
    of the paper (default 0): decoupled multiplies θ by (1 − ηλ) before the update; coupled adds
    λθ to the raw gradient (so it enters the block norms and both moments, as an L2 term would).
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        decoupled_weight_decay: bool = True,
        zeta: float = 1e-3,
        rho: float = 0.99,
        s_min: float = 0.1,
        s_max: float = 4.0,
        equalize: bool = True,
        precondition: bool = True,
    ) -> None:
        check_number("lr", lr)
        check_number("weight_decay", weight_decay)
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if zeta <= 0:
            raise ValueError(f"zeta (damping) must be > 0, got {zeta}")
        if not 0 <= rho < 1:
            raise ValueError(f"rho must be in [0, 1), got {rho}")
        if not 0 < s_min <= s_max:
            raise ValueError(f"need 0 < s_min <= s_max, got s_min={s_min}, s_max={s_max}")
        self._last_diag: list[tuple[Tensor, Tensor, Tensor, float, float]] = []
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            weight_decay=weight_decay,
            decoupled_weight_decay=decoupled_weight_decay,
            zeta=zeta,
            rho=rho,
            s_min=s_min,
            s_max=s_max,
            equalize=equalize,
            precondition=precondition,
        )
        super().__init__(params, defaults)

    # ---------------------------------------------------------------- groups, state
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        self._init_state(self.param_groups[-1])

    def _init_state(self, group: dict[str, Any]) -> None:
        """Eager state: fp32 first (and, with M3, second) moment, q = 0 (0-d fp32), step = 0."""
        for p in group["params"]:
            st = self.state[p]
            if "exp_avg" not in st:
                st["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
            if group["precondition"] and "exp_avg_sq" not in st:
                st["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
            if "q" not in st:
                st["q"] = torch.zeros((), dtype=torch.float32, device=p.device)
            st.setdefault("step", 0)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load, then undo torch's cast of floating state to the param dtype (bf16 params would
        otherwise get bf16 moments), and re-create any state the checkpoint lacks."""
        super().load_state_dict(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for sid, p in zip(saved_ids, params, strict=True):
            saved = state_dict["state"].get(sid, {})
            for key in ("exp_avg", "exp_avg_sq", "q"):
                value = saved.get(key)
                if isinstance(value, Tensor):
                    self.state[p][key] = value.to(device=p.device, dtype=torch.float32, copy=True)
        for group in self.param_groups:
            self._init_state(group)

    def _local(self, t: Tensor) -> Tensor:
        """The tensor the step's arithmetic runs on: `t` itself here; a DTensor's local shard in a
        sharded subclass (so elementwise math never triggers DTensor collectives)."""
        return t

    def reduce_block_sums(self, sums: Tensor) -> Tensor:
        """Hook for sharded execution: ``sums`` [n_blocks] holds each block's local sum of squares
        of its gradient (over this rank's shard); a sharded subclass all-reduces (SUM) it. Identity."""
        return sums

    # ---------------------------------------------------------------- the step
    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = call_closure(closure)
        work = self._active_work()
        self._last_diag = []
        if not work:
            return loss
        grads = [self._grads(w) for w in work]
        eq = [g for w, g in zip(work, grads, strict=True) if w.group["equalize"]]
        sums = None
        if eq:  # host flags only: every rank makes the same decision
            local = torch.cat([sums_of_squares(g) for g in eq])
            sums = self.reduce_block_sums(local)
        row, pooled = 0, self._pooled_targets(work)
        for w, g in zip(work, grads, strict=True):
            if w.group["equalize"] and sums is not None:
                n = len(g)
                s = self._equalize(w, sums[row : row + n], pooled.get(id(w.group)))
                row += n
                g = torch._foreach_mul(g, list(s.unbind(0)))  # g̃_l = s_l·g_l (0-d device scalars)
            self._update(w, g)
        return loss

    def _active_work(self) -> list[_Work]:
        work = []
        for gi, group in enumerate(self.param_groups):
            if group["lr"] == 0:  # host float: an lr = 0 step changes nothing (see module doc)
                continue
            names = group.get("param_names") or [f"group{gi}.param{i}" for i in range(len(group["params"]))]
            pos = [i for i, p in enumerate(group["params"]) if p.grad is not None]
            for i in pos:
                if grad_of(group["params"][i]).is_sparse:
                    raise RuntimeError(f"CBP: sparse gradient for '{names[i]}'")
            if pos:
                work.append(_Work(group, [group["params"][i] for i in pos], [names[i] for i in pos]))
        return work

    def _grads(self, w: _Work) -> TensorList:
        """Local fp32 gradients; coupled weight decay folded in (new tensors: p.grad is not touched)."""
        local = [self._local(grad_of(p)) for p in w.params]
        grads: TensorList = [g if g.dtype == torch.float32 else g.float() for g in local]
        wd = w.group["weight_decay"]
        if wd != 0 and not w.group["decoupled_weight_decay"]:
            grads = torch._foreach_add(grads, self._fp32_params(w), alpha=wd)
        return grads

    def _fp32_params(self, w: _Work) -> list[Tensor]:
        return [p if p.dtype == torch.float32 else p.float() for p in map(self._local, w.params)]

    def _pooled_targets(self, work: list[_Work]) -> dict[int, Tensor]:
        """{id(group): c²} for the equalising groups that share a `role` with another (the embedding
        split from the matrices for a learning rate of its own): one target over all their blocks,
        from the stored (lagged) q, in group order, before any q moves. Other groups: their own."""
        by_role: dict[Any, list[_Work]] = {}
        for w in work:
            if w.group["equalize"] and w.group.get("c2_global") is None and "role" in w.group:
                by_role.setdefault(w.group["role"], []).append(w)
        out = {}
        for shared in (ws for ws in by_role.values() if len(ws) > 1):
            c2 = mean_energy(torch.stack([self.state[p]["q"] for w in shared for p in w.params]))
            out.update({id(w.group): c2 for w in shared})
        return out

    def _equalize(self, w: _Work, sq: Tensor, pooled: Tensor | None = None) -> Tensor:
        """M1: scales from the stored q (lagged), then q ← ρq + (1−ρ)‖g‖²; returns s [n]."""
        g = w.group
        qs = [self.state[p]["q"] for p in w.params]
        q = torch.stack(qs)
        # "c2_global": the role's mean energy over every rank's blocks, set by a distributed driver
        # that hands this optimizer only some of the role's blocks (orscale.distributed.zero).
        c2 = g.get("c2_global")
        raw, s = equalization_scales(q, g["s_min"], g["s_max"], c2 if c2 is not None else pooled)
        torch._foreach_copy_(qs, list((q * g["rho"] + sq * (1.0 - g["rho"])).unbind(0)))
        self._last_diag.append((raw, s, sq, g["s_min"], g["s_max"]))
        return s

    def _update(self, w: _Work, g: TensorList) -> None:
        """m, the (M3-preconditioned) update with the lagged v̂, then v."""
        group = w.group
        lr, (b1, b2), zeta, wd = group["lr"], group["betas"], group["zeta"], group["weight_decay"]
        states = [self.state[p] for p in w.params]
        params = [self._local(p) for p in w.params]
        m = [self._local(st["exp_avg"]) for st in states]
        steps = []
        for st in states:
            st["step"] += 1
            steps.append(st["step"])
        torch._foreach_lerp_(m, g, 1.0 - b1)  # m ← β1·m + (1−β1)·g̃
        if wd != 0 and group["decoupled_weight_decay"]:
            torch._foreach_mul_(params, 1.0 - lr * wd)
        coef = [-lr / (1.0 - b1**t) for t in steps]  # −η/(1−β1^t): m̂ folded into the step
        if not group["precondition"]:
            self._add(params, torch._foreach_mul(m, coef))
            return
        v = [self._local(st["exp_avg_sq"]) for st in states]
        later = [i for i, t in enumerate(steps) if t > 1]  # host ints; t = 1 uses P_1 = I
        first = [i for i, t in enumerate(steps) if t == 1]
        if later:
            denom = torch._foreach_sqrt([v[i] for i in later])
            torch._foreach_div_(denom, [math.sqrt(1.0 - b2 ** (steps[i] - 1)) for i in later])
            torch._foreach_add_(denom, zeta)  # √v̂_{t−1} + ζ
            upd = torch._foreach_div([m[i] for i in later], denom)
            torch._foreach_mul_(upd, [coef[i] for i in later])
            self._add([params[i] for i in later], upd)
        if first:
            self._add([params[i] for i in first], torch._foreach_mul([m[i] for i in first], [coef[i] for i in first]))
        torch._foreach_mul_(v, b2)  # v ← β2·v + (1−β2)·g̃², after the update (the lag)
        torch._foreach_addcmul_(v, g, g, value=1.0 - b2)

    @staticmethod
    def _add(params: TensorList, updates: TensorList) -> None:
        if all(p.dtype == torch.float32 for p in params):
            torch._foreach_add_(params, updates)
        else:  # low-precision params: add the fp32 update tensor by tensor
            for p, u in zip(params, updates, strict=True):
                p.add_(u.to(p.dtype))

    # ---------------------------------------------------------------- diagnostics
    def diagnostics(self) -> dict[str, float]:
        """M1 summary of the latest step (one device→host transfer; {} if nothing was equalised).

        ``s_mean``, ``s_min_frac`` / ``s_max_frac`` (blocks whose raw c/√q was clipped),
        ``s_spread`` (max s / min s), ``grad_disparity`` (max/min block ‖g‖ this step) and
        ``eq_disparity`` (the same for s·‖g‖). Blocks without statistics yet count as unclipped.
        """
        stats = self.diagnostic_stats()
        return summarize_cbp([stats]) if stats else {}

    def diagnostic_stats(self) -> list[float]:
        """[blocks, Σs, #clipped low, #clipped high, max s, min s, max ‖g‖, min ‖g‖>0, max s‖g‖,
        min s‖g‖>0] of the latest step ([] if nothing was equalised): what `summarize_cbp` merges
        across ranks that each hold some blocks (ZeRO owners)."""
        if not self._last_diag:
            return []
        rows = []
        for raw, s, sq, lo, hi in self._last_diag:
            g = sq.clamp_min(0).sqrt()
            e = s * g
            rows.append(
                torch.stack(
                    [
                        s.new_tensor(float(s.numel())),
                        s.sum(),
                        (raw <= lo).float().sum(),
                        (raw >= hi).float().sum(),
                        s.max(),
                        s.min(),
                        g.max(),
                        torch.where(g > 0, g, torch.full_like(g, math.inf)).min(),
                        e.max(),
                        torch.where(e > 0, e, torch.full_like(e, math.inf)).min(),
                    ]
                )
            )
        vals = torch.stack(rows).tolist()  # the one transfer
        return [
            sum(r[0] for r in vals),
            sum(r[1] for r in vals),
            sum(r[2] for r in vals),
            sum(r[3] for r in vals),
            max(r[4] for r in vals),
            min(r[5] for r in vals),
            max(r[6] for r in vals),
            min(r[7] for r in vals),
            max(r[8] for r in vals),
            min(r[9] for r in vals),
        ]


def summarize_cbp(parts: list[list[float]]) -> dict[str, float]:
    """`diag/cbp/...` from one or more `CBP.diagnostic_stats()` lists (empty ones ignored)."""
    parts = [p for p in parts if p]
    if not parts:
        return {}
    n = sum(p[0] for p in parts)
    g_min, e_min = min(p[7] for p in parts), min(p[9] for p in parts)
    return {
        "diag/cbp/s_mean": sum(p[1] for p in parts) / n,
        "diag/cbp/s_min_frac": sum(p[2] for p in parts) / n,
        "diag/cbp/s_max_frac": sum(p[3] for p in parts) / n,
        "diag/cbp/s_spread": max(p[4] for p in parts) / min(p[5] for p in parts),
        "diag/cbp/grad_disparity": max(p[6] for p in parts) / g_min if math.isfinite(g_min) else math.nan,
        "diag/cbp/eq_disparity": max(p[8] for p in parts) / e_min if math.isfinite(e_min) else math.nan,
    }


def share_equalization_targets(
    owner: CBP | None, roles: list[str], all_reduce: Callable[[Tensor], Tensor], device: torch.device
) -> None:
    """CBP's c² per param group (mean energy over the group's blocks with q > 0) when the blocks are
    spread over ranks that each run a CBP on theirs (ZeRO owners): one all-reduce of (sum, count)
    per role, called on EVERY rank (`owner` None where a rank holds no blocks); sets `c2_global` on
    the owner's groups, which `step` then uses instead of its own blocks' mean."""
    stats = torch.zeros(len(roles), 2, dtype=torch.float32, device=device)
    if owner is not None:
        for group in owner.param_groups:
            q = torch.stack([owner.state[p]["q"] for p in group["params"]])
            # += : groups of one role (the embedding split from the matrices) share one target
            stats[roles.index(group["role"])] += torch.stack([torch.where(q > 0, q, 0).sum(), (q > 0).sum()])
    all_reduce(stats)
    if owner is not None:
        for group in owner.param_groups:
            total, count = stats[roles.index(group["role"])].unbind(0)
            group["c2_global"] = total / count.clamp_min(1)
