"""The Muon family's elementwise work around Newton–Schulz as four passes over memory (docs/gpu.md):

    A  M ← μM + G in place; M̂ = μM + G; ‖M̂‖, ‖G‖         reads M, G; writes M, M̂      (16 B/element)
    B  X = M̂ / (scale·‖M̂‖ + ε) in the NS dtype             reads M̂; writes X            (6 B with bf16 X)
       ... Newton–Schulz iterations on X (matmuls) ...
    C  ‖W‖², ‖Q‖², ‖λW + sQ‖², ⟨W,Q⟩                         reads W, Q                    (6 B with bf16 Q)
    D  W ← W + k·(λW + sQ)  (coupled)  or  W ← (1−ηλ)W + k·Q   reads W, Q; writes W         (10 B)

Each pass is a custom operator (``torch.library``): on CUDA its body runs compiled (torch.compile
fuses it into kernels that read each input once), elsewhere eager, op by op, the same arithmetic
as the step had before these passes existed (fp32 throughout; Q upcast where it is read). Being one
operator each, a pass is also one entry in `bench/op_bytes.py`'s count of memory traffic, as one
kernel would be. Q is read in the NS dtype (bf16: no fp32 copy of it), and the direction D is
formed where it is used instead of being stored. The optimizer's state is untouched: one fp32
momentum buffer per parameter, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger("orscale")


# ---------------------------------------------------------------- the passes' bodies (eager)
def _momentum(
    bufs: list[Tensor], grads: list[Tensor], mu: float, nesterov: bool, mhat_norm: bool, grad_norm: bool
) -> tuple[list[Tensor], Tensor]:
    m_hats, mhat_norms, grad_norms = [], [], []
    zero = torch.zeros((), dtype=torch.float32, device=bufs[0].device)
    for m, g in zip(bufs, grads, strict=True):
        m.mul_(mu).add_(g)
        if nesterov:
            m_hats.append(m * mu + g)
        mhat_norms.append(torch.linalg.vector_norm(m_hats[-1] if nesterov else m) if mhat_norm else zero)
        grad_norms.append(torch.linalg.vector_norm(g) if grad_norm else zero)
    return m_hats, torch.stack([torch.stack(mhat_norms), torch.stack(grad_norms)], dim=1)


def _normalise(
    m_hats: list[Tensor], norms: Tensor, tall: list[bool], scale: float, eps: float, dtype: torch.dtype
) -> Tensor:
    rows, cols = sorted(m_hats[0].shape)
    x = torch.empty(len(m_hats), rows, cols, dtype=dtype, device=m_hats[0].device)
    for i, (m, t) in enumerate(zip(m_hats, tall, strict=True)):
        # fp32 division, then the cast into the bucket (out= computes in fp32 and rounds on store)
        torch.div(m.mT if t else m, scale * norms[i] + eps, out=x[i])
    return x


def _update_norms(ws: list[Tensor], qs: list[Tensor], s: list[float], wd: float, want: list[bool]) -> Tensor:
    zero = torch.zeros((), dtype=torch.float32, device=ws[0].device)
    rows = []
    for w, q, si in zip(ws, qs, s, strict=True):
        q = q.float()
        rows.append(
            torch.stack(
                [
                    torch.linalg.vector_norm(w).square() if want[0] else zero,
                    torch.linalg.vector_norm(q).square() if want[1] else zero,
                    torch.linalg.vector_norm(_direction(w, q, si, wd)).square() if want[2] else zero,
                    (w * q).sum() if want[3] else zero,
                ]
            )
        )
    return torch.stack(rows)


def _direction(w: Tensor, q: Tensor, s: float, wd: float) -> Tensor:
    """D = sQ + λW (fp32), the coupled update direction."""
    d = q.float() * s
    return d.add_(w, alpha=wd) if wd != 0 else d


def _apply(
    params: list[Tensor], qs: list[Tensor], coef: Tensor, s: list[float], wd: float, keep: float, coupled: bool
) -> None:
    for i, (p, q, si) in enumerate(zip(params, qs, s, strict=True)):
        if coupled:  # W += k·(λW + sQ), the decay inside the trust-scaled step
            p.addcmul_(_direction(p if p.dtype == torch.float32 else p.float(), q, si, wd), coef[i])
        else:  # W ← (1 − ηλ)·W, then W += k·Q
            if keep != 1.0:
                p.mul_(keep)
            p.addcmul_(q, coef[i])


# ---------------------------------------------------------------- compiled on CUDA
_COMPILED: dict[Callable, Callable] = {}
_FAILED: set[str] = set()


def _run(fn: Callable, compiled: bool, *args: Any) -> Any:
    """`fn(*args)`, compiled when asked (and when compiling it worked before); a pass whose compile
    fails runs eager from then on, with one warning."""
    if not compiled or fn.__name__ in _FAILED:
        return fn(*args)
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, dynamic=False)
    try:
        return _COMPILED[fn](*args)
    except Exception as err:  # a machine without Triton or a C compiler: the eager pass is the same arithmetic
        _FAILED.add(fn.__name__)
        log.warning("Muon-family pass %s could not be compiled (%s): it runs eager", fn.__name__, type(err).__name__)
        return fn(*args)


# ---------------------------------------------------------------- the operators
@torch.library.custom_op("orscale::momentum_pass", mutates_args=("bufs",))
def momentum_pass(
    bufs: list[Tensor], grads: list[Tensor], mu: float, nesterov: bool, mhat_norm: bool, grad_norm: bool, compiled: bool
) -> tuple[list[Tensor], Tensor]:
    """A: M ← μM + G in place; returns (M̂ = μM + G, or [] without Nesterov (M̂ is M), and [n, 2]
    fp32 norms ‖M̂‖, ‖G‖ where asked, zeros elsewhere)."""
    return _run(_momentum, compiled, bufs, grads, mu, nesterov, mhat_norm, grad_norm)


@momentum_pass.register_fake
def _(bufs, grads, mu, nesterov, mhat_norm, grad_norm, compiled):
    return [torch.empty_like(m) for m in bufs] if nesterov else [], bufs[0].new_empty(len(bufs), 2)


@torch.library.custom_op("orscale::normalise_pass", mutates_args=())
def normalise_pass(
    m_hats: list[Tensor], norms: Tensor, tall: list[bool], scale: float, eps: float, dtype: torch.dtype, compiled: bool
) -> Tensor:
    """B: the Newton–Schulz input of one bucket, [k, min(m,n), max(m,n)] in `dtype`: each M̂ divided
    by scale·‖M̂‖ + eps (`norms` [k]), tall ones transposed into the wide orientation."""
    return _run(_normalise, compiled, m_hats, norms, tall, scale, eps, dtype)


@normalise_pass.register_fake
def _(m_hats, norms, tall, scale, eps, dtype, compiled):
    rows, cols = sorted(m_hats[0].shape)
    return m_hats[0].new_empty(len(m_hats), rows, cols, dtype=dtype)


@torch.library.custom_op("orscale::update_norms_pass", mutates_args=())
def update_norms_pass(
    ws: list[Tensor], qs: list[Tensor], s: list[float], wd: float, want: list[bool], compiled: bool
) -> Tensor:
    """C: [n, 4] fp32 sums over each matrix (partial sums over a shard's rows add up): ‖W‖², ‖Q‖²,
    ‖λW + sQ‖², ⟨W,Q⟩, each where `want` asks for it (zeros elsewhere)."""
    return _run(_update_norms, compiled, ws, qs, s, wd, want)


@update_norms_pass.register_fake
def _(ws, qs, s, wd, want, compiled):
    return ws[0].new_empty(len(ws), 4, dtype=torch.float32)


@torch.library.custom_op("orscale::apply_pass", mutates_args=("params",))
def apply_pass(
    params: list[Tensor],
    qs: list[Tensor],
    coef: Tensor,
    s: list[float],
    wd: float,
    keep: float,
    coupled: bool,
    compiled: bool,
) -> None:
    """D: coupled: W += coef·(λW + sQ); decoupled: W ← keep·W + coef·Q (`coef` [n] on the device)."""
    _run(_apply, compiled, params, qs, coef, s, wd, keep, coupled)


@apply_pass.register_fake
def _(params, qs, coef, s, wd, keep, coupled, compiled):
    return None
