"""What the trainer knows of an optimizer family, as one record (``OptimizerSpec``): its names, how
its parameters are routed, the checks of its `optim:` keys, how it is built on each placement, what
owner-rank execution (ZeRO) needs of it, and its label in the report. The table of every family is
``orscale.registry``; this module holds only the record and the placements, so that a family's own
file can define its record without importing the table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from orscale.distributed.elementwise import sharded_class
from orscale.distributed.owners import DEFAULT_BUCKET_NUMEL
from orscale.errors import Checks
from orscale.schedule import keep_lr_scales

if TYPE_CHECKING:
    from orscale.optim_config import OptimConfig

# Where the parameters live when an optimizer is built: one process ("none"), DDP replicas, FSDP2
# shards (``orscale.build_optimizers``), or whole tensors at DeepSpeed ZeRO's owner ranks
# (``orscale.distributed.zero``, its client optimizer).
PLACEMENTS: tuple[str, ...] = ("none", "ddp", "fsdp")
ZERO = "zero"
ALL_PLACEMENTS: tuple[str, ...] = (*PLACEMENTS, ZERO)

# How a family's parameters are routed (``orscale.routing.route_parameters``):
#   adamw        every parameter to AdamW;
#   matrices     the hidden matrices to the family's optimizer, everything else to AdamW;
#   elementwise  every parameter to the family's optimizer, in the param groups its `groups` makes.
ROUTINGS: tuple[str, ...] = ("adamw", "matrices", "elementwise")


@dataclass(frozen=True)
class Exchange:
    """How a distributed Muon-family step moves whole matrices (``orscale.distributed.owners``):
    where Newton–Schulz runs (`mode`: owner | replicate), HSDP owners across replica groups too
    (`replica_split`), and the exchange's overlap and bucket size."""

    mode: str = "owner"
    replica_split: bool = False
    overlap: bool = True
    bucket_numel: int = DEFAULT_BUCKET_NUMEL


# Builds a family's own optimizer on one placement: (its routed parameters: named matrices for the
# `matrices` routing, param groups for `elementwise`; the config; the exchange settings).
Builder = Callable[[Any, "OptimConfig", Exchange], torch.optim.Optimizer]


@dataclass(frozen=True)
class OwnerHooks:
    """What owner-rank execution (ZeRO) needs of an optimizer beyond its step, for ranks that may hold
    none of its tensors: a statistic shared across ranks before the step (`sync`), and how each
    rank's diagnostics are taken (`payload`, given the owner optimizer or None) and merged (`merge`).
    `lazy_calibration`: whether it keeps OrScale-LM's calibration constants."""

    sync: Callable[[Any, list[str], Callable[[torch.Tensor], torch.Tensor], torch.device], None] | None = None
    payload: Callable[[Any], Any] | None = None
    merge: Callable[[list[Any]], dict[str, float]] | None = None
    lazy_calibration: bool = False


def no_checks(cfg: OptimConfig) -> Checks:
    return []


def no_hooks(cfg: OptimConfig) -> OwnerHooks:
    return OwnerHooks()


