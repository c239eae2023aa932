"""Cross-entropy of a linear head without materialising the logits (fused linear cross-entropy,
as in Liger-Kernel).

``loss = mean over counted rows i of CE(h_i · Wᵀ, t_i)`` for hidden states h [N, d], a head
weight W [V, d] and targets t [N]; rows whose target is ``ignore_index`` are not counted. The rows
are processed in chunks, so only one chunk's logits [rows, V] exists at a time. Because the loss
ends the graph, its gradients are known in forward: ∂loss/∂logits = (softmax − one-hot) / count,
so the same loop also forms ∂loss/∂h ([N, d], h's dtype) and accumulates ∂loss/∂W ([V, d], fp32);
backward only scales them by grad_output. What stays alive for backward is therefore [N, d] +
[V, d] instead of the [N, V] logits and log-softmax of the plain path.

Precision: the logits of a chunk are computed in the compute dtype (the autocast dtype when
autocast is on, as `F.linear` would; else the inputs' dtype), everything after that (logsumexp,
target logit, loss sums, softmax) in fp32. ∂loss/∂W is summed over chunks in fp32; on CUDA each
chunk's bf16 product goes straight into that fp32 sum (`accumulate_grad_w`). Single-device code:
under FSDP2 the weight is the unsharded parameter and its gradient is returned exactly as a Linear
layer returns it.

Compiled (torch.compile traces it in one graph, in every `parallel.compile` mode: docs/gpu.md),
a chunk becomes its matmuls plus two fused passes over its logits (logsumexp; softmax − one-hot
cast to the compute dtype) instead of the eager loop's dozen.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

IGNORE_INDEX = -100
# One chunk's fp32 logits stay at or below 2**26 elements (256 MiB): 1334 rows at V = 50304. A
# compiled loss never stores fp32 logits, only logits in the compute dtype: with bf16 it takes
# chunks of twice the rows (fatter head matmuls: the grad-h product's output is [rows, d]) for the
# same memory. Read at call time, so tests can shrink it.
CHUNK_ELEMENTS = 2**26
ROW_MULTIPLE = 64  # chunk rows rounded up to a multiple of this where that stays within the cap (whole GEMM tiles)


def default_chunk_rows(vocab_size: int, n_rows: int | None = None, logits_bytes: int = 4) -> int:
    """Rows per chunk for a vocabulary of `vocab_size`: at most CHUNK_ELEMENTS fp32 logits' worth
    of `logits_bytes`-byte logits, and, given `n_rows`, spread evenly over the fewest chunks that
    fit (no short tail chunk)."""
    cap = max(1, CHUNK_ELEMENTS * 4 // (logits_bytes * vocab_size))
    if n_rows is None or n_rows <= cap:
        return cap if n_rows is None else max(n_rows, 1)
    chunks = -(-n_rows // cap)
    rows = -(-n_rows // chunks)
    rounded = -(-rows // ROW_MULTIPLE) * ROW_MULTIPLE
    return rounded if rows >= ROW_MULTIPLE and rounded <= cap else rows


def _compute_dtype(h: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype `F.linear(h, weight)` would compute in here: autocast's, else the inputs'."""
    kind = h.device.type
    if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):  # not on meta
        return torch.get_autocast_dtype(kind)
    return torch.promote_types(h.dtype, weight.dtype)


