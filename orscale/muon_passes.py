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

A compiled body gets its scalar hyper-parameters (μ, λ, 1 − ηλ, the normalisation's scale and ε) as
0-d fp32 tensors on the pass's device, not as numbers baked into the graph: an LR schedule then
reuses one graph per shape instead of compiling one per step. Inside a caller's own torch.compile
(a training step that calls ``opt.step()``) the bodies are traced into the caller's graph instead of
being called as operators. Indexing: the bodies are plain torch ops, so 64-bit sizes need nothing
here: eager ATen kernels split or use 64-bit offsets themselves, and inductor's generated kernels
use 64-bit indices (its C++ loops always; Triton wherever a numel or buffer passes 2³¹ − 1).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch._dynamo.exc import TorchDynamoException

log = logging.getLogger("orscale")

# A scalar hyper-parameter as a body gets it: a host float eager, a 0-d fp32 tensor compiled.
Scalar = float | Tensor


# ---------------------------------------------------------------- the passes' bodies
def _momentum(
    bufs: list[Tensor], grads: list[Tensor], mu: Scalar, nesterov: bool, mhat_norm: bool, grad_norm: bool
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
    m_hats: list[Tensor], norms: Tensor, tall: list[bool], scale: Scalar, eps: Scalar, dtype: torch.dtype
) -> Tensor:
    rows, cols = sorted(m_hats[0].shape)
    x = torch.empty(len(m_hats), rows, cols, dtype=dtype, device=m_hats[0].device)
    for i, (m, t) in enumerate(zip(m_hats, tall, strict=True)):
        # fp32 division, then the cast into the bucket (out= computes in fp32 and rounds on store)
        torch.div(m.mT if t else m, scale * norms[i] + eps, out=x[i])
    return x


def _update_norms(ws: list[Tensor], qs: list[Tensor], s: list[float], wd: Scalar, want: list[bool]) -> Tensor:
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


def _direction(w: Tensor, q: Tensor, s: float, wd: Scalar) -> Tensor:
    """D = sQ + λW (fp32), the coupled update direction."""
    d = q.float() * s
    if isinstance(wd, Tensor):  # compiled: alpha= takes host numbers only; λ = 0 adds zeros
        return d.add_(w * wd)
    return d.add_(w, alpha=wd) if wd != 0 else d


def _apply(
    params: list[Tensor], qs: list[Tensor], coef: Tensor, s: list[float], wd: Scalar, keep: Scalar, coupled: bool
) -> None:
    for i, (p, q, si) in enumerate(zip(params, qs, s, strict=True)):
        if coupled:  # W += k·(λW + sQ), the decay inside the trust-scaled step
            p.addcmul_(_direction(p if p.dtype == torch.float32 else p.float(), q, si, wd), coef[i])
        else:  # W ← (1 − ηλ)·W, then W += k·Q
            if isinstance(keep, Tensor) or keep != 1.0:  # compiled: keep = 1 multiplies exactly
                p.mul_(keep)
            p.addcmul_(q, coef[i])


# ---------------------------------------------------------------- compiled on CUDA
# The torch.compile backend of the bodies (tests give one of their own that counts the graphs).
BACKEND: str | Callable[..., Any] = "inductor"
_COMPILED: dict[Callable, Callable] = {}
_FAILED: set[str] = set()


def failed_passes() -> list[str]:
    """The passes whose compile failed in this process (they run eager, and warned once)."""
    return sorted(_FAILED)


def _run(fn: Callable, compiled: bool, *args: Any) -> Any:
    """`fn(*args)`, compiled when asked (and when compiling it worked before). Compiled, each number
    in `args` arrives as a 0-d fp32 tensor on the pass's device, so a new value reuses the graph
    (lists of numbers, the per-matrix shape factors, stay constants: they come with the shapes).

    Only a failed compile runs the pass eager instead, from then on, with one warning: fullgraph
    makes the body one graph, compiled whole before any of it runs, so nothing was written yet.
    An error while the compiled pass runs (out of memory among them) propagates: the pass may have
    written its buffers and weights, and running it again would apply it twice."""
    if not compiled or fn.__name__ in _FAILED:
        return fn(*args)
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, dynamic=False, fullgraph=True, backend=BACKEND)
    device = next(t.device for a in args for t in (a if isinstance(a, list) else [a]) if isinstance(t, Tensor))
    scalars = [_device_scalar(a, device) for a in args]
    try:
        return _COMPILED[fn](*scalars)
    except TorchDynamoException as err:  # a machine without Triton or a C compiler, a body it cannot trace
        oom = _out_of_memory(err)
        if oom is not None:  # the compile ran out of memory: the caller's to handle, as a step's would be
            raise oom from err
        _FAILED.add(fn.__name__)
        log.warning("Muon-family pass %s could not be compiled (%s): it runs eager", fn.__name__, type(err).__name__)
    return fn(*args)


