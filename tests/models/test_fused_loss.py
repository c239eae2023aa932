"""The chunked (fused linear) cross-entropy against the materialised-logits reference: value and
gradients in fp32, bf16 autocast, ignore_index, per-token losses, torch.compile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import models.fused_loss as fused_loss
from models import GPT, get_preset
from models.fused_loss import chunked_token_losses, fused_linear_cross_entropy

pytestmark = pytest.mark.usefixtures("one_thread")

V = 97  # a small vocabulary; chunk sizes below do not divide N, so the last chunk is partial


def tol(x: torch.Tensor, y: torch.Tensor, rel: float) -> None:
    """|x − y| ≤ rel · max|y| elementwise (relative to the tensor's scale: gradient entries near 0
    have no meaningful relative error)."""
    err = (x.double() - y.double()).abs().max().item()
    assert err <= rel * max(y.abs().max().item(), 1e-30), (err, y.abs().max().item())


def inputs(n: int = 53, d: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=gen).requires_grad_()
    w = torch.randn(V, d, generator=gen).requires_grad_()
    return h, w, torch.randint(0, V, (n,), generator=gen)


def reference(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(h, w).float(), t)


@pytest.mark.parametrize("chunk_rows", [1, 7, 53, 1000])
def test_value_and_gradients_match_reference_fp32(chunk_rows: int) -> None:
    h, w, t = inputs()
    ref = reference(h, w, t)
    ref_gh, ref_gw = torch.autograd.grad(ref * 2.5, (h, w))  # a grad_output other than 1
    loss = fused_linear_cross_entropy(h, w, t, chunk_rows=chunk_rows)
    gh, gw = torch.autograd.grad(loss * 2.5, (h, w))
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert abs(loss.item() - ref.item()) <= 1e-6 * abs(ref.item())
    tol(gh, ref_gh, 1e-6)
    tol(gw, ref_gw, 1e-6)


def test_ignore_index() -> None:
    h, w, t = inputs()
    t[::4] = -100
    ref = reference(h, w, t)
    ref_g = torch.autograd.grad(ref, (h, w))
    loss = fused_linear_cross_entropy(h, w, t, chunk_rows=7)
    g = torch.autograd.grad(loss, (h, w))
    assert abs(loss.item() - ref.item()) <= 1e-6 * abs(ref.item())
    for a, b in zip(g, ref_g, strict=True):
        tol(a, b, 1e-6)
    assert torch.all(g[0][::4] == 0)  # ignored rows get no gradient
    # No counted target: NaN loss and zero gradients, as F.cross_entropy gives.
    t[:] = -100
    loss = fused_linear_cross_entropy(h, w, t, chunk_rows=7)
    assert torch.isnan(loss) and torch.isnan(reference(h, w, t))
    assert torch.all(torch.autograd.grad(loss, h)[0] == 0)


def test_no_grad_path_and_token_losses() -> None:
    h, w, t = inputs()
    t[3] = t[20] = -100
    ref = F.cross_entropy(F.linear(h, w), t, reduction="none")
    got = chunked_token_losses(h, w, t, chunk_rows=7)
    assert got.shape == (53,) and got.dtype == torch.float32 and not got.requires_grad
    tol(got, ref, 1e-6)
    assert got[3] == 0 and got[20] == 0
    with torch.no_grad():
        loss = fused_linear_cross_entropy(h, w, t, chunk_rows=7)
    assert abs(loss.item() - reference(h, w, t).item()) <= 1e-6 * loss.item()
    # A downstream batch: a few scored rows (only they meet the head), or none at all.
    few = torch.full_like(t, -100)
    few[[5, 6, 40]] = t[[5, 6, 40]]
    got = chunked_token_losses(h, w, few, chunk_rows=7)
    tol(got[[5, 6, 40]], ref[[5, 6, 40]], 1e-6)
    assert torch.count_nonzero(got) == 3
    assert torch.equal(chunked_token_losses(h, w, torch.full_like(t, -100)), torch.zeros(53))


def test_bf16_autocast_close_to_reference_bf16_path() -> None:
    """Under autocast both compute the logits in bf16 from the same bf16 inputs, so the loss and
    ∂/∂h agree to fp32 rounding; ∂/∂W differs by bf16 rounding (measured ≈ 2e-3 relative norm):
    the reference rounds the whole [V, d] product to bf16, we sum per-chunk bf16 products in fp32."""
    h, w, t = inputs(n=512, d=64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = reference(h, w, t)
        ref_gh, ref_gw = torch.autograd.grad(ref, (h, w))
        loss = fused_linear_cross_entropy(h, w, t, chunk_rows=37)
        gh, gw = torch.autograd.grad(loss, (h, w))
    assert loss.dtype == gh.dtype == gw.dtype == torch.float32
    assert abs(loss.item() - ref.item()) <= 1e-6 * ref.item()
    tol(gh, ref_gh, 1e-5)
    assert ((gw - ref_gw).norm() / ref_gw.norm()).item() < 8e-3  # two bf16 epsilons


def test_bf16_weights_give_bf16_gradients() -> None:
    """FSDP2 with a bf16 param dtype: inputs and weight in bf16, gradients returned in bf16."""
    h, w, t = inputs()
    hb, wb = h.detach().bfloat16().requires_grad_(), w.detach().bfloat16().requires_grad_()
    loss = fused_linear_cross_entropy(hb, wb, t, chunk_rows=7)
    gh, gw = torch.autograd.grad(loss, (hb, wb))
    assert loss.dtype == torch.float32 and gh.dtype == gw.dtype == torch.bfloat16
    ref = reference(hb, wb, t)
    assert abs(loss.item() - ref.item()) <= 1e-6 * ref.item()
    ref_gh, ref_gw = torch.autograd.grad(ref, (hb, wb))
    tol(gh, ref_gh, 1e-2)
    tol(gw, ref_gw, 1e-2)


@pytest.fixture
def gpt(monkeypatch: pytest.MonkeyPatch) -> GPT:
    monkeypatch.setattr(fused_loss, "CHUNK_ELEMENTS", 5 * V)  # 5 rows per chunk, N = 26
    return GPT(get_preset("tiny", n_layer=2, d_model=64, n_head=4, max_seq_len=32, vocab_size=V), seed=1)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return torch.randint(0, V, (2, 13), generator=gen), torch.randint(0, V, (2, 13), generator=gen)


def old_loss(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """GPT.forward's loss before the fused loss: the full logits, then F.cross_entropy."""
    logits = model(idx)
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


