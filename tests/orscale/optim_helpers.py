"""Small parameter sets and gradient sequences for the optimizer formula tests."""

from __future__ import annotations

import math

import torch
from torch import nn

SHAPES = [(6, 4), (4,), (5, 6), (5,), (3, 5)]


def make_params(seed: int = 0, shapes=SHAPES) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]


def grad_seq(steps: int, seed: int = 1, shapes=SHAPES, spread: float = 3.0) -> list[list[torch.Tensor]]:
    """Random gradients whose block scales differ by up to e^±spread (so the M1 clip binds)."""
    gen = torch.Generator().manual_seed(seed)
    scales = [math.exp(spread * (2 * torch.rand((), generator=gen).item() - 1)) for _ in shapes]
    return [[k * torch.randn(s, generator=gen) for k, s in zip(scales, shapes, strict=True)] for _ in range(steps)]


def run(opt: torch.optim.Optimizer, params: list[nn.Parameter], grads) -> list[list[torch.Tensor]]:
    """Apply the gradient sequence; returns the params after each step."""
    out = []
    for gs in grads:
        for p, g in zip(params, gs, strict=True):
            p.grad = g.to(p.dtype, copy=True)
        opt.step()
        out.append([p.detach().clone() for p in params])
    return out


def assert_close_lists(a, b, rtol=2e-5, atol=1e-6):
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x.double(), y.double(), rtol=rtol, atol=atol)


# ---- the Muon family's tests
def muon_family_members() -> list[str]:
    """The optimizer table's members of the Muon family beyond its variants: a family of its own whose
    hidden matrices go to a MuonFamily subclass (its step through the family's hooks, its own state)."""
    from orscale.registry import OPTIMIZERS
    from orscale.variants import VARIANTS

    return [name for name, spec in OPTIMIZERS.items() if spec.routing == "matrices" and name not in VARIANTS]


def gpt_hidden(name: str, p: torch.Tensor) -> bool:
    """This project's GPT's hidden matrices, as the paper names them: every 2-D weight inside the
    transformer blocks (an oracle independent of orscale.routing's general rule)."""
    from orscale.routing import canonical_name

    return canonical_name(name).startswith("blocks.") and p.ndim == 2


def tiny_gpt(dtype: torch.dtype = torch.float32) -> nn.Module:
    from models.gpt import GPT
    from models.presets import get_preset

    torch.manual_seed(0)
    cfg = get_preset("tiny", vocab_size=256, max_seq_len=32)
    return GPT(cfg).to(dtype)


def backward(model: nn.Module, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, model.cfg.vocab_size, (2, 16), generator=gen)
    model.zero_grad(set_to_none=True)
    logits = model(idx)  # the model's contract: idx [B, T] -> logits [B, T, V]
    targets = torch.roll(idx, -1, 1).flatten()
    loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets)
    loss.backward()


def matrices(shapes=((24, 8), (8, 24), (24, 8), (16, 16)), seed: int = 0) -> list[tuple[str, nn.Parameter]]:
    gen = torch.Generator().manual_seed(seed)
    names = [
        "blocks.0.attn.qkv.weight",
        "blocks.0.mlp.down.weight",
        "blocks.1.attn.qkv.weight",
        "blocks.0.attn.out.weight",
    ]
    return [(n, nn.Parameter(0.02 * torch.randn(s, generator=gen))) for n, s in zip(names, shapes, strict=True)]


def set_grads(named, scale: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _, p in named:
        p.grad = scale * torch.randn(p.shape, generator=gen).to(p.dtype)


class Wrap(nn.Module):
    """A module exposing given (name, param) pairs under their dotted names."""

    def __init__(self, named):
        super().__init__()
        for n, p in named:
            mod = self
            *path, leaf = n.split(".")
            for part in path:
                if not hasattr(mod, part):
                    mod.add_module(part, nn.Module())
                mod = getattr(mod, part)
            mod.register_parameter(leaf, p)


# ---- whole-model optimizers (orscale.OrScaleLM) on a Hugging Face model
def hf_gpt2(tied: bool = True, seed: int = 0) -> nn.Module:
    """A tiny GPT2LMHeadModel built locally (no hub): 2 layers, width 32, vocabulary 96, no dropout
    (so that equal weights give equal gradients)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    sizes = dict(n_layer=2, n_embd=32, n_head=2, vocab_size=96, n_positions=32, bos_token_id=0, eos_token_id=0)
    cfg = GPT2Config(**sizes, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=tied)
    return GPT2LMHeadModel(cfg)


def lm_step_grads(model: nn.Module, seed: int) -> None:
    """Fresh gradients of the language-model loss on a fixed random batch."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, model.config.vocab_size, (2, 16), generator=gen)
    model.zero_grad(set_to_none=True)
    model(idx, labels=idx).loss.backward()