def _device_scalar(value: Any, device: torch.device) -> Any:
    """A number as a 0-d fp32 tensor on `device` (a fill, not a host→device copy); anything else as is."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.full((), value, dtype=torch.float32, device=device)
    return value


def _out_of_memory(err: BaseException) -> torch.OutOfMemoryError | None:
    """The out-of-memory error among `err`'s causes, if any."""
    chain: list[BaseException] = []
    cause: BaseException | None = err
    while cause is not None and cause not in chain:
        if isinstance(cause, torch.OutOfMemoryError):
            return cause
        chain.append(cause)
        cause = cause.__cause__ or getattr(cause, "inner_exception", None)
    return None


def _traced_or_op(body: Callable, op: Callable, *args: Any) -> Any:
    """`op(*args)`; inside a caller's torch.compile, `body` traced into the caller's graph instead
    (its fusion is the caller's compiler's; `args`' last, the pass's own compile flag, is dropped)."""
    if torch.compiler.is_compiling():
        return body(*args[:-1])
    return op(*args)


# ---------------------------------------------------------------- the operators
@torch.library.custom_op("orscale::momentum_pass", mutates_args=("bufs",))
def _momentum_op(
    bufs: list[Tensor], grads: list[Tensor], mu: float, nesterov: bool, mhat_norm: bool, grad_norm: bool, compiled: bool
) -> tuple[list[Tensor], Tensor]:
    return _run(_momentum, compiled, bufs, grads, mu, nesterov, mhat_norm, grad_norm)


@_momentum_op.register_fake
def _(bufs, grads, mu, nesterov, mhat_norm, grad_norm, compiled):
    return [torch.empty_like(m) for m in bufs] if nesterov else [], bufs[0].new_empty(len(bufs), 2)


def momentum_pass(
    bufs: list[Tensor], grads: list[Tensor], mu: float, nesterov: bool, mhat_norm: bool, grad_norm: bool, compiled: bool
) -> tuple[list[Tensor], Tensor]:
    """A: M ← μM + G in place; returns (M̂ = μM + G, or [] without Nesterov (M̂ is M), and [n, 2]
    fp32 norms ‖M̂‖, ‖G‖ where asked, zeros elsewhere)."""
    return _traced_or_op(_momentum, _momentum_op, bufs, grads, mu, nesterov, mhat_norm, grad_norm, compiled)


@torch.library.custom_op("orscale::normalise_pass", mutates_args=())
def _normalise_op(
    m_hats: list[Tensor], norms: Tensor, tall: list[bool], scale: float, eps: float, dtype: torch.dtype, compiled: bool
) -> Tensor:
    return _run(_normalise, compiled, m_hats, norms, tall, scale, eps, dtype)


@_normalise_op.register_fake
def _(m_hats, norms, tall, scale, eps, dtype, compiled):
    rows, cols = sorted(m_hats[0].shape)
    return m_hats[0].new_empty(len(m_hats), rows, cols, dtype=dtype)


def normalise_pass(
    m_hats: list[Tensor], norms: Tensor, tall: list[bool], scale: float, eps: float, dtype: torch.dtype, compiled: bool
) -> Tensor:
    """B: the Newton–Schulz input of one bucket, [k, min(m,n), max(m,n)] in `dtype`: each M̂ divided
    by scale·‖M̂‖ + eps (`norms` [k]), tall ones transposed into the wide orientation."""
    return _traced_or_op(_normalise, _normalise_op, m_hats, norms, tall, scale, eps, dtype, compiled)


@torch.library.custom_op("orscale::update_norms_pass", mutates_args=())
def _update_norms_op(
    ws: list[Tensor], qs: list[Tensor], s: list[float], wd: float, want: list[bool], compiled: bool
) -> Tensor:
    return _run(_update_norms, compiled, ws, qs, s, wd, want)


@_update_norms_op.register_fake
def _(ws, qs, s, wd, want, compiled):
    return ws[0].new_empty(len(ws), 4, dtype=torch.float32)


def update_norms_pass(
    ws: list[Tensor], qs: list[Tensor], s: list[float], wd: float, want: list[bool], compiled: bool
) -> Tensor:
    """C: [n, 4] fp32 sums over each matrix (partial sums over a shard's rows add up): ‖W‖², ‖Q‖²,
    ‖λW + sQ‖², ⟨W,Q⟩, each where `want` asks for it (zeros elsewhere)."""
    return _traced_or_op(_update_norms, _update_norms_op, ws, qs, s, wd, want, compiled)


@torch.library.custom_op("orscale::apply_pass", mutates_args=("params",))
def _apply_op(
    params: list[Tensor],
    qs: list[Tensor],
    coef: Tensor,
    s: list[float],
    wd: float,
    keep: float,
    coupled: bool,
    compiled: bool,
) -> None:
    _run(_apply, compiled, params, qs, coef, s, wd, keep, coupled)


@_apply_op.register_fake
def _(params, qs, coef, s, wd, keep, coupled, compiled):
    return None


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
    _traced_or_op(_apply, _apply_op, params, qs, coef, s, wd, keep, coupled, compiled)
