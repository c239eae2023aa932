"""Newton–Schulz orthogonalisation: M ↦ Q ≈ U Vᵀ (the polar factor of M = U Σ Vᵀ).

Two coefficient sets (docs/algorithm.md, step 2 of OrScale-LM):

* ``polar_express`` (default): five per-iteration quintic coefficient triples from the Polar
  Express paper (Amsel et al., 2025), with X₀ = M / (1.02·‖M‖_F + 1e-6). The 1.02 safety factor
  keeps the spectral norm of X₀ below 1 even when ‖M‖_F is computed in low precision.
* ``jordan``: Keller Jordan's fixed quintic (3.4445, −4.7750, 2.0315) with X₀ = M / (‖M‖_F + 1e-7),
  the choice of ``torch.optim.Muon``. It converges to singular values in roughly [0.7, 1.2]
  rather than to 1; that is by design (speed over accuracy).

Every iteration is ``A = X Xᵀ;  X ← a·X + (b·A + c·A²)·X``. A matrix with more rows than columns
is transposed first so that A is the smaller Gram matrix (min(m,n)² instead of max(m,n)²).
The iteration runs in bf16 by default (what the paper does; tensor cores); fp32 is for equality
tests, where bf16 would turn 1e-9 reduction-order noise into 1e-3 differences.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.profiler import record_function

# Full-precision values of the coefficients docs/algorithm.md lists to 5 significant digits.
POLAR_EXPRESS_COEFFS: tuple[tuple[float, float, float], ...] = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
JORDAN_COEFFS: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)

NS_COEFFICIENT_SETS: tuple[str, ...] = ("polar_express", "jordan")
# Who computes X Xᵀ and b·A + c·A²: auto (orscale.ns_kernels' symmetric Triton kernels for bf16 on
# CUDA when they pass their check, else torch), torch (cuBLAS's full products: the reference).
NS_KERNELS: tuple[str, ...] = ("auto", "torch")
_NS_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp32": torch.float32}

DTypeLike = str | torch.dtype


def resolve_ns_dtype(dtype: DTypeLike) -> torch.dtype:
    """'bf16' | 'fp32' | torch.bfloat16 | torch.float32 -> torch.dtype (ValueError otherwise)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _NS_DTYPES.values():
            raise ValueError(f"Newton–Schulz dtype must be bf16 or fp32, got {dtype}")
        return dtype
    if dtype not in _NS_DTYPES:
        raise ValueError(f"Newton–Schulz dtype must be 'bf16' or 'fp32', got {dtype!r}")
    return _NS_DTYPES[dtype]


def ns_schedule(coefficients: str, steps: int) -> list[tuple[float, float, float]]:
    """The (a, b, c) triple used at each of `steps` iterations.

    Polar Express is tuned for exactly five iterations; beyond five we repeat the last triple
    (it is the most conservative one), below five we take the first `steps`.
    """
    if steps < 1:
        raise ValueError(f"Newton–Schulz steps must be >= 1, got {steps}")
    if coefficients == "polar_express":
        last = POLAR_EXPRESS_COEFFS[-1]
        return [POLAR_EXPRESS_COEFFS[i] if i < len(POLAR_EXPRESS_COEFFS) else last for i in range(steps)]
    if coefficients == "jordan":
        return [JORDAN_COEFFS] * steps
    raise ValueError(
        f"Newton–Schulz coefficients must be one of {', '.join(NS_COEFFICIENT_SETS)}; got {coefficients!r}"
    )


def newton_schulz(
    M: Tensor,
    steps: int = 5,
    coefficients: str = "polar_express",
    dtype: DTypeLike = "bf16",
) -> Tensor:
    """Approximate polar factor of `M` (shape [m, n] or a batch [k, m, n]).

    Returns a tensor of M's shape in the iteration dtype (bf16 by default); callers cast.
    The normalisation uses a Frobenius norm computed in fp32 before the cast, so a bf16 run
    differs from an fp32 one only by the iteration's own rounding.
    """
    if M.ndim not in (2, 3):
        raise ValueError(f"newton_schulz expects a matrix or a batch of matrices, got {M.shape}")
    schedule = ns_schedule(coefficients, steps)
    work_dtype = resolve_ns_dtype(dtype)

    X = M if M.ndim == 3 else M.unsqueeze(0)
    transposed = X.size(-2) > X.size(-1)
    if transposed:
        X = X.mT  # wide orientation: the Gram matrix A is min(m,n)²
    X = _iterate(_normalise(X, coefficients, work_dtype).contiguous(), schedule)
    if transposed:
        X = X.mT
    return X if M.ndim == 3 else X.squeeze(0)


def normalisation(coefficients: str) -> tuple[float, float]:
    """(scale, ε) of X₀ = M / (scale·‖M‖_F + ε) for a coefficient set (see the module docstring)."""
    return (1.02, 1e-6) if coefficients == "polar_express" else (1.0, 1e-7)


def _normalise(X: Tensor, coefficients: str, work_dtype: torch.dtype) -> Tensor:
    """X₀ = X / (scale·‖X‖_F + ε) per matrix of the batch X, cast to the work dtype (X's strides kept)."""
    norm = torch.linalg.vector_norm(X.float(), dim=(-2, -1), keepdim=True)
    scale, eps = normalisation(coefficients)
    X = X.float() / (scale * norm + eps)
    return X.to(work_dtype)


