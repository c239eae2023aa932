"""The paper's GPT: causality, RoPE, init, preset sizes."""

from __future__ import annotations

import math

import pytest
import torch

from models import GPT, PRESETS, get_preset
from models.gpt import apply_rope, rope_tables
from models.presets import PAPER_PARAM_COUNTS


def small_model(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(get_preset("tiny", n_layer=2, d_model=64, n_head=4, max_seq_len=32, vocab_size=128, **kw))


def test_changing_a_future_token_never_changes_earlier_logits():
    model = small_model()
    idx = torch.randint(0, 128, (2, 20))
    base = model(idx)
    for t in (5, 12, 19):
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 7) % 128
        out = model(changed)
        assert torch.equal(out[:, :t], base[:, :t]), f"logits before position {t} changed"
        assert not torch.allclose(out[:, t:], base[:, t:]), "the changed token had no effect at all"


def test_rope_scores_depend_only_on_relative_position():
    head_dim, n = 16, 40
    cos, sin = rope_tables(n, head_dim, 10000.0)
    torch.manual_seed(1)
    q, k = torch.randn(head_dim), torch.randn(head_dim)
    # Same q and k placed at many positions: <R_i q, R_j k> must depend on i - j only.
    qs = apply_rope(q.expand(1, 1, n, head_dim).contiguous(), cos, sin)[0, 0]
    ks = apply_rope(k.expand(1, 1, n, head_dim).contiguous(), cos, sin)[0, 0]
    scores = qs @ ks.T
    for offset in (0, 3, 11):
        diag = torch.diagonal(scores, offset=-offset)
        assert torch.allclose(diag, diag[0].expand_as(diag), atol=1e-4), offset
    assert not torch.allclose(torch.diagonal(scores, 0)[0], torch.diagonal(scores, -3)[0])
    # RoPE is a rotation: norms are preserved.
    assert torch.allclose(qs.norm(dim=-1), q.norm().expand(n), atol=1e-5)


def test_rope_matches_hf_llama_rotate_half_convention():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    cos, sin = rope_tables(10, 8, 10000.0)
    q, k = torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8)
    hq, hk = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    assert torch.allclose(apply_rope(q, cos, sin), hq, atol=1e-6)
    assert torch.allclose(apply_rope(k, cos, sin), hk, atol=1e-6)


@pytest.mark.parametrize("name", ["125m", "399m", "545m", "1.1b"])
def test_preset_parameter_counts_match_the_paper(name):
    with torch.device("meta"):
        model = GPT(PRESETS[name])
    count = model.num_params()
    assert abs(count - PAPER_PARAM_COUNTS[name]) / PAPER_PARAM_COUNTS[name] < 0.01, count


def test_init_statistics_tied_head_and_no_biases():
    torch.manual_seed(0)
    model = GPT(get_preset("tiny", n_layer=4, d_model=256, n_head=4, max_seq_len=16, vocab_size=4096))
    resid = 0.02 / math.sqrt(2 * 4)
    assert abs(model.tok_emb.weight.std().item() - 0.02) < 1e-3
    assert abs(model.blocks[0].attn.qkv.weight.std().item() - 0.02) < 1e-3
    assert abs(model.blocks[0].mlp.down.weight.std().item() - resid) < 5e-4
    assert abs(model.blocks[0].attn.out.weight.std().item() - resid) < 5e-4
    assert all(p.ndim == 2 or name.endswith("norm.weight") for name, p in model.named_parameters())
    assert not any("bias" in name for name, _ in model.named_parameters())
    assert model.blocks[0].mlp.up.weight.shape == (4 * 256, 256)
    # The head is the embedding: one tensor, counted once.
    assert sum(1 for _ in model.parameters()) == 1 + 4 * 6 + 1


def test_meta_construction_then_init_equals_direct_construction():
    cfg = get_preset("tiny", n_layer=2, d_model=64, n_head=4, max_seq_len=32, vocab_size=128)
    torch.manual_seed(3)
    direct = GPT(cfg)
    with torch.device("meta"):
        lazy = GPT(cfg)
    lazy.to_empty(device="cpu")
    torch.manual_seed(3)
    lazy.init_weights()
    idx = torch.randint(0, 128, (1, 16))
    assert torch.equal(direct(idx), lazy(idx))


def test_longer_than_context_is_an_error():
    model = small_model()
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_bad_shapes_are_errors():
    with pytest.raises(ValueError, match="divisible"):
        get_preset("tiny", d_model=130, n_head=4)
    with pytest.raises(ValueError, match="unknown model.preset"):
        get_preset("7b")
