"""Which step takes which tensor of models built from Hugging Face configs (tiny, built locally): the
model's own answers when it is given (nn.Embedding, get_output_embeddings(), the output layer outside
its body), and one warning, naming the tensors, wherever the rule guesses from names or shapes."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from orscale import OrScaleLM

pytestmark = pytest.mark.usefixtures("one_thread")


def _routed(params, **kw) -> tuple[dict[str, set[str]], list[str]]:
    """The 2-D tensors' names by kind, and the routing warnings raised while building the optimizer."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = OrScaleLM(params, **kw)
    kinds: dict[str, set[str]] = {"muon": set(), "adamw": set()}
    for g in opt.param_groups:
        kinds[g["kind"]] |= {n for n, p in zip(g["param_names"], g["params"], strict=True) if p.ndim == 2}
    return kinds, [str(w.message) for w in caught if "routing guessed" in str(w.message)]


def _t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    return T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2))


def _bert_classifier() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    sizes = dict(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    return BertForSequenceClassification(BertConfig(**sizes, max_position_embeddings=32, num_labels=3))


T5_ADAMW = {
    "shared.weight",
    "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
    "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
}


def test_t5_shared_embedding_and_relative_attention_bias_are_adamws() -> None:
    """T5's embeddings (`shared`, tied to the head, and the relative attention biases: nn.Embedding)
    take AdamW, from the model or from the names alone; the names alone say so in one warning."""
    model = _t5()
    kinds, guessed = _routed(model)
    assert kinds["adamw"] == T5_ADAMW and len(kinds["muon"]) == 16 and guessed == []
    by_names, guessed = _routed(model.named_parameters())
    assert by_names == kinds
    assert len(guessed) == 1 and "no model given" in guessed[0] and "shared.weight" in guessed[0]


def test_gpt2_block_matrix_of_the_embeddings_shape_is_not_the_head() -> None:
    """GPT-2 with vocabulary = 4 x width: its MLP's c_proj (Conv1D, [4·width, width]) has the token
    embedding's shape, but sits in a numbered block: every block matrix takes the Muon step, by names
    as by the model."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=16))
    blocks = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    hidden = {f"transformer.h.{i}.{m}.weight" for i in range(2) for m in blocks}
    kinds, guessed = _routed(model)
    assert kinds["muon"] == hidden and guessed == []
    by_names, guessed = _routed(model.named_parameters())
    assert by_names == kinds and len(guessed) == 1


def test_classifier_heads_are_adamws() -> None:
    """A classifier head (the last nn.Linear outside the base model) takes AdamW; BERT's pooler, a
    hidden matrix of the base model, the Muon step."""
    from transformers import ViTConfig, ViTForImageClassification

    model = _bert_classifier()
    kinds, guessed = _routed(model)
    assert "classifier.weight" in kinds["adamw"] and "bert.pooler.dense.weight" in kinds["muon"] and guessed == []
    by_names, guessed = _routed(model.named_parameters())
    assert by_names == kinds and len(guessed) == 1 and "output head classifier.weight" in guessed[0]
    sizes = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    vit = ViTForImageClassification(ViTConfig(**sizes, image_size=8, patch_size=4, num_labels=3))
    kinds, guessed = _routed(vit)
    assert kinds["adamw"] == {"classifier.weight"} and len(kinds["muon"]) == 6 and guessed == []


class RawHeadLM(nn.Module):
    """A language model whose head is a bare parameter used with F.linear: no module says it is one."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(20, 8)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.out = nn.Parameter(torch.zeros(20, 8))


def test_head_guessed_by_its_shape_says_so() -> None:
    kinds, guessed = _routed(RawHeadLM())
    assert kinds == {"muon": {"blocks.0.weight", "blocks.1.weight"}, "adamw": {"tok.weight", "out"}}
    assert len(guessed) == 1 and "'out' taken as the output head by its shape (20, 8)" in guessed[0]
    assert "muon_names=[...]" in guessed[0]  # how to override
    kinds, _ = _routed(RawHeadLM(), muon_names=[r"^out$"])
    assert "out" in kinds["muon"]
