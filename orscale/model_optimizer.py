"""One ``torch.optim.Optimizer`` for a whole model: OrScale-LM (or another Muon-family member) on its
hidden matrices, AdamW on everything else (docs/library.md shows it in a plain loop, the Hugging
Face ``Trainer``, accelerate and an FSDP2 loop).

A composite over the tested pieces, not a second implementation: the matrices' param groups are run
by a ``MuonFamily`` (its FSDP2 or DDP subclass when the parameters say so) and the others by
``torch.optim.AdamW``. The parts hold the *same* group dicts and one shared ``state`` as this
optimizer, so an LR scheduler, ``state_dict()``, ``zero_grad()`` and hooks see one optimizer whose
groups each carry their ``kind`` (``"muon"`` | ``"adamw"``). Which parameter goes where is
``orscale.routing.hidden_matrices``, the rule the trainer's ``route_parameters`` uses too.
"""

from __future__ import annotations

import inspect
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, overload

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import _device_dtype_check_for_fused, _get_scalar_dtype

from orscale.adamw import adamw_implementation
from orscale.distributed.ddp import ReplicatedMuonFamily
from orscale.distributed.fsdp import ShardedMuonFamily
from orscale.distributed.owners import MODES
from orscale.muon_family import MuonFamily
from orscale.optim_common import ParamsT, call_closure, check_number, copy_state
from orscale.routing import hidden_matrices

KINDS: tuple[str, ...] = ("muon", "adamw")


ARGUMENTS = """
Arguments:
    params: the model (``nn.Module``, DDP-wrapped or not: embeddings and the head are found from its
        modules), its ``named_parameters()`` (found from the names, with a warning), or param groups
        (dicts) that each say their ``kind``. Plain tensors (``model.parameters()``) and groups without a
        ``kind`` need ``model``. Frozen parameters of a model are left out.
    model: the model that ``params`` come from: its plain tensors, and each group without a ``kind``
        (the Hugging Face Trainer's), are split between the two steps as the model itself would be.
    lr, weight_decay: the hidden matrices' (Muon-family step; coupled or decoupled decay per variant).
    adamw_lr, adamw_weight_decay: AdamW's (None: the matrices' values).
    variant: the Muon-family preset (``orscale.VARIANTS``); None: the class's own.
    betas, eps, fused: AdamW's betas, epsilon and implementation (auto | fused | foreach).
    momentum, nesterov, ns_steps, ns_coefficients: Nesterov momentum and Newton–Schulz
        (polar_express | jordan) of the matrices.
    ns_dtype: Newton–Schulz precision: auto (bf16 on CUDA, fp32 elsewhere) | bf16 | fp32.
    r_min, r_max, trust_eps: the trust ratio's clip and epsilon (variants with a trust ratio).
    flatten_conv: conv weights into the Muon step as [out, in·k…] matrices (default: AdamW).
    muon_names, adamw_names: regular expressions searched in parameter names that send a
        parameter to the Muon step or to AdamW whatever the rule says.
    muon_mode: with FSDP2 or DDP parameters, owner (Newton–Schulz on one rank per matrix) |
        replicate (on every rank).
    diagnostics: keep the trust-ratio diagnostics that ``diagnostics()`` returns.

A Muon group's momentum is its ``momentum`` and also ``betas[0]`` (the key torch's ``OneCycleLR`` and
``CyclicLR`` cycle when ``cycle_momentum=True``): whichever changed since the last step is the one used.

Placement comes from the parameters: FSDP2/HSDP DTensors get ``ShardedMuonFamily`` (its owner ranks
from the mesh), a DDP-wrapped model ``ReplicatedMuonFamily``, anything else ``MuonFamily``; AdamW is
``torch.optim.AdamW``. ``opt.muon`` / ``opt.adamw`` are the two parts.
"""