@pytest.mark.parametrize("bf16", [False, True])
def test_gpt_loss_and_all_parameter_grads(gpt: GPT, bf16: bool) -> None:
    """Every parameter's gradient, the tied embedding/head one included (embedding + head grad)."""
    idx, targets = batch()
    params = dict(gpt.named_parameters())
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        ref = old_loss(gpt, idx, targets)
        ref_g = torch.autograd.grad(ref, list(params.values()))
        loss = gpt(idx, targets)
        g = torch.autograd.grad(loss, list(params.values()))
    assert abs(loss.item() - ref.item()) <= 1e-6 * ref.item()
    for name, a, b in zip(params, g, ref_g, strict=True):
        if bf16 and name == "tok_emb.weight":  # the head's bf16 rounding, see the autocast test
            assert ((a - b).norm() / b.norm()).item() < 8e-3, name
        else:  # upstream of the head's ∂/∂h the two paths are the same ops on the same values
            tol(a, b, 1e-5 if bf16 else 1e-6)


def test_gpt_token_losses(gpt: GPT) -> None:
    idx, targets = batch()
    targets[0, -3:] = -100
    got = gpt.token_losses(idx, targets)
    assert got.shape == (2, 13) and got.dtype == torch.float32 and not got.requires_grad
    with torch.no_grad():
        ref = F.cross_entropy(gpt(idx).float().transpose(1, 2), targets, reduction="none")
    tol(got, ref, 1e-6)
    assert torch.all(got[0, -3:] == 0)
    assert gpt(idx).shape == (2, 13, V)  # forward without targets still gives the logits


def test_compiled_gpt_gives_the_same_loss_and_grads(gpt: GPT) -> None:
    """The whole module under torch.compile without a graph break (fullgraph); AOTAutograd traces
    the Function's forward and backward into its joint graph, so no fallback is needed."""
    idx, targets = batch()
    params = list(gpt.parameters())
    ref = old_loss(gpt, idx, targets)
    ref_g = torch.autograd.grad(ref, params)
    torch._dynamo.reset()
    compiled = torch.compile(gpt, backend="aot_eager", fullgraph=True)
    loss = compiled(idx, targets)
    g = torch.autograd.grad(loss, params)
    assert abs(loss.item() - ref.item()) <= 1e-6 * ref.item()
    for a, b in zip(g, ref_g, strict=True):
        tol(a, b, 1e-6)