def shape_buckets(matrices: Sequence[Tensor]) -> dict[tuple, list[int]]:
    """Positions of the 2-D `matrices` that iterate on the same shape: keyed by (min(m,n), max(m,n),
    dtype, device), so an [m, n] and an [n, m] matrix share a bucket (the tall one transposed)."""
    buckets: dict[tuple, list[int]] = defaultdict(list)
    for i, m in enumerate(matrices):
        if m.ndim != 2:
            raise ValueError(f"Newton–Schulz expects 2-D matrices, got shape {tuple(m.shape)} at index {i}")
        buckets[(min(m.shape), max(m.shape), m.dtype, m.device)].append(i)
    return buckets


def _iterate(X: Tensor, schedule: list[tuple[float, float, float]]) -> Tensor:
    """The quintic iterations on a contiguous batch [k, m, n] with m <= n."""
    for a, b, c in schedule:
        A = torch.bmm(X, X.mT)
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)  # b·A + c·A²
        X = torch.baddbmm(X, B, X, beta=a)  # a·X + B·X
    return X


def _iterate_with(X: Tensor, schedule: list[tuple[float, float, float]], kernel: str) -> Tensor:
    if kernel == "auto":
        import orscale.ns_kernels as ns_kernels

        if ns_kernels.usable(X):
            return ns_kernels.iterate_symmetric(X, schedule)
    return _iterate(X, schedule)


# Its own span in a profiler trace (train.profile); without a profiler running, a few µs per call,
# one call per shape bucket and step (bench/bench_record_function.py).
@record_function("newton_schulz")
def newton_schulz_many(
    matrices: Sequence[Tensor],
    steps: int = 5,
    coefficients: str = "polar_express",
    dtype: DTypeLike = "bf16",
    *,
    norms: Tensor | None = None,
    compiled: bool = False,
    kernel: str = "torch",
) -> list[Tensor]:
    """Orthogonalise a list of 2-D matrices, batching those that iterate on the same shape.

    `newton_schulz` works on the wide orientation, so the bucket key is (min(m,n), max(m,n)),
    dtype and device: an [m, n] and an [n, m] matrix (e.g. an MLP's up- and down-projection)
    share one batched call, the tall ones transposed before stacking. One batched call per
    bucket replaces many small ones: on a GPU that is fewer, larger kernels; on a CPU it changes
    little. Each result equals `newton_schulz` of that matrix alone (bit for bit where batched
    and single GEMMs round alike, as on the CPU this was tested on), comes back in input order
    and in its input's shape, as a view into its bucket's output (transposed for tall inputs,
    as `newton_schulz` returns them; no copies).

    `norms` [len(matrices)]: each matrix's ‖M‖_F when the caller has it already (the Muon family's
    momentum pass computes it): X₀ is then formed in ONE pass per bucket (read M, write X₀ in the
    work dtype: `orscale.muon_passes.normalise_pass`, compiled on request) instead of stacking,
    norming and casting; equal to the above within the norm's summation order. `kernel`
    (NS_KERNELS): "auto" runs each bucket's two symmetric products in `orscale.ns_kernels` where
    they apply (half their FLOPs; equal within bf16 rounding).
    """
    from orscale.muon_passes import normalise_pass

    if kernel not in NS_KERNELS:
        raise ValueError(f"Newton–Schulz kernel must be one of {', '.join(NS_KERNELS)}, got {kernel!r}")
    schedule = ns_schedule(coefficients, steps)
    work_dtype = resolve_ns_dtype(dtype)
    scale, eps = normalisation(coefficients)
    out: dict[int, Tensor] = {}
    for (rows, cols, _, device), idx in shape_buckets(matrices).items():
        if norms is not None:
            mats = [matrices[i] for i in idx]
            tall = [m.size(0) > m.size(1) for m in mats]
            X = normalise_pass(mats, torch.stack([norms[i] for i in idx]), tall, scale, eps, work_dtype, compiled)
            order = idx
        elif len(idx) == 1:
            out[idx[0]] = newton_schulz(matrices[idx[0]], steps, coefficients, dtype)
            continue
        else:
            tall_ = [i for i in idx if matrices[i].size(0) > matrices[i].size(1)]
            wide = [i for i in idx if matrices[i].size(0) <= matrices[i].size(1)]
            # Each orientation is normalised as stored, then transposed into the shared buffer: the
            # norm's summation order follows the memory layout, and this order is the one a
            # single `newton_schulz` call uses, so every result stays bit-equal to it.
            X = torch.empty(len(idx), rows, cols, dtype=work_dtype, device=device)
            if wide:
                X[: len(wide)] = _normalise(torch.stack([matrices[i] for i in wide]), coefficients, work_dtype)
            if tall_:
                X[len(wide) :] = _normalise(torch.stack([matrices[i] for i in tall_]).mT, coefficients, work_dtype)
            order = wide + tall_
        Q = _iterate_with(X, schedule, kernel)
        for i, q in zip(order, Q.unbind(0), strict=True):
            out[i] = q.mT if matrices[i].size(0) > matrices[i].size(1) else q
    return [out[i] for i in range(len(matrices))]
