"""newton_schulz_many buckets by the oriented shape (min(m,n), max(m,n)): tall and wide matrices of
the same problem share a batched call, results keep input order and shape, and each equals
`newton_schulz` of that matrix alone."""

from __future__ import annotations

import importlib

import pytest
import torch

from orscale.newton_schulz import newton_schulz, newton_schulz_many

# The module itself: `import orscale.newton_schulz as ns` names the function the package re-exports.
ns = importlib.import_module("orscale.newton_schulz")

pytestmark = pytest.mark.usefixtures("one_thread")

# Buckets by oriented shape: (48, 96) ×4 (two tall, two wide, interleaved), (64, 64) ×2,
# (32, 80) ×2 (one each way), (24, 40) ×1 alone (tall).
SHAPES = [(96, 48), (64, 64), (48, 96), (32, 80), (96, 48), (40, 24), (64, 64), (80, 32), (48, 96)]


def mats(dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    return [torch.randn(s, generator=gen).to(dtype) for s in SHAPES]


@pytest.mark.parametrize("coefficients", ["polar_express", "jordan"])
def test_fp32_equals_one_by_one_bit_for_bit(coefficients: str) -> None:
    """Bit-equal on the CPUs tested: each orientation is normalised in its stored layout, as a
    single call does, and the batched GEMMs compute each matrix as the unbatched ones do."""
    ms = mats()
    many = newton_schulz_many(ms, coefficients=coefficients, dtype="fp32")
    assert len(many) == len(ms)
    for M, Q in zip(ms, many, strict=True):
        assert Q.shape == M.shape and Q.dtype == torch.float32
        assert torch.equal(Q, newton_schulz(M, coefficients=coefficients, dtype="fp32")), M.shape


def test_bf16_within_bf16_rounding_of_one_by_one() -> None:
    """Stated bound: one bf16 ulp of the largest entry (measured: bit-equal on this CPU)."""
    for ms in (mats(), mats(torch.bfloat16)):
        for M, Q in zip(ms, newton_schulz_many(ms, dtype="bf16"), strict=True):
            ref = newton_schulz(M, dtype="bf16")
            assert Q.shape == M.shape and Q.dtype == torch.bfloat16
            err = (Q.float() - ref.float()).abs().max().item()
            assert err <= 2**-8 * ref.float().abs().max().item(), (M.shape, err)


def test_input_order_kept_under_permutation() -> None:
    ms = mats()
    ref = newton_schulz_many(ms, dtype="fp32")
    perm = [5, 2, 8, 0, 7, 1, 4, 3, 6]
    shuffled = newton_schulz_many([ms[i] for i in perm], dtype="fp32")
    for j, i in enumerate(perm):
        assert torch.equal(shuffled[j], ref[i])


def test_one_batched_call_per_oriented_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """Up- and down-projection shapes iterate together: 3 buckets of 2+ plus 1 singleton."""
    shapes: list[tuple[int, ...]] = []
    iterate = ns._iterate

    def counting(X: torch.Tensor, schedule: list[tuple[float, float, float]]) -> torch.Tensor:
        shapes.append(tuple(X.shape))
        return iterate(X, schedule)

    monkeypatch.setattr(ns, "_iterate", counting)
    newton_schulz_many(mats(), dtype="fp32")
    assert sorted(shapes) == sorted([(4, 48, 96), (2, 64, 64), (2, 32, 80), (1, 24, 40)])


def test_edge_cases() -> None:
    assert newton_schulz_many([]) == []
    with pytest.raises(ValueError, match="2-D"):
        newton_schulz_many([torch.randn(2, 4, 8)])
    # Same oriented shape but different dtypes: separate buckets, each still its own result.
    a, b = torch.randn(16, 8), torch.randn(8, 16, dtype=torch.float64)
    qa, qb = newton_schulz_many([a, b], dtype="fp32")
    assert torch.equal(qa, newton_schulz(a, dtype="fp32")) and torch.equal(qb, newton_schulz(b, dtype="fp32"))
