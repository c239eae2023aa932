"""The Muon family's elementwise work as four passes over memory (orscale/muon_passes.py): the
traffic of a 1.1b step outside Newton–Schulz's matmuls, counted on `meta`; the passes compiled
(inductor on the CPU) equal to the eager ones; one graph per pass and shape whatever the LR does;
what a failed compile and an error while a compiled pass runs each do."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch._dynamo
from torch import fx, nn

from bench.bench_ns_bytes import muon_step_counts
from bench.gpu_phases import ns_flops
from orscale import MuonFamily, muon_passes
from orscale.muon_passes import momentum_pass
from orscale.variants import VARIANTS


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
        opt.param_groups[0]["lr"] = 0.02 * (t + 1) / 3  # a warmup: the LR of each step a graph input
        gen = torch.Generator().manual_seed(10 + t)
        for _, p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return [p.detach().clone() for _, p in params] + [opt.state[p]["momentum_buffer"] for _, p in params]


SHAPES = [(48, 16), (16, 48), (32, 16), (16, 16)]


@pytest.mark.slow  # inductor compiles the four passes' C++ (~30 s on a cold cache)
@pytest.mark.parametrize("variant", ["orscale_lm", "muon_moonlight"])
def test_compiled_passes_equal_the_eager_ones(variant: str, fresh_passes: None) -> None:
    """Inductor's passes under a changing LR: the eager step's numbers, from one graph per pass and
    shape (momentum, the three buckets' normalisations, norms, update)."""
    import torch._inductor.config

    eager = _run(False, variant)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch._inductor.config.patch(compile_threads=2):  # C++ kernels compiled two at a time (threads)
        compiled = _run(True, variant)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 6
    for a, b in zip(compiled, eager, strict=True):
        assert (a - b).abs().max().item() <= 1e-6 * b.abs().max().item()


# ---------------------------------------------------------------- compiling the passes
@pytest.fixture
def fresh_passes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No pass compiled or given up on yet, and dynamo's caches empty (a test's backend gets every graph)."""
    monkeypatch.setattr(muon_passes, "_COMPILED", {})
    monkeypatch.setattr(muon_passes, "_FAILED", set())
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class GraphCount:
    """A torch.compile backend that runs each graph as dynamo traced it, counting the graphs by their
    inputs (name, shape, dtype): a graph compiled again for the same inputs is a recompile."""

    def __init__(self) -> None:
        self.graphs: Counter[tuple[Any, ...]] = Counter()

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        names = [node.name for node in gm.graph.find_nodes(op="placeholder")]
        self.graphs[
            tuple(
                (name, tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else (name, x)
                for name, x in zip(names, example_inputs, strict=True)
            )
        ] += 1
        return gm.forward


def _matrices(seed: int = 0) -> list[tuple[str, nn.Parameter]]:
    gen = torch.Generator().manual_seed(seed)
    return [(f"blocks.{i}.w", nn.Parameter(torch.randn(s, generator=gen))) for i, s in enumerate([(12, 8), (8, 12)])]


def _grads(params: list[tuple[str, nn.Parameter]], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _, p in params:
        p.grad = torch.randn(p.shape, generator=gen)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_warmup_from_lr_0_compiles_each_pass_once(
    variant: str, fresh_passes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four steps of a warmup (LR 0, then rising): the four passes of one bucket compile one graph
    each, at their first step, and every later LR reuses it (no LR, 1 − ηλ or flag baked in)."""
    count = GraphCount()
    monkeypatch.setattr(muon_passes, "BACKEND", count)
    params = _matrices()
    opt = MuonFamily(params, lr=0.02, variant=variant, compile_passes=True)
    for t, lr in enumerate((0.0, 0.01, 0.015, 0.02)):
        opt.param_groups[0]["lr"] = lr
        _grads(params, t)
        opt.step()
    assert len(count.graphs) == 4 and set(count.graphs.values()) == {1}, count.graphs


def test_an_error_while_a_compiled_pass_runs_propagates_and_the_pass_is_not_run_again(
    fresh_passes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The momentum pass compiles, runs (M ← μ·0 + G written) and then runs out of memory: the error
    reaches the caller (who may retry with a smaller batch) and M holds one application, not two."""

    def runs_then_fails(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            gm.forward(*args)
            raise torch.OutOfMemoryError("CUDA out of memory (raised after the pass wrote its buffers)")

        return run

    monkeypatch.setattr(muon_passes, "BACKEND", runs_then_fails)
    params = _matrices()
    before = [p.detach().clone() for _, p in params]
    opt = MuonFamily(params, lr=0.02, momentum=0.9, compile_passes=True)
    _grads(params, 0)
    with pytest.raises(torch.OutOfMemoryError, match="after the pass wrote"):
        opt.step()
    for (_, p), w in zip(params, before, strict=True):
        assert torch.equal(opt.state[p]["momentum_buffer"], p.grad)  # twice would be (1 + μ)·G
        assert torch.equal(p, w)
    assert not muon_passes._FAILED  # the next step compiles again


def test_running_out_of_memory_while_compiling_reaches_the_caller(
    fresh_passes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of memory inside the compiler (dynamo wraps it) is the caller's out-of-memory error, not a
    reason to give up compiling the pass for the rest of the run; nothing was written."""

    def out_of_memory(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        raise torch.OutOfMemoryError("CUDA out of memory (while autotuning)")

    monkeypatch.setattr(muon_passes, "BACKEND", out_of_memory)
    bufs, grads = [torch.zeros(8, 4)], [torch.ones(8, 4)]
    with pytest.raises(torch.OutOfMemoryError, match="while autotuning"):
        momentum_pass(bufs, grads, 0.9, True, True, False, True)
    assert torch.equal(bufs[0], torch.zeros(8, 4)) and not muon_passes._FAILED


def test_a_pass_that_cannot_be_compiled_runs_eager_with_one_warning(
    fresh_passes: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Inductor with no C++ compiler (a real failed compile, before anything ran): the pass runs eager,
    the same arithmetic, and says so once; the next call does not try again."""
    import torch._inductor.config

    bufs, grads = [torch.zeros(8, 4)], [torch.ones(8, 4)]
    eager = [torch.zeros(8, 4)]
    no_compiler = {"cpp.cxx": (None, "/nonexistent/c++"), "fx_graph_cache": False}
    with torch._inductor.config.patch(no_compiler), caplog.at_level(logging.WARNING, logger="orscale"):
        for _ in range(2):
            assert torch.equal(
                momentum_pass(bufs, grads, 0.9, True, True, False, True)[1],
                momentum_pass(eager, grads, 0.9, True, True, False, False)[1],
            )
    assert torch.equal(bufs[0], eager[0])
    said = [r.getMessage() for r in caplog.records if r.name == "orscale"]
    assert len(said) == 1 and "_momentum could not be compiled (InductorError)" in said[0], said