@dataclass(frozen=True)
class OptimizerSpec:
    """One optimizer family as the trainer sees it.

    * ``names``: its `optim.name` values (the Muon family: every ``orscale.variants.VARIANTS`` row).
    * ``routing``: one of ``ROUTINGS``; ``groups`` (elementwise only): its param groups, given the
      trainable ``(name, param)`` pairs, the embeddings' ids and the config (``orscale.routing``
      sets each group's LR scale afterwards).
    * ``build``: placement (``ALL_PLACEMENTS``) -> ``Builder``; a placement it lacks is one it cannot
      run on.
    * ``checks``: the one-line checks of the `optim:` keys it owns, run on every config (in the
      registry's order, after the shared ones).
    * ``owner_hooks``: its ``OwnerHooks`` under a config.
    * ``labels``: name -> how the report writes it, in the report's order (names without one are
      written as they are).
    * ``options``: the options classes of the `optim.<section>`s it reads (its own, and a family's
      it extends), each a dataclass that checks itself on construction.
    """

    names: tuple[str, ...]
    routing: str
    build: Mapping[str, Builder]
    labels: Mapping[str, str] = field(default_factory=dict)
    groups: Callable[[list[tuple[str, Any]], frozenset[int], OptimConfig], list[dict[str, Any]]] | None = None
    checks: Callable[[OptimConfig], Checks] = no_checks
    owner_hooks: Callable[[OptimConfig], OwnerHooks] = no_hooks
    options: tuple[type[Any], ...] = ()

    def __post_init__(self) -> None:
        if self.routing not in ROUTINGS:
            raise ValueError(f"OptimizerSpec routing must be one of {', '.join(ROUTINGS)}, got {self.routing!r}")
        if (self.groups is not None) != (self.routing == "elementwise"):
            raise ValueError(f"OptimizerSpec {self.names}: `groups` is given exactly for the elementwise routing")
        unknown = set(self.build) - set(ALL_PLACEMENTS)
        if unknown:
            raise ValueError(f"OptimizerSpec {self.names}: unknown placements {sorted(unknown)}")


def elementwise_build(
    cls: type[torch.optim.Optimizer], kwargs: Callable[[OptimConfig], dict[str, Any]]
) -> dict[str, Builder]:
    """The builds of an elementwise optimizer class whose arithmetic runs on ``_local(t)`` and whose
    per-tensor norms pass through ``reduce_block_sums`` (``orscale.cbp.CBP``'s convention): the class
    itself on one process, DDP (every rank holds whole tensors) and ZeRO's owners; under FSDP2 its
    sharded subclass (``orscale.distributed.elementwise.sharded_class``). `kwargs`: its keyword
    arguments under a config. Each keeps its groups' LR scales (``orscale.schedule.set_lr``)."""

    def make(use: type[torch.optim.Optimizer]) -> Builder:
        return lambda groups, cfg, exchange: keep_lr_scales(use(groups, **kwargs(cfg)))

    plain, sharded = make(cls), make(sharded_class(cls))
    return {"none": plain, "ddp": plain, "fsdp": sharded, ZERO: plain}


def split_tensors(named: list[tuple[str, Any]], emb: frozenset[int], cfg: OptimConfig) -> tuple[list, list, list]:
    """An elementwise family's parameters as (the embeddings, when the AdamW group has settings of
    its own; the other tensors of 2 or more dims; the 1-D ones), each in `named`'s order. Apart from
    its own settings the embedding stays with the matrices, where it stood: CBP pools a role's
    energies in this order, so an equal setting changes no bit."""
    own = cfg.own_adamw_group
    mats = [(n, p) for n, p in named if p.ndim >= 2]
    emb_mats = [(n, p) for n, p in mats if id(p) in emb] if own else []
    mats = [(n, p) for n, p in mats if not (own and id(p) in emb)]
    return emb_mats, mats, [(n, p) for n, p in named if p.ndim < 2]


def per_tensor_groups(named: list[tuple[str, Any]], emb: frozenset[int], cfg: OptimConfig) -> list[dict[str, Any]]:
    """The routed groups of a per-tensor optimizer (LAMB, LARS ...), the usual convention: decay on
    the tensors of 2 or more dims (the embedding at the AdamW group's decay), none on 1-D ones; the
    ``trust`` flag says where LAMB and LARS apply their trust ratio (the same tensors)."""
    emb_mats, mats, vecs = split_tensors(named, emb, cfg)
    return [
        {"params": mats, "weight_decay": cfg.weight_decay, "trust": True, "role": "matrices"},
        {"params": emb_mats, "weight_decay": cfg.adamw_decay, "trust": True, "role": "embedding"},
        {"params": vecs, "weight_decay": 0.0, "trust": False, "role": "vectors"},
    ]
