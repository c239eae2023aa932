"""The head and fused loss under torch.compile in every compile mode (docs/gpu.md): one graph and no
break for the model and for the head alone, no eager `aten::logsumexp` left in a compiled training
step (inductor on the CPU), the compiled numbers equal to eager ones within fp32 rounding; the
chunking and the fp32 accumulation of the head's weight gradient."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import models.fused_loss as fused_loss
from bench.op_bytes import count_ops
from launch.backends.registry import backend_for
from launch.config import ParallelConfig
from launch.engine.parallelize import build_model
from launch.runtime.process_group import DistEnv
from models import GPT, get_preset
from models.fused_loss import default_chunk_rows, fused_linear_cross_entropy

pytestmark = pytest.mark.usefixtures("one_thread")

V = 97
TINY = dict(n_layer=1, d_model=32, n_head=2, max_seq_len=16, vocab_size=V)


def batch(rows: int = 2, seq: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return torch.randint(0, V, (rows, seq), generator=gen), torch.randint(0, V, (rows, seq), generator=gen)


def test_chunks_are_spread_evenly_within_the_cap() -> None:
    """125m and 1.1b take 32 × 1024 and 8 × 4096 tokens a step: eager chunks of at most
    CHUNK_ELEMENTS fp32 logits; compiled with bf16 logits, twice the rows in whole GEMM tiles."""
    for logits_bytes in (4, 2):
        cap = fused_loss.CHUNK_ELEMENTS * 4 // logits_bytes // 50304
        rows = default_chunk_rows(50304, 32768, logits_bytes)
        chunks = -(-32768 // rows)
        assert rows <= cap and chunks == -(-32768 // cap)  # no more chunks than the cap needs
        assert 32768 - (chunks - 1) * rows > rows // 2  # and no short tail chunk
    assert default_chunk_rows(50304, 32768, 2) == 2560  # 13 chunks of 20 tiles of 128 rows
    assert default_chunk_rows(50304, 100) == 100  # one chunk when the whole fits
    assert default_chunk_rows(97, 26) == 26
    assert all(default_chunk_rows(10, n) <= max(1, fused_loss.CHUNK_ELEMENTS // 10) for n in (1, 7, 10**9))


def test_weight_gradient_accumulates_in_fp32_without_a_16_bit_vocab_by_width_temporary() -> None:
    """On `meta` (answering as CUDA does): with bf16 inputs, no op writes a bf16 [V, d] tensor; the
    head's weight gradient goes into its fp32 accumulator through the one in-place GEMM per chunk."""
    n, d, vocab = 4096, 64, 50304
    h = torch.empty(n, d, device="meta", dtype=torch.bfloat16, requires_grad=True)
    w = torch.empty(vocab, d, device="meta", dtype=torch.bfloat16, requires_grad=True)
    t = torch.zeros(n, device="meta", dtype=torch.long)
    _, counts = count_ops(lambda: fused_linear_cross_entropy(h, w, t, chunk_rows=1024))
    assert counts.outputs(shape=(vocab, d), dtype=torch.bfloat16) == []
    accumulations = counts.named("accumulate_grad_w")
    assert len(accumulations) == 4 and all(op.outputs == [((vocab, d), torch.float32)] for op in accumulations)


def test_model_and_head_each_trace_as_one_graph_without_breaks() -> None:
    """`torch._dynamo.explain`: GPT.forward(idx, targets) (parallel.compile=model) and GPT.head_loss
    (what parallel.compile=blocks compiles besides the blocks), in training and in evaluation."""
    model = GPT(get_preset("tiny", **TINY), seed=0)
    idx, targets = batch()
    x = torch.randn(2, 16, 32)
    for fn, args in ((model.forward, (idx, targets)), (model.head_loss, (x, targets))):
        for grad in (True, False):
            torch._dynamo.reset()
            with torch.set_grad_enabled(grad):
                explained = torch._dynamo.explain(fn)(*args)
            assert (explained.graph_count, explained.graph_break_count) == (1, 0), (fn.__name__, grad)


def _step(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    loss = model(idx, targets)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


@pytest.mark.slow  # inductor compiles C++ for the CPU: ~10-40 s a mode on a cold cache
@pytest.mark.parametrize("mode", ["blocks", "model"])
def test_compiled_training_step_runs_no_eager_logsumexp_and_equals_eager(monkeypatch, mode: str) -> None:
    """A training step of a tiny model compiled by inductor (the CPU's C++ backend): the profiler
    sees no `aten::logsumexp` (the eager loss runs one per chunk, 7 here), and the loss and every
    gradient equal eager's within fp32 rounding."""
    import torch._inductor.config

    monkeypatch.setattr(fused_loss, "CHUNK_ELEMENTS", 5 * V)  # 7 chunks of 5 rows for 32 rows
    env = DistEnv(0, 1, 0, torch.device("cpu"), "none")
    cfg = get_preset("tiny", **TINY)
    one = backend_for("none")
    eager = build_model(cfg, ParallelConfig(backend="none", compile="none"), 7, env, backend=one)
    compiled = build_model(
        cfg, ParallelConfig(backend="none", compile=mode), 7, env, compile_backend="inductor", backend=one
    )
    idx, targets = batch()
    torch._dynamo.reset()
    with torch._inductor.config.patch(compile_threads=2):  # C++ kernels compiled two at a time (threads)
        _step(compiled, idx, targets)  # compiles
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss, grads = _step(compiled, idx, targets)
    names = [e.name for e in prof.events()]
    assert names.count("aten::logsumexp") == 0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ref_loss, ref_grads = _step(eager, idx, targets)
    assert [e.name for e in prof.events()].count("aten::logsumexp") >= 7  # eager, counted alike: one a chunk at least
    assert abs(loss.item() - ref_loss.item()) <= 1e-5 * ref_loss.item()
    for (name, _), a, b in zip(eager.named_parameters(), grads, ref_grads, strict=True):
        err = (a - b).abs().max().item()
        assert err <= 1e-5 * b.abs().max().item(), (name, err)
