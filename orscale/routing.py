"""Parameter routing: which optimizer owns which parameter (docs/algorithm.md "Which parameters").

* **The rule** (``hidden_matrices``, shared by the trainer and ``orscale.OrScaleLM``): the Muon family
  takes every *hidden* matrix, i.e. every 2-D weight that is neither an embedding (an ``nn.Embedding``
  / ``nn.EmbeddingBag`` weight) nor an output head (a head tied to the embedding, the model's
  ``get_output_embeddings()`` (Hugging Face), its output layer: the last ``nn.Linear`` outside a
  Hugging Face model's ``base_model``, or outside any other model's ``nn.ModuleList`` blocks; when none
  of these exists, the last 2-D weight outside the blocks if it has the token embedding's shape
  [vocabulary, width], with a warning); everything else (embeddings, heads, norm gains, biases, any
  other shape) goes to AdamW. Given names only (no model), the roles are guessed from the names, with a
  warning. Conv weights go to AdamW, or flattened to [out, in·k…] into the Muon step with
  ``flatten_conv``; name patterns override the rule. On this project's GPT that is exactly every 2-D
  weight inside the transformer blocks (``blocks.*``): the tied embedding and the norm gains are AdamW's.
* How an optimizer's parameters are routed is its record's ``routing`` in the optimizer table
  (``orscale.registry``): ``adamw``, ``matrices`` (the Muon family) or ``elementwise``.
* ``adamw``: one AdamW over every parameter (decay on all of them, as in the paper), unless
  ``optim.exempt_norms_and_embeddings`` puts 1-D params and embeddings in a wd = 0 group.
* Muon family: the hidden matrices to the matrix optimizer; everything else to AdamW, at
  ``optim.adamw_lr`` / ``optim.adamw_weight_decay`` (null: the matrices' LR and decay) and the same
  exemption rule.
* "The AdamW group" is that same set of parameters in every family: with ``adamw_lr`` or
  ``adamw_weight_decay`` set, ``adamw`` puts the hidden matrices and the rest in groups of their
  own, and CBP/LAMB/LARS give the embedding a group of its own (CBP still equalises it with the
  matrices: groups of one ``role`` share M1's target). A group's peak LR over ``optim.lr`` is its
  ``LR_SCALE`` key (``orscale.schedule``); unset settings leave today's groups unchanged.
* CBP, LAMB, LARS (the ``elementwise`` routing): every parameter, each tensor one block, in the
  groups its record makes (``OptimizerSpec.groups``): tensors with ≥ 2 dims (the block matrices and
  the embedding) and 1-D ones (norm gains, biases). CBP equalises each group among itself (c is the
  group's mean energy, so a norm gain is not scaled against a matrix); both groups take decoupled
  decay (the 1-D one none with ``exempt_norms_and_embeddings``, which also exempts the embedding).
  LAMB and LARS keep their standard convention: trust ratio and decay on the ≥ 2-D group only.

``route_parameters`` is the one place the trainer decides this; every optimizer builder (single
process, DDP, FSDP2, DeepSpeed ZeRO) calls it. ``model.named_parameters()`` deduplicates shared
tensors, so a tied embedding/head appears once.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from orscale.optim_config import OptimConfig
from orscale.optimizer_spec import OptimizerSpec
from orscale.registry import optimizer_spec
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


# When only names are known (no module tree): the module holding an embedding's weight, by its
# name (wte, wpe, tok_emb, embed_tokens, word_embeddings, T5's shared and relative_attention_bias), and
# the modules of an output head (any component of the name).
_EMBEDDING_MODULE = re.compile(r"emb|^wte$|^wpe$|^shared$|relative_attention_bias")
_HEAD_MODULES = frozenset({"lm_head", "head", "classifier", "score", "qa_outputs", "seq_relationship"})
_NAMES_SHOWN = 6  # names a routing warning lists before "and N more"


@dataclass(frozen=True)
class Roles:
    """Parameters (by ``id``) whose role, not shape, decides their optimizer, the conv weights, and
    the roles that were guessed from names or shapes rather than read from the model (one line each)."""

    embeddings: frozenset[int]
    head: frozenset[int]
    conv: frozenset[int]
    guesses: tuple[str, ...] = ()


def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside DDP / DataParallel / torch.compile wrappers (they hide its methods)."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(inner := getattr(model, "_orig_mod", None), nn.Module):
            model = inner
        else:
            return model


def _hf_embedding(model: nn.Module, method: str) -> Tensor | None:
    """The weight of a Hugging Face model's ``get_input_embeddings()`` / ``get_output_embeddings()``,
    else None."""
    fn = getattr(_unwrap(model), method, None)
    try:
        found = fn() if callable(fn) else None
    except (NotImplementedError, AttributeError):  # a base class's stub: the model does not say
        return None
    weight = getattr(found, "weight", None) if isinstance(found, nn.Module) else None
    return weight if isinstance(weight, Tensor) else None


def _output_layer(model: nn.Module) -> Tensor | None:
    """The weight of the model's last ``nn.Linear`` that is not part of its body: for a Hugging Face
    model with a head (``base_model`` is not the model itself), the last one outside ``base_model``
    (a classifier, ``score``, ``lm_head``); for any other model, the last one outside its stacked
    blocks (``nn.ModuleList``), e.g. a CNN's ``fc``. None when there is none."""
    model = _unwrap(model)
    base = getattr(model, "base_model", None)
    if isinstance(base, nn.Module):
        if base is model:
            return None
        inside = {id(m) for m in base.modules()}
        linears = [m for m in model.modules() if isinstance(m, nn.Linear) and id(m) not in inside]
    else:
        linears = [m for m in model.modules() if isinstance(m, nn.Linear) and id(m) not in _in_blocks(model)]
    return linears[-1].weight if linears else None


