"""The Muon family's elementwise work as four passes over memory (orscale/muon_passes.py): the
traffic of a 1.1b step outside Newton–Schulz's matmuls, counted on `meta`; the passes compiled
(inductor on the CPU) equal to the eager ones."""

from __future__ import annotations

import pytest
import torch

from bench.bench_ns_bytes import muon_step_counts
from bench.gpu_phases import ns_flops
from orscale import MuonFamily


@pytest.mark.parametrize("optim", ["orscale_lm", "muon_moonlight"])
def test_a_1_1b_step_moves_at_most_50_gb_outside_the_matmuls(optim: str) -> None:
    """Each pass counted as one kernel (its inputs read once, its outputs written once): 38 bytes an
    element of the 1.147 B matrix weights (16 momentum, 6 normalise, 6 norms, 10 update) = 43.6 GB;
    the step before the passes moved 142 GB in 243 ops. The matmuls stay NS₅'s 61.6 TFLOP."""
    counts = muon_step_counts("1.1b", optim, "bf16")
    assert counts.non_matmul_bytes <= 50e9, counts.non_matmul_bytes / 1e9
    assert len([op for op in counts.ops if not op.flops]) <= 80
    from models import get_preset

    c = get_preset("1.1b")
    d = c.d_model
    shapes = [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * c.n_layer
    assert counts.matmul_flops == pytest.approx(sum(ns_flops(s, 5) for s in shapes), rel=1e-9)
    assert counts.non_matmul_bytes == pytest.approx(38 * sum(m * n for m, n in shapes), rel=0.01)


def _run(compile_passes: bool, variant: str) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    params = [(f"blocks.{i}.w", torch.nn.Parameter(torch.randn(s, generator=gen))) for i, s in enumerate(SHAPES)]
    opt = MuonFamily(params, lr=0.02, variant=variant, ns_dtype="bf16", compile_passes=compile_passes)
    for t in range(3):
        gen = torch.Generator().manual_seed(10 + t)
        for _, p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return [p.detach().clone() for _, p in params] + [opt.state[p]["momentum_buffer"] for _, p in params]


SHAPES = [(48, 16), (16, 48), (32, 16), (16, 16)]


@pytest.mark.slow  # inductor compiles the four passes' C++ (~30 s on a cold cache)
@pytest.mark.parametrize("variant", ["orscale_lm", "muon_moonlight"])
def test_compiled_passes_equal_the_eager_ones(variant: str) -> None:
    import torch._inductor.config

    eager = _run(False, variant)
    with torch._inductor.config.patch(compile_threads=2):  # C++ kernels compiled two at a time (threads)
        compiled = _run(True, variant)
    for a, b in zip(compiled, eager, strict=True):
        assert (a - b).abs().max().item() <= 1e-6 * b.abs().max().item()