class MuonFamilyWithAdamW(torch.optim.Optimizer):
    """One optimizer for a whole model: a Muon-family step (``variant``, default the class's) on the
    hidden matrices and AdamW on embeddings, the output head, norms, biases and any other shape
    (``orscale.routing.hidden_matrices``'s rule; docs/library.md).
    """

    variant = "orscale_lm"  # the Muon-family preset (orscale.variants.VARIANTS) of this class

    def __init__(
        self,
        params: nn.Module | ParamsT,
        lr: float = 1e-3,
        adamw_lr: float | None = None,
        weight_decay: float = 0.1,
        adamw_weight_decay: float | None = None,
        *,
        variant: str | None = None,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        ns_coefficients: str = "polar_express",
        ns_dtype: str = "auto",
        r_min: float = 0.1,
        r_max: float = 5.0,
        trust_eps: float = 1e-6,
        flatten_conv: bool = False,
        muon_names: Iterable[str] = (),
        adamw_names: Iterable[str] = (),
        muon_mode: str = "owner",
        fused: str = "auto",
        diagnostics: bool = True,
        model: nn.Module | None = None,
    ) -> None:
        if muon_mode not in MODES:
            raise ValueError(f"muon_mode must be one of {', '.join(MODES)}, got {muon_mode!r}")
        # both parts' numbers, here: a model without hidden matrices builds no Muon part to check them
        for name, value in (("lr", lr), ("adamw_lr", adamw_lr), ("weight_decay", weight_decay)):
            if value is not None:
                check_number(name, value)
        adamw_lr = lr if adamw_lr is None else adamw_lr
        adamw_weight_decay = weight_decay if adamw_weight_decay is None else adamw_weight_decay
        variant = variant or self.variant
        self._muon_kwargs: dict[str, Any] = dict(
            lr=lr,
            weight_decay=weight_decay,
            variant=variant,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            ns_coefficients=ns_coefficients,
            ns_dtype=ns_dtype,
            r_min=r_min,
            r_max=r_max,
            eps=trust_eps,
            track_diagnostics=diagnostics,
        )
        self._adamw_kwargs: dict[str, Any] = dict(
            lr=adamw_lr, betas=tuple(betas), eps=eps, weight_decay=adamw_weight_decay
        )
        self._fused = fused
        self._stepped = False  # whether a step has run (host flag; see _follow_replaced_params)
        self._parts: dict[str, torch.optim.Optimizer] = {}
        if isinstance(params, nn.Module):
            if model is not None and model is not params:
                raise ValueError("params is a model and model= is another one: pass the model once")
            model = params
        groups = _groups(params, model, flatten_conv, muon_names, adamw_names)
        self._placement = _placement(model, groups, muon_mode)
        defaults = dict(self._muon_kwargs, adamw_lr=adamw_lr, adamw_weight_decay=adamw_weight_decay, betas=betas)
        defaults.update(eps=eps, trust_eps=trust_eps, flatten_conv=flatten_conv, muon_mode=muon_mode, fused=fused)
        super().__init__(groups, defaults)

    # ---------------------------------------------------------------- the parts
    @property
    def muon(self) -> MuonFamily | None:
        """The part that runs the hidden matrices (a ``MuonFamily``), None without any."""
        part = self._parts.get("muon")
        return part if isinstance(part, MuonFamily) else None

    @property
    def adamw(self) -> torch.optim.AdamW | None:
        """The part that runs every other parameter (``torch.optim.AdamW``), None without any."""
        part = self._parts.get("adamw")
        return part if isinstance(part, torch.optim.AdamW) else None

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group``; the group's ``kind`` (``"muon"`` | ``"adamw"``) says which part
        runs it (a group without one holding no 2-D tensor is AdamW's). Its params may be plain tensors
        or (name, tensor) pairs, whatever the other groups hold."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = self._named_as_the_others(param_group)
        tensors = [_tensor(item) for item in params]
        kind = param_group.get("kind") or _kind_without_name(tensors)
        if kind not in KINDS:
            raise ValueError(f"param group kind must be one of {', '.join(KINDS)}, got {kind!r}")
        held = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in held for p in tensors):
            raise ValueError("some parameters appear in more than one parameter group")
        group = dict(param_group, params=params, kind=kind)
        part = self._parts.get(kind)
        if part is None:
            part = self._new_part(kind, group)
            self._parts[kind] = part
            _raw_step(type(part))  # resolved before any compiled step looks it up
            self.state.update(part.state)
            part.state = self.state  # one state for both parts: state_dict() holds everything
        else:
            part.add_param_group(group)
        if kind == "adamw":
            self._init_adamw_state(part.param_groups[-1])
        else:
            _expose_momentum(part.param_groups[-1])
        self.param_groups.append(part.param_groups[-1])

    def _named_as_the_others(self, param_group: dict[str, Any]) -> list[Any]:
        """The group's params, named or not as this optimizer's first group is (torch refuses a group of
        plain tensors beside named ones, and the reverse): a plain tensor takes its name from the group's
        ``param_names``, else ``group{g}.param{i}``."""
        params = _as_list(param_group["params"])
        if not self.param_groups or not params:
            return params
        tensors = [_tensor(item) for item in params]
        if "param_names" not in self.param_groups[0]:
            return tensors
        names = param_group.get("param_names")
        if not (isinstance(names, list) and len(names) == len(params)):
            names = [f"group{len(self.param_groups)}.param{i}" for i in range(len(params))]
        return [item if isinstance(item, tuple) else (name, item) for name, item in zip(names, params, strict=True)]

    def _new_part(self, kind: str, group: dict[str, Any]) -> torch.optim.Optimizer:
        if kind == "muon":
            cls, extra = self._placement
            return cls([group], **self._muon_kwargs, **extra)
        implementation: dict[str, Any] = adamw_implementation(self._fused, [group])
        return torch.optim.AdamW([group], **self._adamw_kwargs, **implementation)

    def _init_adamw_state(self, group: dict[str, Any]) -> None:
        """AdamW's state, created now as torch's ``Adam._init_group`` creates it at the first step:
        with every parameter's state present from the start, a checkpoint helper that fills only
        existing state (torch.distributed.checkpoint's, behind accelerate's and torchtitan's) saves
        and loads AdamW's too (the Muon part's is eager already)."""
        for p in group["params"]:
            state = self.state[p]
            if state:
                continue
            if group["fused"]:
                _device_dtype_check_for_fused(p)
            on_device = group["capturable"] or group["fused"]
            state["step"] = (
                torch.zeros((), dtype=_get_scalar_dtype(is_fused=group["fused"]), device=p.device)
                if on_device
                else torch.tensor(0.0, dtype=_get_scalar_dtype())
            )
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    # ---------------------------------------------------------------- the step
    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One step of every part (the closure, if any, is evaluated once, first)."""
        if not torch.compiler.is_compiling():
            self._follow_replaced_params()
        loss = call_closure(closure)
        if (muon := self._parts.get("muon")) is not None:
            for group in muon.param_groups:  # the part's own list: torch.compile maps a group to its optimizer
                _sync_momentum(group)
        for part in self._parts.values():
            _raw_step(type(part))(part)
        self._stepped = True
        return loss

    def _follow_replaced_params(self) -> None:
        """Rebuild the parts around the groups when their parameters were swapped for others, as
        accelerate's FSDP2 ``prepare(model, optimizer)`` does (the sharded parameters replace the
        ones the optimizer was built over): placement from the new parameters, fresh state (all zeros
        before a first step, which is when that happens)."""
        if all(p in self.state for g in self.param_groups for p in g["params"]):
            return
        if self._stepped:
            raise RuntimeError(
                f"{type(self).__name__}: the parameters of its groups were replaced after it stepped; "
                "build the optimizer over the new parameters"
            )
        groups, old = list(self.param_groups), self._placement
        self._placement = _placement(None, groups, self.defaults["muon_mode"])
        if self._placement[0] is MuonFamily and old[0] is ReplicatedMuonFamily:
            self._placement = old  # a DDP model's new replicas: still replicated
        self._parts, self.param_groups, self.state = {}, [], defaultdict(dict)
        for group in groups:  # choices that depended on the old parameters' device, chosen again
            if group["kind"] == "muon" and self._muon_kwargs["ns_dtype"] == "auto":
                group["ns_dtype"] = "auto"
            if group["kind"] == "adamw" and self._fused == "auto":
                group.pop("fused", None), group.pop("foreach", None)
            self.add_param_group(group)

    def diagnostics(self) -> dict[str, float]:
        """The Muon part's trust-ratio diagnostics of the latest step ({} without one)."""
        return self.muon.diagnostics() if self.muon is not None else {}

    # ---------------------------------------------------------------- state dicts and copies
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's ``load_state_dict`` (its hooks included): each part loads its own groups and state
        (the Muon part keeps fp32 momentum and calibration constants), then shares one state again."""
        self._follow_replaced_params()
        state_dict = state_dict.copy()
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            state_dict = state_dict if result is None else result
        saved = state_dict["param_groups"]
        kinds = [g.get("kind") for g in saved]
        if kinds != [g["kind"] for g in self.param_groups]:
            raise ValueError(
                f"loaded state dict has param groups of kinds {kinds}, this optimizer "
                f"{[g['kind'] for g in self.param_groups]}: it comes from another optimizer or model"
            )
        for kind, part in self._parts.items():
            groups = [g for g in saved if g["kind"] == kind]
            ids = {i for g in groups for i in g["params"]}
            part.load_state_dict(
                {"state": {i: v for i, v in state_dict["state"].items() if i in ids}, "param_groups": groups}
            )
        self._link(kinds)
        for group in self.param_groups:
            if group["kind"] == "muon":
                _expose_momentum(group)
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    def _link(self, kinds: list[str]) -> None:
        """This optimizer's groups are its parts' (in `kinds` order); one state for all."""
        parts = {kind: iter(part.param_groups) for kind, part in self._parts.items()}
        self.param_groups = [next(parts[kind]) for kind in kinds]
        state: defaultdict[Tensor, Any] = defaultdict(dict)
        for part in self._parts.values():
            state.update(part.state)
        for part in self._parts.values():
            part.state = state
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        """torch's ``state_dict`` (hooks included), of the parts as they run now."""
        self._follow_replaced_params()
        return super().state_dict()

    def __getstate__(self) -> dict[str, Any]:
        """What a copy carries: the parts too (one pickle keeps their groups and state shared)."""
        return copy_state(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for part in self.__dict__.get("_parts", {}).values():
            _raw_step(type(part))


# Each part's own step function, without torch's per-optimizer wrappers: hooks are this optimizer's
# (they run once, around its step), and torch's AdamW wrapper (`_use_grad`) breaks a compiled graph on
# purpose; this step is no_grad already. Looked up by class: a function held on the instance would
# not pickle (its qualified name is the wrapper's).
_RAW_STEPS: dict[type, Callable[..., Any]] = {}


def _raw_step(cls: type) -> Callable[..., Any]:
    raw = _RAW_STEPS.get(cls)
    if raw is None:
        raw = _RAW_STEPS[cls] = inspect.unwrap(cls.step)  # type: ignore[attr-defined]
    return raw


def _kind_without_name(tensors: list[Tensor]) -> str:
    if any(p.ndim == 2 for p in tensors):
        raise ValueError(
            "a param group without 'kind' holds 2-D tensors: say kind='muon' (hidden matrices) or "
            "kind='adamw' (embeddings, output head, and anything else)"
        )
    return "adamw"


# A Muon group's momentum as its step last used it: of `momentum` and `betas[0]`, the one that differs
# from it is the one changed since (an LR scheduler cycling momentum writes `betas`; a user, `momentum`).
_SYNCED_MOMENTUM = "synced_momentum"


def _expose_momentum(group: dict[str, Any]) -> None:
    """A Muon group's momentum under ``betas[0]`` too, where torch's schedulers cycle it (the composite's
    defaults hold AdamW's ``betas``, so they write that key on every group)."""
    group.setdefault("betas", (group["momentum"],))
    group.setdefault(_SYNCED_MOMENTUM, group["momentum"])


def _sync_momentum(group: dict[str, Any]) -> None:
    """``momentum`` (what the Muon step reads) and ``betas[0]`` made equal to whichever of them changed
    since the last step."""
    beta, momentum, synced = group["betas"][0], group["momentum"], group[_SYNCED_MOMENTUM]
    if beta == momentum == synced:
        return
    if beta != synced and momentum != synced and beta != momentum:
        raise ValueError(
            f"a Muon param group's momentum was set to {momentum} and its betas[0] to {beta} since the last "
            "step (they are one setting): change one of them"
        )
    value = beta if beta != synced else momentum
    group["momentum"], group["betas"], group[_SYNCED_MOMENTUM] = value, (value, *group["betas"][1:]), value


def _groups(
    params: nn.Module | ParamsT,
    model: nn.Module | None,
    flatten_conv: bool,
    muon_names: Iterable[str],
    adamw_names: Iterable[str],
) -> list[dict[str, Any]]:
    """The param groups: the caller's own (dicts; with `model`, each without a ``kind`` split as the
    model's own routing splits it), or the routed split of a model, named parameters, or `model`'s
    plain tensors."""
    if isinstance(params, Tensor):
        raise TypeError("params must be a model, its named_parameters() or param groups, not one tensor")
    items: list[Any] = list(params.named_parameters() if isinstance(params, nn.Module) else params)
    groups: list[dict[str, Any]] | None = None  # the caller's groups to split; None: route `items` whole
    if items and isinstance(items[0], dict):
        groups = [dict(g, params=_as_list(g["params"])) for g in items]  # a generator would be spent
        if all("kind" in g for g in groups):
            return groups
        if model is None:
            if any("kind" not in g and any(_tensor(item).ndim == 2 for item in g["params"]) for g in groups):
                raise ValueError(
                    "a param group without 'kind' holds 2-D tensors: pass model=model to route it (the Hugging "
                    "Face Trainer: optimizer_cls_and_kwargs=(OrScaleLM, {'model': model, ...})), or say "
                    "kind='muon' (hidden matrices) or kind='adamw' (embeddings, head, the rest)"
                )
            return groups
    elif items and not all(isinstance(item, tuple) for item in items):
        if model is None:
            raise ValueError(
                "plain tensors cannot be routed (an embedding is a 2-D tensor too): pass the model, "
                "model.named_parameters(), these tensors with model=model, or param groups that each say "
                "kind='muon' or kind='adamw'"
            )
        groups = [{"params": [p for p in items if p.requires_grad]}]
    source = items if groups is None or model is None else list(model.named_parameters())
    named = [(n, p) for n, p in source if p.requires_grad]
    if not named:
        raise ValueError("optimizer got no trainable parameters")
    matrices = hidden_matrices(named, model, flatten_conv=flatten_conv, muon_names=muon_names, adamw_names=adamw_names)
    hidden = {id(p) for _, p in matrices}
    if groups is None:
        routed = _split({}, named, hidden)
    else:
        names = {id(p): n for n, p in source}
        routed = [sub for g in groups for sub in ([g] if "kind" in g else _split(g, _named_in(g, names), hidden))]
    if not any(g["kind"] == "muon" for g in routed):
        warnings.warn("found no hidden matrices for the Muon step: every parameter takes the AdamW step", stacklevel=3)
    return routed


def _split(group: dict[str, Any], named: Sequence[tuple[str, Tensor]], hidden: set[int]) -> list[dict[str, Any]]:
    """`group` (its settings) as a Muon group of the `hidden` matrices among `named` and an AdamW group of
    the rest; an empty part left out (an empty group stays one AdamW group)."""
    parts = [
        dict(group, params=[(n, p) for n, p in named if id(p) in hidden], kind="muon"),
        dict(group, params=[(n, p) for n, p in named if id(p) not in hidden], kind="adamw"),
    ]
    return [g for g in parts if g["params"]] or parts[1:]


def _named_in(group: dict[str, Any], names: dict[int, str]) -> list[tuple[str, Tensor]]:
    """The group's tensors with their names in the model (`names`, by ``id``)."""
    out = []
    for item in group["params"]:
        p = _tensor(item)
        if id(p) not in names:
            raise ValueError(
                f"a tensor of shape {tuple(p.shape)} in a param group without 'kind' is not a parameter of "
                "model: pass the model it belongs to, or give its group a 'kind'"
            )
        out.append((names[id(p)], p))
    return out


def _tensor(item: Any) -> Tensor:
    """A params entry's tensor (the entry is a tensor or a (name, tensor) pair)."""
    return item[1] if isinstance(item, tuple) else item


def _placement(
    model: nn.Module | None, groups: list[dict[str, Any]], mode: str
) -> tuple[type[MuonFamily], dict[str, Any]]:
    """The Muon part's class and its extra arguments, from where the parameters live."""
    tensors = [_tensor(item) for g in groups for item in _as_list(g["params"])]
    if any(isinstance(p, DTensor) for p in tensors):
        return ShardedMuonFamily, {"mode": mode}
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return ReplicatedMuonFamily, {"mode": mode, "process_group": model.process_group}
    return MuonFamily, {}


def _as_list(params: Any) -> list[Any]:
    return [params] if isinstance(params, Tensor) else list(params)


class OrScaleLM(MuonFamilyWithAdamW):
    """OrScale-LM for a whole model, as one optimizer: Newton–Schulz-orthogonalised momentum with
    Moonlight's shape factor, coupled weight decay and a calibrated, clipped layer-wise trust ratio on
    the hidden matrices (docs/algorithm.md); AdamW (betas 0.9/0.95) on embeddings, the output head,
    norms, biases and any other shape.

    ``OrScaleLM(model, lr=1e-3, adamw_lr=None, weight_decay=0.1)`` drops in wherever a
    ``torch.optim.AdamW(model.parameters())`` stood: one LR scheduler drives both LRs (every param
    group carries its ``kind``), one ``state_dict()`` holds both states. Examples: docs/library.md.
    """

    variant = "orscale_lm"


class OrScale(MuonFamilyWithAdamW):
    """OrScale (the general variant: s = 1, no calibration, coupled decay) on the hidden matrices,
    AdamW on the rest; as ``OrScaleLM`` otherwise (docs/algorithm.md)."""

    variant = "orscale"


class MuonMoonlight(MuonFamilyWithAdamW):
    """Muon with Moonlight's shape factor 0.2·√max(m, n) and decoupled decay on the hidden matrices
    (its LR carries over from AdamW's), AdamW on the rest; as ``OrScaleLM`` otherwise."""

    variant = "muon_moonlight"


class Muon(MuonFamilyWithAdamW):
    """Plain Muon (orthogonalised Nesterov momentum, decoupled decay) on the hidden matrices, AdamW on
    the rest; as ``OrScaleLM`` otherwise. Its matrices usually want a larger ``lr`` (about 0.02)
    than AdamW's ``adamw_lr``."""

    variant = "muon"


for _cls in (MuonFamilyWithAdamW, OrScaleLM, OrScale, MuonMoonlight, Muon):
    _cls.__doc__ = f"{inspect.cleandoc(_cls.__doc__ or '')}\n{ARGUMENTS}"  # help() on each: every argument
