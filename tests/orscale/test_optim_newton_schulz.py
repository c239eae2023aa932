"""Newton–Schulz: exact iteration formula, closeness to the polar factor, batching."""

from __future__ import annotations

import math

import pytest
import torch

from orscale.newton_schulz import (
    JORDAN_COEFFS,
    POLAR_EXPRESS_COEFFS,
    newton_schulz,
    newton_schulz_many,
    ns_schedule,
)

SHAPES = [(64, 64), (128, 32), (32, 128), (96, 48), (48, 96), (384, 96)]


pytestmark = pytest.mark.usefixtures("one_thread")


def _conditioned(m: int, n: int, cond: float, gen: torch.Generator) -> torch.Tensor:
    """A matrix with singular values log-spaced over [σ_max/cond, σ_max] (square Gaussians can
    have near-zero singular values that no 5-step iteration can lift, so we control them)."""
    U, _ = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    k = min(m, n)
    s = torch.logspace(0, -math.log10(cond), k, dtype=torch.float64)
    return ((U[:, :k] * s) @ V[:, :k].T * 3.7).float()


def _inputs(shape: tuple[int, int]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(hash(shape) % 2**31)
    out = [_conditioned(*shape, cond=100.0, gen=gen)]
    if shape[0] != shape[1]:
        # Rectangular Gaussians are well conditioned (Marchenko–Pastur), test them as they come.
        out.append(torch.randn(*shape, generator=gen))
    return out


def test_spec_coefficients() -> None:
    spec = [
        (8.1566, -22.4833, 15.8788),
        (4.0429, -2.8089, 0.50002),
        (3.8917, -2.7725, 0.50606),
        (3.2858, -2.3681, 0.46449),
        (2.3465, -1.7098, 0.42324),
    ]
    for ours, theirs in zip(POLAR_EXPRESS_COEFFS, spec, strict=True):
        for a, b in zip(ours, theirs, strict=True):
            assert a == pytest.approx(b, abs=1e-4)
    assert JORDAN_COEFFS == (3.4445, -4.7750, 2.0315)
    assert ns_schedule("polar_express", 7)[5:] == [POLAR_EXPRESS_COEFFS[-1]] * 2
    with pytest.raises(ValueError, match="polar_express"):
        ns_schedule("cubic", 5)


@pytest.mark.parametrize("coefficients", ["polar_express", "jordan"])
@pytest.mark.parametrize("shape", [(12, 5), (5, 12)])
def test_one_iteration_matches_formula(coefficients: str, shape: tuple[int, int]) -> None:
    """The normalisation, transpose and one quintic step written out by hand (fp32)."""
    M = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    X = M.T if shape[0] > shape[1] else M
    if coefficients == "polar_express":
        X = X / (1.02 * X.norm() + 1e-6)
        a, b, c = POLAR_EXPRESS_COEFFS[0]
    else:
        X = X / (X.norm() + 1e-7)
        a, b, c = JORDAN_COEFFS
    A = X @ X.T
    X = a * X + (b * A + c * A @ A) @ X
    expected = X.T if shape[0] > shape[1] else X
    got = newton_schulz(M.float(), steps=1, coefficients=coefficients, dtype="fp32")
    assert got.dtype == torch.float32 and got.shape == M.shape
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)


# Output singular-value bands after 5 steps, for inputs with σ_min/‖M‖_F ≳ 2e-3: Polar Express
# equioscillates in about [0.86, 1.14]; Jordan's quintic deliberately lands in about [0.68, 1.2].
BANDS = {"polar_express": (0.84, 1.16), "jordan": (0.66, 1.22)}
# ‖Q − UVᵀ‖_F / ‖UVᵀ‖_F, fp32: follows from the bands above.
POLAR_TOL = {"polar_express": 0.12, "jordan": 0.25}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("coefficients", ["polar_express", "jordan"])
@pytest.mark.parametrize("shape", SHAPES)
def test_close_to_polar_factor(shape: tuple[int, int], coefficients: str, dtype: str) -> None:
    lo, hi = BANDS[coefficients]
    for M in _inputs(shape):
        Q = newton_schulz(M, coefficients=coefficients, dtype=dtype)
        assert Q.shape == M.shape
        assert Q.dtype == (torch.bfloat16 if dtype == "bf16" else torch.float32)
        sv = torch.linalg.svdvals(Q.double())
        assert lo <= sv.min().item() and sv.max().item() <= hi, (sv.min(), sv.max())
        U, _, Vh = torch.linalg.svd(M.double(), full_matrices=False)
        polar = U @ Vh
        err = ((Q.double() - polar).norm() / polar.norm()).item()
        # bf16 adds its own rounding on top of the method's error.
        assert err < POLAR_TOL[coefficients] + (0.02 if dtype == "bf16" else 0.0), err
        if dtype == "bf16":
            Q32 = newton_schulz(M, coefficients=coefficients, dtype="fp32")
            assert ((Q.float() - Q32).norm() / Q32.norm()).item() < 0.03


def test_batched_matches_single_and_keeps_order() -> None:
    gen = torch.Generator().manual_seed(3)
    mats = [torch.randn(s, generator=gen) for s in [(40, 16), (16, 40), (40, 16), (24, 24), (40, 16)]]
    many = newton_schulz_many(mats, dtype="fp32")
    for M, Q in zip(mats, many, strict=True):
        torch.testing.assert_close(Q, newton_schulz(M, dtype="fp32"), rtol=1e-5, atol=1e-5)
    stacked = newton_schulz(torch.stack(mats[::2]), dtype="fp32")
    for M, Q in zip(mats[::2], stacked, strict=True):
        torch.testing.assert_close(Q, newton_schulz(M, dtype="fp32"), rtol=1e-5, atol=1e-5)


def test_zero_matrix_stays_zero() -> None:
    for coefficients in ("polar_express", "jordan"):
        Q = newton_schulz(torch.zeros(8, 4), coefficients=coefficients, dtype="fp32")
        assert torch.equal(Q, torch.zeros(8, 4))