def _chunk_forward(
    h: Tensor, w: Tensor, targets: Tensor, ignore_index: int, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """One chunk: (fp32 logits, logsumexp, counted mask, safe target ids, per-row losses; 0 where
    not counted)."""
    logits = (h.to(dtype) @ w.T).float()
    lse = torch.logsumexp(logits, dim=-1)
    valid = targets != ignore_index
    safe = torch.where(valid, targets, torch.zeros_like(targets))  # gather needs an in-range id
    target_logit = logits.gather(1, safe.unsqueeze(1)).squeeze(1)
    losses = torch.where(valid, lse - target_logit, torch.zeros_like(lse))
    return logits, lse, valid, safe, losses


def _grad_logits(logits: Tensor, lse: Tensor, safe: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """∂loss/∂logits = (softmax − one-hot) · scale per row, in fp32, returned in `dtype`. Eager, it
    is formed in place in the fp32 logits (no second [rows, V] tensor); traced by torch.compile, as
    one pointwise expression (the one-hot as a comparison with the column index), which inductor
    fuses with the cast into one pass over the logits. The same fp32 arithmetic either way:
    exp(x − lse), then −1 at the target, then × scale."""
    if torch.compiler.is_compiling():
        p = torch.exp(logits - lse.unsqueeze(1))
        column = torch.arange(logits.shape[1], device=logits.device)
        p = torch.where(column.unsqueeze(0) == safe.unsqueeze(1), p + -1.0, p)
        return (p * scale.unsqueeze(1)).to(dtype)
    p = logits.sub_(lse.unsqueeze(1)).exp_()
    p.scatter_add_(1, safe.unsqueeze(1), torch.full_like(lse, -1.0).unsqueeze(1))
    return p.mul_(scale.unsqueeze(1)).to(dtype)


@torch.library.custom_op("fused_loss::accumulate_grad_w", mutates_args=("acc",))
def accumulate_grad_w(acc: Tensor, grad_logits: Tensor, h: Tensor) -> None:
    """acc += grad_logitsᵀ · h, `acc` fp32 [V, d]. With 16-bit inputs, on a device whose matmul
    accumulates into an fp32 output (CUDA, and meta for the guards), the product goes straight into
    `acc` (one GEMM with β = 1, no [V, d] temporary); elsewhere it is rounded to the input dtype
    first and added (fp32 sum over chunks either way). An op of its own so that a compiled loss
    keeps this in-place GEMM instead of a decomposition with an fp32 temporary."""
    if grad_logits.dtype == torch.float32:
        acc.addmm_(grad_logits.T, h)
    elif fp32_accumulating_matmul(acc.device):
        torch.addmm(acc, grad_logits.T, h, out_dtype=torch.float32, out=acc)
    else:
        acc.add_(grad_logits.T @ h)  # the in-place add upcasts without an fp32 [V, d] copy


@accumulate_grad_w.register_fake
def _(acc: Tensor, grad_logits: Tensor, h: Tensor) -> None:
    return None


_FP32_ACCUMULATE: dict[str, bool] = {}


def fp32_accumulating_matmul(device: torch.device) -> bool:
    """Whether `torch.addmm(fp32, bf16, bf16, out_dtype=fp32, out=...)` runs and is right on
    `device`'s type: tried once per process on a small product (torch builds before CUDA's
    fp32-`self` support raise; a CPU has no such kernel). `meta` answers as CUDA does."""
    kind = device.type
    if kind not in _FP32_ACCUMULATE:
        if kind == "meta":
            _FP32_ACCUMULATE[kind] = True
        elif kind != "cuda":
            _FP32_ACCUMULATE[kind] = False
        else:
            gen = torch.Generator(device="cpu").manual_seed(0)
            a, b, c = (torch.randn(s, generator=gen) for s in ((64, 32), (32, 48), (64, 48)))
            want = c + a.bfloat16().float() @ b.bfloat16().float()
            try:
                got = c.to(device)
                torch.addmm(
                    got, a.to(device, torch.bfloat16), b.to(device, torch.bfloat16), out_dtype=torch.float32, out=got
                )
                _FP32_ACCUMULATE[kind] = bool(torch.allclose(got.cpu(), want, rtol=1e-4, atol=1e-4))
            except (RuntimeError, TypeError, NotImplementedError):
                _FP32_ACCUMULATE[kind] = False
    return _FP32_ACCUMULATE[kind]


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        h: Tensor,
        weight: Tensor,
        targets: Tensor,
        ignore_index: int,
        chunk_rows: int,
        dtype: torch.dtype,
    ) -> Tensor:
        n = h.shape[0]
        w = weight.to(dtype)
        count = (targets != ignore_index).sum().float()
        loss_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for start in range(0, n, chunk_rows):
            end = min(start + chunk_rows, n)
            hc = h[start:end].to(dtype)
            logits, lse, valid, safe, losses = _chunk_forward(hc, w, targets[start:end], ignore_index, dtype)
            loss_sum = loss_sum + losses.sum()
            # clamp: with no counted target the loss is NaN (as in F.cross_entropy) but the grads are 0, as there
            grad_logits = _grad_logits(logits, lse, safe, valid.float() / count.clamp(min=1), dtype)
            grad_h[start:end] = grad_logits @ w
            accumulate_grad_w(grad_w, grad_logits, hc)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        return loss_sum / count

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        return (grad_h * grad_out).to(grad_h.dtype), (grad_w * grad_out).to(ctx.weight_dtype), None, None, None, None


def fused_linear_cross_entropy(
    h: Tensor,
    weight: Tensor,
    targets: Tensor,
    ignore_index: int = IGNORE_INDEX,
    chunk_rows: int | None = None,
) -> Tensor:
    """Mean cross-entropy of logits `h @ weight.T` (h [N, d], weight [V, d], targets [N] int),
    over the targets that are not `ignore_index`: equal to
    ``F.cross_entropy(F.linear(h, weight).float(), targets, ignore_index=ignore_index)``
    (fp32 scalar; NaN when no target counts, as there) without its [N, V] tensors."""
    dtype = _compute_dtype(h, weight)
    # Traced by torch.compile, the logits live in the compute dtype only (see CHUNK_ELEMENTS).
    logits_bytes = dtype.itemsize if torch.compiler.is_compiling() else 4
    rows = chunk_rows or default_chunk_rows(weight.shape[0], h.shape[0], logits_bytes)
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _FusedLinearCrossEntropy.apply(h, weight, targets, ignore_index, rows, dtype)
    # Nothing to differentiate (evaluation): skip the gradient matmuls. Every row meets the head
    # (no data-dependent selection, so a compiled caller traces it in one graph).
    losses = _chunked_losses(h, weight.to(dtype), targets, ignore_index, rows, dtype)
    return losses.sum() / (targets != ignore_index).sum().float()


@torch.no_grad()
def chunked_token_losses(
    h: Tensor,
    weight: Tensor,
    targets: Tensor,
    ignore_index: int = IGNORE_INDEX,
    chunk_rows: int | None = None,
) -> Tensor:
    """Per-row cross-entropy [N] (fp32, no gradients) of logits `h @ weight.T`, chunk by chunk;
    0 where the target is `ignore_index`. Only counted rows meet the head: a downstream task scores
    a few continuation tokens per window, and the head is most of a small model's forward."""
    rows = chunk_rows or default_chunk_rows(weight.shape[0], h.shape[0])
    dtype = _compute_dtype(h, weight)
    w = weight.to(dtype)
    counted = targets != ignore_index
    if bool(counted.all()):  # validation: every row counts, no gather
        return _chunked_losses(h, w, targets, ignore_index, rows, dtype)
    out = torch.zeros(targets.shape, dtype=torch.float32, device=h.device)
    keep = counted.nonzero().squeeze(1)
    if keep.numel():
        out[keep] = _chunked_losses(h[keep], w, targets[keep], ignore_index, rows, dtype)
    return out


def _chunked_losses(h: Tensor, w: Tensor, targets: Tensor, ignore_index: int, rows: int, dtype: torch.dtype) -> Tensor:
    parts = [
        _chunk_forward(h[s : s + rows], w, targets[s : s + rows], ignore_index, dtype)[4]
        for s in range(0, h.shape[0], rows)
    ]
    return torch.cat(parts)