def _in_blocks(model: nn.Module) -> set[int]:
    """The modules (by ``id``) inside an ``nn.ModuleList`` of `model`: its stacked blocks."""
    return {id(m) for lst in model.modules() if isinstance(lst, nn.ModuleList) for m in lst.modules()}


def _names(named: NamedParams, ids: Iterable[int]) -> str:
    """Up to `_NAMES_SHOWN` names of the parameters `ids` (in `named` order), for a message."""
    wanted = set(ids)
    names = [canonical_name(n) for n, p in named if id(p) in wanted]
    shown = ", ".join(names[:_NAMES_SHOWN]) or "none"
    return shown + (f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else "")


def parameter_roles(named: NamedParams, model: nn.Module | None = None) -> Roles:
    """The embeddings, output head and conv weights among `named`: from `model`'s modules when given
    (``nn.Embedding``/``nn.EmbeddingBag``, conv layers, a module tied to an embedding, Hugging Face's
    ``get_output_embeddings()``, the output layer of ``_output_layer``), else guessed from the names
    (``_EMBEDDING_MODULE``, ``_HEAD_MODULES``; any tensor of 3 or more dims counts as a conv weight).
    Without any head found, the last 2-D weight outside the stacked blocks is guessed to be the head
    when it has the token embedding's shape [vocabulary, width]."""
    head: set[int] = set()
    guesses: list[str] = []
    if model is not None:
        embedding_modules = [m for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]
        embeddings = {id(m.weight) for m in embedding_modules}
        conv = {id(m.weight) for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)}
        head |= {id(w) for w in (_hf_embedding(model, "get_output_embeddings"), _output_layer(model)) if w is not None}
        tied = any(
            getattr(m, "weight", None) is e.weight for m in model.modules() for e in embedding_modules if m is not e
        )
        token = _hf_embedding(model, "get_input_embeddings")
        token_shape = tuple(token.shape) if token is not None else None
        known_head = bool(head) or tied
        blocks = _in_blocks(model)
        in_blocks = {id(p) for m in model.modules() if id(m) in blocks for p in m.parameters(recurse=False)}
    else:
        embeddings = {id(p) for n, p in named if p.ndim == 2 and _EMBEDDING_MODULE.search(_module_name(n)) is not None}
        head = {
            id(p) for n, p in named if p.ndim >= 2 and _HEAD_MODULES.intersection(canonical_name(n).split(".")[:-1])
        }
        conv = {id(p) for _, p in named if p.ndim > 2}
        token_shape, known_head = None, bool(head)
        in_blocks = {id(p) for n, p in named if any(part.isdigit() for part in canonical_name(n).split("."))}
        guesses.append(
            f"no model given, so roles come from parameter names: embeddings {_names(named, embeddings)}; "
            f"output head {_names(named, head)}"
        )
    if not known_head and embeddings:
        if token_shape is None:  # the largest embedding is the token embedding (positions are fewer)
            token_shape = max((tuple(p.shape) for _, p in named if id(p) in embeddings), default=None)
        matrices = [(n, p) for n, p in named if p.ndim == 2 and id(p) not in embeddings and id(p) not in in_blocks]
        if matrices and tuple(matrices[-1][1].shape) == token_shape:
            head.add(id(matrices[-1][1]))
            guesses.append(
                f"'{canonical_name(matrices[-1][0])}' taken as the output head by its shape {token_shape} "
                "(the token embedding's; no head is tied or declared)"
            )
    return Roles(frozenset(embeddings), frozenset(head), frozenset(conv), tuple(guesses))


def _module_name(name: str) -> str:
    """'transformer.wte.weight' -> 'wte': the module that holds the parameter."""
    parts = canonical_name(name).split(".")
    return parts[-2] if len(parts) > 1 else ""


def _patterns(option: str, patterns: Iterable[str]) -> list[re.Pattern[str]]:
    out = []
    for pattern in patterns:
        try:
            out.append(re.compile(pattern))
        except re.error as err:
            raise ValueError(f"{option}: {pattern!r} is not a regular expression ({err})") from None
    return out


