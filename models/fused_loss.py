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
target logit, loss sums, softmax) in fp32. Single-device code: under FSDP2 the weight is the
unsharded parameter and its gradient is returned exactly as a Linear layer returns it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

IGNORE_INDEX = -100
# One chunk's fp32 logits stay at or below 2**26 elements (256 MiB): 1334 rows at V = 50304.
# Read at call time, so tests can shrink it.
CHUNK_ELEMENTS = 2**26


def default_chunk_rows(vocab_size: int) -> int:
    """Rows per chunk for a vocabulary of `vocab_size`, from CHUNK_ELEMENTS."""
    return max(1, CHUNK_ELEMENTS // vocab_size)


def _compute_dtype(h: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype `F.linear(h, weight)` would compute in here: autocast's, else the inputs'."""
    if torch.is_autocast_enabled(h.device.type):
        return torch.get_autocast_dtype(h.device.type)
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
            # ∂loss/∂logits = (softmax − one-hot) · [counted] / count, formed in place in the logits.
            grad_logits = logits.sub_(lse.unsqueeze(1)).exp_()
            grad_logits.scatter_add_(1, safe.unsqueeze(1), torch.full_like(lse, -1.0).unsqueeze(1))
            # clamp: with no counted target the loss is NaN (as in F.cross_entropy) but the grads are 0, as there
            grad_logits.mul_((valid.float() / count.clamp(min=1)).unsqueeze(1))
            grad_logits = grad_logits.to(dtype)
            grad_h[start:end] = grad_logits @ w
            if dtype == torch.float32:
                grad_w.addmm_(grad_logits.T, hc)
            else:  # the product rounds to the compute dtype per chunk, the sum over chunks is fp32
                grad_w.add_(grad_logits.T @ hc)  # in-place add upcasts without an fp32 [V, d] copy
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
    rows = chunk_rows or default_chunk_rows(weight.shape[0])
    dtype = _compute_dtype(h, weight)
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _FusedLinearCrossEntropy.apply(h, weight, targets, ignore_index, rows, dtype)
    # Nothing to differentiate (evaluation): skip the gradient matmuls.
    losses = chunked_token_losses(h, weight, targets, ignore_index, rows)
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
    rows = chunk_rows or default_chunk_rows(weight.shape[0])
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
