"""Parameter routing: which optimizer owns which parameter (SPEC §1 "Which parameters", §2).

* ``adamw``: one AdamW over every parameter (decay on all of them, as in the paper), unless
  ``optim.exempt_norms_and_embeddings`` puts 1-D params and embeddings in a wd = 0 group.
* Muon family: every 2-D weight inside the transformer blocks (names ``blocks.*``) goes to
  ``MuonFamily``; everything else (token embedding = tied LM head, norm gains) to AdamW with the
  same peak LR (and the same exemption rule).
* ``backend`` picks the Muon-family class: ``fsdp`` → ``ShardedMuonFamily`` (DTensor params),
  ``ddp`` → ``ReplicatedMuonFamily``, anything else → ``MuonFamily``; ``mode`` (``owner`` |
  ``replicate``) says where Newton–Schulz runs (``orscale.sharded``). AdamW is
  ``torch.optim.AdamW`` on every backend (DTensor-native under FSDP2).

``model.named_parameters()`` deduplicates shared tensors, so a tied embedding/head appears once.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from launch.config import ConfigError, OptimConfig, validate_optim
from orscale.muon_family import MuonFamily
from orscale.newton_schulz import NS_COEFFICIENT_SETS
from orscale.sharded import MODES, ReplicatedMuonFamily, ShardedMuonFamily
from orscale.variants import PRESETS

OPTIMIZER_NAMES: tuple[str, ...] = ("adamw",) + tuple(PRESETS)

# Wrappers that prefix parameter names without changing the model: torch.compile, DDP,
# activation checkpointing, FSDP1. Routing looks at the name with these removed.
_WRAPPER_PREFIX = re.compile(
    r"(^|\.)(_orig_mod|module|_fsdp_wrapped_module|_checkpoint_wrapped_module)\."
)


def canonical_name(name: str) -> str:
    """'_orig_mod.blocks.0.attn.qkv.weight' -> 'blocks.0.attn.qkv.weight'."""
    prev = None
    while prev != name:
        prev, name = name, _WRAPPER_PREFIX.sub(r"\1", name)
    return name


def check_optim_config(cfg: OptimConfig) -> None:
    """The checks `build_optimizers` relies on; ConfigError with a one-line message."""
    if cfg.name not in OPTIMIZER_NAMES:
        raise ConfigError(
            f"optim.name {cfg.name!r} is not a known optimizer; valid: {', '.join(OPTIMIZER_NAMES)}"
        )
    if cfg.ns_coefficients not in NS_COEFFICIENT_SETS:
        raise ConfigError(f"optim.ns_coefficients must be one of {', '.join(NS_COEFFICIENT_SETS)}, "
                          f"got {cfg.ns_coefficients!r}")
    validate_optim(cfg)


def _embedding_params(model: nn.Module) -> set[int]:
    return {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}


def build_adamw(named: list[tuple[str, nn.Parameter]], model: nn.Module,
           cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over `named`; with the exemption flag, 1-D params and embeddings get wd = 0."""
    groups = []
    if cfg.exempt_norms_and_embeddings:
        emb = _embedding_params(model)
        exempt = [(n, p) for n, p in named
                  if p.ndim < 2 or id(p) in emb or canonical_name(n) == "tok_emb.weight"]
        exempt_ids = {id(p) for _, p in exempt}
        decayed = [(n, p) for n, p in named if id(p) not in exempt_ids]
        if decayed:
            groups.append({"params": decayed, "weight_decay": cfg.weight_decay})
        if exempt:
            groups.append({"params": exempt, "weight_decay": 0.0})
    else:
        groups.append({"params": named, "weight_decay": cfg.weight_decay})
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                             weight_decay=cfg.weight_decay)


def muon_family_kwargs(cfg: OptimConfig) -> dict:
    """MuonFamily's keyword arguments for `cfg` (shared by every backend, ZeRO's included)."""
    return dict(lr=cfg.lr, weight_decay=cfg.weight_decay, variant=cfg.name, momentum=cfg.momentum,
                nesterov=cfg.nesterov, ns_steps=cfg.ns_steps, ns_coefficients=cfg.ns_coefficients,
                ns_dtype=cfg.ns_dtype, r_min=cfg.r_min, r_max=cfg.r_max, eps=cfg.trust_eps,
                track_diagnostics=cfg.diagnostics)


def is_matrix_param(name: str, p: torch.Tensor) -> bool:
    """A 2-D weight inside the transformer blocks (fused QKV, attn out, MLP up/down)."""
    return canonical_name(name).startswith("blocks.") and p.ndim == 2


BACKENDS: tuple[str, ...] = ("none", "ddp", "fsdp", "zero1", "zero2")


def build_optimizers(model: nn.Module, cfg: OptimConfig, backend: str = "none",
                     mode: str = "owner") -> list[torch.optim.Optimizer]:
    """The optimizers for `model` under `cfg`: [AdamW] or [MuonFamily (or its sharded
    subclass for `backend`), AdamW].

    Frozen parameters (requires_grad=False) are left out. Every trainable parameter is in
    exactly one optimizer. All groups start at lr = cfg.lr; the trainer overwrites
    ``group["lr"]`` on every group each step. ``backend`` ``zero1``/``zero2`` get the plain
    ``MuonFamily`` (the DeepSpeed path drives its methods itself).
    """
    check_optim_config(cfg)
    if backend not in BACKENDS:
        raise ConfigError(f"parallel.backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if mode not in MODES:
        raise ConfigError(f"parallel.muon_mode must be one of {', '.join(MODES)}, got {mode!r}")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("model has no trainable parameters")

    if cfg.name == "adamw":
        optimizers: list[torch.optim.Optimizer] = [build_adamw(named, model, cfg)]
    else:
        matrices = [(n, p) for n, p in named if is_matrix_param(n, p)]
        rest = [(n, p) for n, p in named if not is_matrix_param(n, p)]
        if not matrices:
            raise ValueError(f"optim.name={cfg.name} found no 2-D weights under 'blocks.' to "
                             "orthogonalise; is this the GPT model?")
        kwargs = muon_family_kwargs(cfg)
        if backend == "fsdp":
            muon: MuonFamily = ShardedMuonFamily(matrices, mode=mode, **kwargs)
        elif backend == "ddp":
            muon = ReplicatedMuonFamily(matrices, mode=mode, **kwargs)
        else:
            muon = MuonFamily(matrices, **kwargs)
        optimizers = [muon]
        if rest:
            optimizers.append(build_adamw(rest, model, cfg))

    # Each trainable parameter in exactly one optimizer (tied weights included).
    seen: dict[int, int] = {}
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                seen[id(p)] = seen.get(id(p), 0) + 1
    wrong = [n for n, p in named if seen.get(id(p)) != 1]
    assert not wrong and len(seen) == len(named), f"parameters routed != once: {wrong}"
    return optimizers