def hidden_matrices(
    named: NamedParams,
    model: nn.Module | None = None,
    *,
    flatten_conv: bool = False,
    muon_names: Iterable[str] = (),
    adamw_names: Iterable[str] = (),
) -> NamedParams:
    """The parameters of `named` that the Muon family takes, in their order (the module docstring's
    rule; roles from `model` when given, see ``parameter_roles``; one warning names the roles guessed
    from names or shapes and how to override them). ``flatten_conv``: conv weights too
    (the step flattens them to [out, in·k…]). ``muon_names`` / ``adamw_names``: regular expressions
    searched in each parameter's name (wrapper prefixes removed) that send it to the Muon family (any
    tensor of 2 or more dims) or to AdamW, whatever the rule says."""
    to_muon, to_adamw = _patterns("muon_names", muon_names), _patterns("adamw_names", adamw_names)
    roles = parameter_roles(named, model)
    if roles.guesses:
        warnings.warn(
            f"routing guessed: {'; '.join(roles.guesses)}. Embeddings and the head take AdamW, the other 2-D "
            "weights the Muon step: pass the model itself to route by its modules, or override with "
            "muon_names=[...] / adamw_names=[...] or param groups that say their 'kind'",
            stacklevel=3,
        )
    out = []
    for n, p in named:
        name = canonical_name(n)
        muon = next((pat.pattern for pat in to_muon if pat.search(name)), None)
        adamw = next((pat.pattern for pat in to_adamw if pat.search(name)), None)
        if muon is not None and adamw is not None:
            raise ValueError(
                f"parameter '{name}' matches muon_names {muon!r} and adamw_names {adamw!r}: make the patterns exclusive"
            )
        if muon is not None and p.ndim < 2:
            raise ValueError(
                f"muon_names {muon!r} matches '{name}' of shape {tuple(p.shape)}: the Muon step takes "
                "tensors of 2 or more dims only; narrow the pattern"
            )
        if adamw is not None:
            continue
        role = id(p) in roles.embeddings or id(p) in roles.head
        if muon is not None or (not role and (p.ndim == 2 or (flatten_conv and id(p) in roles.conv))):
            out.append((n, p))
    return out


@dataclass
class Routing:
    """Every trainable parameter exactly once: the matrices for the Muon family (empty for
    ``adamw``), AdamW's param groups (``{"params": [(name, p), ...], "weight_decay": wd}``), and
    the param groups of an elementwise optimizer (CBP, LAMB, LARS; each with a ``role``)."""

    matrices: NamedParams
    adamw_groups: list[dict[str, Any]]
    elementwise: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def _elementwise_groups(
    spec: OptimizerSpec, named: NamedParams, emb: frozenset[int], hidden: set[int], cfg: OptimConfig
) -> list[dict[str, Any]]:
    """`spec`'s param groups (``OptimizerSpec.groups``), each not made only of hidden matrices (what
    the Muon family would take) at the AdamW group's LR scale when it has settings of its own."""
    groups = spec.groups(named, emb, cfg) if spec.groups is not None else []
    if cfg.own_adamw_group:  # every group but the hidden matrices' is "the AdamW group"
        for g in groups:
            if not (g["params"] and all(id(p) in hidden for _, p in g["params"])):
                g[LR_SCALE] = cfg.adamw_lr_scale
    return [g for g in groups if g["params"]]


def _adamw_groups(
    named: NamedParams, emb: frozenset[int], cfg: OptimConfig, weight_decay: float, lr_scale: float | None
) -> list[dict[str, Any]]:
    """One decayed group; with the exemption flag, 1-D params and embeddings in a wd = 0 group.
    `lr_scale`: the groups' peak LR over optim.lr (None: no key, the groups follow optim.lr)."""
    if not named:
        return []
    scale = {} if lr_scale is None else {LR_SCALE: lr_scale}
    if not cfg.exempt_norms_and_embeddings:
        return [{"params": named, "weight_decay": weight_decay, **scale}]
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
    matrices = hidden_matrices(named, model)
    hidden = {id(p) for _, p in matrices}
    rest = [(n, p) for n, p in named if id(p) not in hidden]
    emb = parameter_roles(named, model).embeddings
    scale = cfg.adamw_lr_scale if cfg.own_adamw_group else None
    spec = optimizer_spec(cfg.name)
    if spec.routing == "adamw":
        if not cfg.own_adamw_group:
            return Routing([], _adamw_groups(named, emb, cfg, cfg.weight_decay, None))
        return Routing(
            [],
            _adamw_groups(matrices, emb, cfg, cfg.weight_decay, None)
            + _adamw_groups(rest, emb, cfg, cfg.adamw_decay, scale),
        )
    if spec.routing == "elementwise":
        return Routing([], [], _elementwise_groups(spec, named, emb, hidden, cfg))
    if not matrices:
        raise ValueError(
            f"optim.name={cfg.name} found no hidden 2-D weight matrices to orthogonalise (embeddings, the output "
            "head, norms and biases are AdamW's); use optim.name=adamw for this model"
        )
    return Routing(matrices, _adamw_groups(rest, emb, cfg, cfg.adamw_decay, scale))
