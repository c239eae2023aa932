"""Newton–Schulz's symmetric Triton kernels (orscale/ns_kernels.py) on the CPU under Triton's
interpreter (TRITON_INTERPRET=1), against torch's products: X Xᵀ and b·A + c·A², partial tiles and
batches; NS₅ through them against the reference iteration; the FLOP count they save at 1.1b."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernels need triton: pip install -e '.[kernels]'")

from orscale import ns_kernels  # noqa: E402
from orscale.newton_schulz import _iterate, newton_schulz_many, ns_schedule  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def kernels():
    """orscale.ns_kernels as Triton's interpreter runs it (tests/conftest.py turns it on)."""
    assert ns_kernels._INTERPRET, "TRITON_INTERPRET=1 must be set before triton is imported"
    return ns_kernels


def batch(k: int, m: int, n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(k, m, n, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("k, m, n", [(2, 40, 70), (1, 16, 16), (3, 33, 50), (1, 7, 5)])
def test_fp32_products_equal_torch_matmul(kernels, k: int, m: int, n: int) -> None:
    """fp32 tiles (the interpreter's `tl.dot` is numpy's): every element, mirrored tiles included."""
    x = batch(k, m, n, torch.float32)
    a = kernels.symmetric_product(x)
    torch.testing.assert_close(a, torch.matmul(x, x.mT), rtol=1e-5, atol=1e-4)
    b = kernels.symmetric_product(a, a, alpha=2.0315, beta=-4.775)
    torch.testing.assert_close(b, -4.775 * a + 2.0315 * torch.matmul(a, a), rtol=1e-5, atol=1e-2)
    assert torch.equal(a, a.mT) and torch.equal(b, b.mT)  # exactly symmetric: one tile, stored twice


def test_bf16_products_round_the_fp32_sums_once(kernels) -> None:
    """bf16 in and out, fp32 sums rounded once (what `torch.bmm` computes): the correctly rounded
    exact product but for a rare tie decided by the fp32 sum's last bit, and never off by more
    than one bf16 step."""
    x = batch(2, 48, 80, torch.bfloat16)
    for got, exact in [
        (kernels.symmetric_product(x), x.double() @ x.double().mT),
        (kernels.symmetric_product(a := torch.bmm(x, x.mT), a, alpha=-2.8, beta=4.04), None),
    ]:
        if exact is None:
            exact = 4.04 * a.double() + -2.8 * (a.double() @ a.double())
        rounded = exact.bfloat16().double()
        assert got.dtype == torch.bfloat16 and (got.double() != rounded).float().mean() < 0.01
        assert ((got.double() - rounded).abs() <= 2**-7 * rounded.abs()).all()


def test_newton_schulz_through_the_kernels_matches_the_reference(kernels, monkeypatch) -> None:
    """NS₅ (Polar Express) on a bucket of bf16 matrices: the kernels' iteration against torch's, and
    both against the fp32 reference, equally close (bf16 rounding apart)."""
    m = batch(3, 24, 56, torch.float32, seed=1)
    schedule = ns_schedule("polar_express", 5)
    x = (m / (1.02 * torch.linalg.vector_norm(m, dim=(-2, -1), keepdim=True) + 1e-6)).bfloat16()
    assert not kernels.usable(x)  # on the CPU only when asked for, as here
    got, ref = kernels.iterate_symmetric(x, schedule), _iterate(x, schedule)
    exact = _iterate(x.float(), schedule)
    rel = lambda a: ((a.float() - exact).norm() / exact.norm()).item()  # noqa: E731
    assert rel(got) < 0.03 and rel(ref) < 0.03  # bf16 NS₅ against fp32 NS₅
    assert ((got.float() - ref.float()).norm() / exact.norm()).item() < 0.01  # 0 on this CPU
    # the optimizer's path (kernel="auto"), with the kernels answering as on CUDA
    monkeypatch.setattr(kernels, "usable", lambda t: True)
    calls = []
    monkeypatch.setattr(
        kernels, "iterate_symmetric", lambda t, s, f=kernels.iterate_symmetric: calls.append(t.shape) or f(t, s)
    )
    mats = list(m) + [m[0].T.contiguous()]
    many = newton_schulz_many(mats, dtype="bf16", kernel="auto", norms=torch.stack([t.norm() for t in mats]))
    assert calls == [(4, 24, 56)]  # one bucket, the tall matrix transposed into it
    torch.testing.assert_close(many[-1].float(), many[0].T.float(), rtol=0, atol=0.02)


def test_fp32_and_cpu_batches_stay_on_torch(kernels) -> None:
    assert not kernels.usable(batch(1, 8, 8, torch.float32)) and not kernels.usable(batch(1, 8, 8, torch.bfloat16))
    with pytest.raises(ValueError, match="kernel must be one of"):
        newton_schulz_many([torch.randn(4, 8)], kernel="cuda")


def test_the_kernels_halve_the_symmetric_products_at_1_1b() -> None:
    """61.6 → ~44 TFLOP per step for the 1.1b matrices with 128-row tiles (docs/gpu.md)."""
    from bench.gpu_phases import ns_flops
    from models import get_preset

    c = get_preset("1.1b")
    d = c.d_model
    shapes = [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * c.n_layer
    full = sum(ns_flops(s, 5) for s in shapes)
    half = sum(ns_kernels.symmetric_flops(s, 5) for s in shapes)
    assert full == pytest.approx(61.64e12, rel=1e-3)
    assert half == pytest.approx(44.6e12, rel=0.01)


def test_the_self_check_spans_several_tiles_with_uneven_edges(kernels, monkeypatch) -> None:
    """`verified` runs the GPU's tiling (here under the interpreter): a batch of three tiles a side
    with a partial last tile and a partial k-step, so off-diagonal, mirrored and masked tiles are
    all checked, and the kernels pass it."""
    monkeypatch.setattr(kernels, "TILES", kernels.GPU_TILES)
    monkeypatch.setattr(kernels, "_VERIFIED", {})
    grids, real = [], kernels._symmetric_kernel

    class Spy:
        def __getitem__(self, grid):
            grids.append(grid)
            return real[grid]

    monkeypatch.setattr(kernels, "_symmetric_kernel", Spy())
    assert kernels.verified(torch.device("cpu"))
    shapes = kernels.check_shapes()
    big = max(shapes, key=lambda s: s[1])
    block, block_k, _ = kernels.GPU_TILES[0]
    assert big[1] % block and big[2] % block_k  # partial last tile and k-step
    assert max(g[0] for g in grids) >= 3 and all(g[0] == g[1] for g in grids)
