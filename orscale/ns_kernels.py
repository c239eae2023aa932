"""Triton kernels for Newton–Schulz's two symmetric products (GPU; docs/gpu.md):

    A = X Xᵀ                 (X [k, m, n], m ≤ n: A [k, m, m] is symmetric)
    B = b·A + c·A·A          (A symmetric, so A·A = A Aᵀ is too, and so is B)

Each computes the tiles on and above the diagonal only and writes each element on or above the
diagonal twice (as itself and mirrored), so the results are exactly symmetric and these two
products cost about half their FLOPs (modded-nanogpt's and
Dion's kernels do the same). The arithmetic is NS₅'s: bf16 inputs, fp32 accumulation, B's
epilogue c·acc + b·A in fp32, one rounding to bf16 on store, the same as `torch.bmm` /
`torch.baddbmm` compute it (orscale/newton_schulz.py's `_iterate`, which stays the reference and
the fallback). The third product of an iteration, B·X, is not symmetric and stays cuBLAS's.

Triton runs on a CPU under TRITON_INTERPRET=1, where the tests check these kernels against
torch.matmul. Triton 3.9's interpreter multiplies bf16 tiles as their raw 16-bit integers and
truncates fp32 → bf16 stores, so there the tiles are widened to fp32 before `tl.dot` (exact for
bf16 values; the sums are fp32 on a GPU too) and the result is stored in fp32 and rounded by torch.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any

import torch
from torch import Tensor

AVAILABLE = importlib.util.find_spec("triton") is not None
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

if AVAILABLE:
    import triton
    import triton.language as tl

    @triton.jit
    def _symmetric_kernel(
        x_ptr,
        c_ptr,
        out_ptr,
        m,
        n,
        stride_xb,
        stride_xm,
        stride_xn,
        stride_cb,
        stride_cm,
        stride_cn,
        stride_ob,
        stride_om,
        stride_on,
        alpha,
        beta,
        HAS_C: tl.constexpr,
        BLOCK: tl.constexpr,
        BLOCK_K: tl.constexpr,
        UPCAST: tl.constexpr,
    ):
        """out[b] = alpha·x[b]·x[b]ᵀ (+ beta·c[b]) for the tile (i, j), i ≤ j, and its mirror."""
        i = tl.program_id(0)
        j = tl.program_id(1)
        if i > j:
            return
        batch = tl.program_id(2).to(tl.int64)  # 64-bit: k·m·n may pass 2³¹ (one matrix stays under it)
        rows = i * BLOCK + tl.arange(0, BLOCK)
        cols = j * BLOCK + tl.arange(0, BLOCK)
        ks = tl.arange(0, BLOCK_K)
        x = x_ptr + batch * stride_xb
        acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
        for k0 in range(0, n, BLOCK_K):
            kk = k0 + ks
            a = tl.load(
                x + rows[:, None] * stride_xm + kk[None, :] * stride_xn,
                mask=(rows[:, None] < m) & (kk[None, :] < n),
                other=0.0,
            )
            b = tl.load(
                x + cols[None, :] * stride_xm + kk[:, None] * stride_xn,
                mask=(cols[None, :] < m) & (kk[:, None] < n),
                other=0.0,
            )
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc)
        acc = acc * alpha
        inside = (rows[:, None] < m) & (cols[None, :] < m)
        if HAS_C:
            c = c_ptr + batch * stride_cb
            acc += beta * tl.load(c + rows[:, None] * stride_cm + cols[None, :] * stride_cn, mask=inside, other=0.0).to(
                tl.float32
            )
        out = out_ptr + batch * stride_ob
        value = acc.to(out_ptr.dtype.element_ty)
        # Symmetric by construction: each element on or above the diagonal is stored as itself and
        # mirrored (in a diagonal tile, (r, c) and (c, r) are separate sums that need not round alike;
        # above the diagonal, i < j, every element of the tile is there).
        keep = inside & (rows[:, None] <= cols[None, :])
        tl.store(out + rows[:, None] * stride_om + cols[None, :] * stride_on, value, mask=keep)
        tl.store(out + cols[None, :] * stride_om + rows[:, None] * stride_on, value, mask=keep)


# (tile, k-step, warps) for large and for small (≤ 64-row) matrices: 128 × 64 with 8 warps on a GPU;
# small tiles under the interpreter.
GPU_TILES = ((128, 64, 8), (64, 64, 4))
TILES = ((16, 16, 1), (16, 16, 1)) if _INTERPRET else GPU_TILES


def _blocks(m: int) -> tuple[int, int, int]:
    """The tiling of an m-row product."""
    return TILES[0] if m > 64 else TILES[1]


def symmetric_product(x: Tensor, c: Tensor | None = None, alpha: float = 1.0, beta: float = 0.0) -> Tensor:
    """alpha·x·xᵀ + beta·c for a batch x [k, m, n] (c [k, m, m] symmetric, or None), in x's dtype,
    from the upper triangle of tiles. `symmetric_product(x)` is X Xᵀ; `symmetric_product(a, a, c, b)`
    is b·A + c·A² for a symmetric A."""
    if not AVAILABLE:
        raise RuntimeError("orscale.ns_kernels needs triton (pip install 'orscale-lm[kernels]')")
    k, m, n = x.shape
    # The interpreter truncates fp32 → bf16 stores (a GPU rounds to nearest even): there the kernel
    # stores fp32 and torch rounds.
    out = torch.empty(k, m, m, dtype=torch.float32 if _INTERPRET else x.dtype, device=x.device)
    block, block_k, warps = _blocks(m)
    tiles = triton.cdiv(m, block)
    cc = c if c is not None else out  # unread when HAS_C is false
    launch: Any = _symmetric_kernel[(tiles, tiles, k)]  # (triton's launcher types its constexprs strictly)
    launch(
        x,
        cc,
        out,
        m,
        n,
        *x.stride(),
        *cc.stride(),
        *out.stride(),
        alpha,
        beta,
        HAS_C=c is not None,
        BLOCK=block,
        BLOCK_K=block_k,
        UPCAST=_INTERPRET,
        num_warps=warps,
    )
    return out.to(x.dtype)


def usable(x: Tensor) -> bool:
    """Whether the kernels serve an NS batch: triton present, a CUDA tensor, bf16 (fp32 NS is for
    equality tests and stays on the reference path), and the kernels passed their check on this
    device type (`verified`). Under the interpreter they run only when called directly (tests)."""
    return AVAILABLE and x.dtype == torch.bfloat16 and x.is_cuda and verified(x.device)


_VERIFIED: dict[str, bool] = {}


def check_shapes() -> list[tuple[int, int, int]]:
    """The self-check's batches: one spanning three tiles of the large-matrix tiling with a partial
    last tile and an uneven k-step (off-diagonal and mirrored tiles, masked edges), one within the
    small-matrix tile."""
    big, big_k, _ = _blocks(1 << 20)
    small, small_k, _ = _blocks(1)
    return [(2, 2 * big + big // 2 + 3, 3 * big_k + 5), (2, small - 7, small_k + 9)]


def verified(device: torch.device) -> bool:
    """Once per process and device type: both kernels against torch's batched products on the
    `check_shapes()` batches; a failure (no compiler, a wrong result) sends NS back to the
    reference path with one warning instead of training on it."""
    kind = device.type
    if kind not in _VERIFIED:
        gen = torch.Generator(device="cpu").manual_seed(0)
        try:
            ok = True
            for shape in check_shapes():
                x = torch.randn(*shape, generator=gen).to(device, torch.bfloat16)
                a = symmetric_product(x)
                b = symmetric_product(a, a, alpha=2.0, beta=-1.5)
                want_a = (x.float() @ x.float().mT).bfloat16()
                want_b = (-1.5 * want_a.float() + 2.0 * (want_a.float() @ want_a.float())).bfloat16()
                ok = ok and _close(a, want_a) and _close(b, want_b)
            reason = "differ from torch.bmm"
        except Exception as err:  # a GPU image without a working Triton toolchain
            ok, reason = False, f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}"
        if not ok:
            logging.getLogger("orscale").warning("Newton–Schulz's symmetric kernels %s: torch's bmm used", reason)
        _VERIFIED[kind] = ok
    return _VERIFIED[kind]


def _close(got: Tensor, want: Tensor) -> bool:
    """Within two bf16 roundings of each other, relative to the largest entry."""
    return bool(((got.float() - want.float()).abs().max() <= 2**-6 * want.float().abs().max()).item())


def iterate_symmetric(x: Tensor, schedule: list[tuple[float, float, float]]) -> Tensor:
    """`newton_schulz._iterate` with its two symmetric products from these kernels: per iteration
    A = X Xᵀ, B = b·A + c·A², X ← a·X + B·X (the last one cuBLAS's)."""
    for a, b, c in schedule:
        A = symmetric_product(x)
        B = symmetric_product(A, A, alpha=c, beta=b)
        x = torch.baddbmm(x, B, x, beta=a)
    return x


def symmetric_flops(shape: tuple[int, ...], steps: int, block: int = 128) -> float:
    """FLOPs of NS on one m × n matrix (m the smaller side) with these kernels: per iteration the
    upper triangle of tiles of X Xᵀ (2m²n in full) and of A² (2m³), and all of B·X (2m²n)."""
    m, n = sorted(shape[-2:])
    tiles = -(-m // block)
    share = tiles * (tiles + 1) / 2 / tiles**2  # tiles computed over all tiles
    return steps * (share * (2 * m * m * n + 2 * m**3) + 2 * m * m * n)
