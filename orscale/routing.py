"""Parameter routing: which optimizer owns which parameter (SPEC §1 "Which parameters", §2).

* ``adamw``: one AdamW over every parameter (decay on all of them, as in the paper), unless
  ``optim.exempt_norms_and_embeddings`` puts 1-D params and embeddings in a wd = 0 group.
* Muon family: every 2-D weight inside the transformer blocks (names ``blocks.*``) goes to the
  matrix optimizer; everything else (token embedding = tied LM head, norm gains) to AdamW, at
  ``optim.adamw_lr`` / ``optim.adamw_weight_decay`` (null: the matrices' LR and decay) and the same
  exemption rule.
* "The AdamW group" is that same set of parameters in every family: with ``adamw_lr`` or
  ``adamw_weight_decay`` set, ``adamw`` puts the hidden matrices and the rest in groups of their
  own, and CBP/LAMB/LARS give the embedding a group of its own (CBP still equalises it with the
  matrices: groups of one ``role`` share M1's target). A group's peak LR over ``optim.lr`` is its
  ``LR_SCALE`` key (``orscale.schedule``); unset settings leave today's groups unchanged.
* CBP, LAMB, LARS (``optim_config.ELEMENTWISE``): every parameter, each tensor one block, in two
  groups: tensors with ≥ 2 dims (the block matrices and the embedding) and 1-D ones (norm gains,
  biases). CBP equalises each group among itself (c is the group's mean energy, so a norm gain is
  not scaled against a matrix); both groups take decoupled decay (the 1-D one none with
  ``exempt_norms_and_embeddings``, which also exempts the embedding). LAMB and LARS keep their
  standard convention: trust ratio and decay on the ≥ 2-D group only.

``route_parameters`` is the one place this is decided; every optimizer builder (single process,
DDP, FSDP2, DeepSpeed ZeRO) calls it. ``model.named_parameters()`` deduplicates shared tensors, so
a tied embedding/head appears once.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from orscale.optim_config import ELEMENTWISE, OptimConfig
from orscale.schedule import LR_SCALE

NamedParams = list[tuple[str, nn.Parameter]]

# Wrappers that prefix parameter names without changing the model: torch.compile, DDP,
# activation checkpointing, FSDP1. Routing looks at the name with these removed.
_WRAPPER_PREFIX = re.compile(r"(^|\.)(_orig_mod|module|_fsdp_wrapped_module|_checkpoint_wrapped_module)\.")


def canonical_name(name: str) -> str:
    """'_orig_mod.blocks.0.attn.qkv.weight' -> 'blocks.0.attn.qkv.weight'."""
    prev = None
    while prev != name:
        prev, name = name, _WRAPPER_PREFIX.sub(r"\1", name)
    return name


def is_matrix_param(name: str, p: torch.Tensor) -> bool:
    """A 2-D weight inside the transformer blocks (fused QKV, attn out, MLP up/down)."""
    return canonical_name(name).startswith("blocks.") and p.ndim == 2


@dataclass
class Routing:
    """Every trainable parameter exactly once: the matrices for the Muon family (empty for
    ``adamw``), AdamW's param groups (``{"params": [(name, p), ...], "weight_decay": wd}``), and
    the param groups of an elementwise optimizer (CBP, LAMB, LARS; each with a ``role``)."""

    matrices: NamedParams
    adamw_groups: list[dict[str, Any]]
    elementwise: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def _elementwise_groups(named: NamedParams, model: nn.Module, cfg: OptimConfig) -> list[dict[str, Any]]:
    emb = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    mats = [(n, p) for n, p in named if p.ndim >= 2]
    vecs = [(n, p) for n, p in named if p.ndim < 2]
    wd, own = cfg.weight_decay, cfg.own_adamw_group
    # With the AdamW group's own settings, the embedding leaves the matrices' group (first, where it
    # stood: CBP pools the role's energies in this order, so an equal setting changes no bit).
    emb_mats = [(n, p) for n, p in mats if id(p) in emb] if own else []
    mats = [(n, p) for n, p in mats if not (own and id(p) in emb)]
    groups: list[dict[str, Any]]
    if cfg.name == "cbp":
        exempt = cfg.exempt_norms_and_embeddings
        groups = [
            {
                "params": emb_mats,
                "weight_decay": 0.0 if exempt else cfg.adamw_decay,
                "role": "embedding" if exempt else "matrices",
            },
            {
                "params": [(n, p) for n, p in mats if not (exempt and id(p) in emb)],
                "weight_decay": wd,
                "role": "matrices",
            },
            {"params": [(n, p) for n, p in mats if exempt and id(p) in emb], "weight_decay": 0.0, "role": "embedding"},
            {"params": vecs, "weight_decay": 0.0 if exempt else (cfg.adamw_decay if own else wd), "role": "vectors"},
        ]
    else:  # LAMB, LARS: trust ratio and decay on matrices, neither on 1-D tensors
        groups = [
            {"params": mats, "weight_decay": wd, "trust": True, "role": "matrices"},
            {"params": emb_mats, "weight_decay": cfg.adamw_decay, "trust": True, "role": "embedding"},
            {"params": vecs, "weight_decay": 0.0, "trust": False, "role": "vectors"},
        ]
    if own:  # every group but the hidden matrices' is "the AdamW group"
        for g in groups:
            if not (g["params"] and all(is_matrix_param(n, p) for n, p in g["params"])):
                g[LR_SCALE] = cfg.adamw_lr_scale
    return [g for g in groups if g["params"]]


def _adamw_groups(
    named: NamedParams, model: nn.Module, cfg: OptimConfig, weight_decay: float, lr_scale: float | None
) -> list[dict[str, Any]]:
    """One decayed group; with the exemption flag, 1-D params and embeddings in a wd = 0 group.
    `lr_scale`: the groups' peak LR over optim.lr (None: no key, the groups follow optim.lr)."""
    if not named:
        return []
    scale = {} if lr_scale is None else {LR_SCALE: lr_scale}
    if not cfg.exempt_norms_and_embeddings:
        return [{"params": named, "weight_decay": weight_decay, **scale}]
    emb = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    exempt_ids = {id(p) for n, p in named if p.ndim < 2 or id(p) in emb or canonical_name(n) == "tok_emb.weight"}
    decayed = [(n, p) for n, p in named if id(p) not in exempt_ids]
    exempt = [(n, p) for n, p in named if id(p) in exempt_ids]
    return [
        g
        for g in (
            {"params": decayed, "weight_decay": weight_decay, **scale},
            {"params": exempt, "weight_decay": 0.0, **scale},
        )
        if g["params"]
    ]


def route_parameters(model: nn.Module, cfg: OptimConfig) -> Routing:
    """Split `model`'s trainable parameters (frozen ones are left out) between the optimizers."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("model has no trainable parameters")
    matrices = [(n, p) for n, p in named if is_matrix_param(n, p)]
    rest = [(n, p) for n, p in named if not is_matrix_param(n, p)]
    scale = cfg.adamw_lr_scale if cfg.own_adamw_group else None
    if cfg.name == "adamw":
        if not cfg.own_adamw_group:
            return Routing([], _adamw_groups(named, model, cfg, cfg.weight_decay, None))
        hidden = _adamw_groups(matrices, model, cfg, cfg.weight_decay, None)
        return Routing([], hidden + _adamw_groups(rest, model, cfg, cfg.adamw_decay, scale))
    if cfg.name in ELEMENTWISE:
        return Routing([], [], _elementwise_groups(named, model, cfg))
    if not matrices:
        raise ValueError(
            f"optim.name={cfg.name} found no 2-D weights under 'blocks.' to orthogonalise; is this the GPT model?"
        )
    return Routing(matrices, _adamw_groups(rest, model, cfg, cfg.adamw_decay, scale))
