"""The client optimizer that DeepSpeed ZeRO-1/2 runs: AdamW and the Muon family on flat partitions.

ZeRO flattens each param group into one buffer, cuts it into equal contiguous partitions (one per
data-parallel rank) and hands this optimizer, per group, a single 1-D tensor: this rank's fp32
master partition, whose ``.grad`` is the matching slice of the averaged gradient. AdamW is
elementwise, so it runs on that slice unchanged. A Muon-family step is not: Newton–Schulz needs
whole matrices. We do not use DeepSpeed's own Muon path (its NS, EMA momentum and clip order differ
from ours); instead:

* **Owner per matrix.** Every 2-D weight under ``blocks.`` (``orscale.routing.route_parameters``)
  gets one owner rank: the rank whose partition holds most of it (ties: lowest rank). Partitions
  are equal-sized, so owners are balanced to within the matrices that straddle a partition
  boundary, and most matrices never move.
* **Per step** (inside DeepSpeed's ``step``): one ``all_to_all_single`` sends the pieces of
  gradient and fp32 master weight a rank holds to each piece's owner; the owner runs the
  single-process ``orscale.MuonFamily`` step, unchanged, on whole fp32 matrices (fp32 Nesterov
  momentum, our Newton–Schulz, trust ratio from full-matrix norms, lazy calibration); a second
  ``all_to_all_single`` returns the updated master-weight pieces. Owners hold whole matrices, so
  the trust ratio's norms need no all-reduce at all.
* **Clipping.** DeepSpeed runs with ``gradient_clipping = 0``. At the start of each client step we
  scale the raw gradient partition by ``min(1, max_norm / (‖g‖ + 1e-6))`` (``clip_grad_norm_``'s
  formula), with ‖g‖ the global norm over every parameter that DeepSpeed has just computed on the
  raw averaged gradients (``_global_grad_norm``), so no extra collective is needed.

The same owner machinery runs CBP, LAMB and LARS: their whole tensors (every parameter) go to
owners, which run the single-process optimizer on them, so per-tensor norms need no reduction;
a statistic an optimizer needs over every rank's tensors (CBP's equalisation target, a mean over
every block of a group) is its own hook (its record's ``owner_hooks`` in ``orscale.registry``),
called on every rank, owner of tensors or not.

Momentum and calibration constants of the matrices live in the owner's ``MuonFamily``;
``orscale.distributed.zero_checkpoint`` saves them, and the AdamW moments of the flat partitions,
by parameter name, so a ZeRO checkpoint loads at any data-parallel size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, overload

import torch
import torch.distributed as dist
from torch import Tensor, nn

from orscale.adamw import adamw
from orscale.distributed.zero_layout import MatrixLayout, Span, build_layout, zero_group_layout
from orscale.optim_config import OptimConfig
from orscale.optimizer_spec import ZERO, Exchange
from orscale.registry import names_on, optimizer_spec
from orscale.routing import route_parameters
from orscale.schedule import LR_SCALE, keep_lr_scales, lr_scales, set_lr

# Optimizers this client can run under ZeRO-1/2: every one whose record builds on ZeRO's owners.
ZERO_OPTIMIZERS: tuple[str, ...] = names_on(ZERO)
ROLE = "orscale_role"  # param-group key: "matrix" (whole tensors at owner ranks) or "adamw"


class ZeroShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1/2 client optimizer: AdamW groups on flat partitions; the Muon family on whole
    matrices at an owner rank (see the module docstring).

    Build it on the model, pass it to ``deepspeed.initialize`` (DeepSpeed replaces each group's
    params by this rank's flat fp32 partition), then call ``bind(engine.optimizer, grad_clip)``.
    """

    def __init__(self, model: nn.Module, cfg: OptimConfig) -> None:
        if cfg.name not in ZERO_OPTIMIZERS:
            raise ValueError(
                f"ZeroShardedOptimizer cannot run optim.name={cfg.name!r}; it runs {', '.join(ZERO_OPTIMIZERS)}"
            )
        self.cfg = cfg
        self._spec = optimizer_spec(cfg.name)
        self._hooks = self._spec.owner_hooks(cfg)
        routing = route_parameters(model, cfg)
        self._routing = routing
        groups: list[dict[str, Any]] = []
        owned_params = routing.matrices or [np for g in routing.elementwise for np in g["params"]]
        if owned_params:
            groups.append(
                {"params": [p for _, p in owned_params], ROLE: "matrix", "lr": cfg.lr, "weight_decay": cfg.weight_decay}
            )
        adam_groups = []
        # The same groups (decay / exemption), hyperparameters and LR scales as the single-process AdamW.
        single = adamw(routing.adamw_groups, cfg) if routing.adamw_groups else None
        for g, scale in zip(single.param_groups, lr_scales(single), strict=True) if single else []:
            g = {k: v for k, v in g.items() if k != "param_names"}
            g[ROLE], g[LR_SCALE] = "adamw", scale
            adam_groups.append(g)
        groups.extend(adam_groups)
        super().__init__(groups, dict(lr=cfg.lr))
        keep_lr_scales(self)  # DeepSpeed's engine sets each group's LR through orscale.set_lr
        self.param_names = {id(p): n for n, p in model.named_parameters()}
        # AdamW runs on the same group dicts (DeepSpeed swaps their params for flat partitions) and
        # the same state dict, so a checkpoint of this optimizer includes its moments.
        self._adam = torch.optim.AdamW(adam_groups) if adam_groups else None
        self._muon: torch.optim.Optimizer | None = None  # the owner-side optimizer (any family)
        self._layout: MatrixLayout | None = None
        self._staging: list[Tensor] = []  # owned matrices, whole, fp32 (the MuonFamily params)
        self._part: Tensor | None = None  # the matrix group's master partition (DeepSpeed's)
        self._split: list[bool] = []  # per owned matrix: straddles a partition boundary
        self._kept_split: list[Span] = []  # this rank's own pieces of split matrices it owns
        self._grad_norm: Callable[[], Any] = lambda: None
        self._max_norm = 0.0
        self._group: Any = None  # DeepSpeed's data-parallel process group of the matrix group
        self._device = torch.device("cpu")
        # Optional: given the step's global raw gradient norm, whether to skip its update (the
        # trainer's spike guard); asked once per step, at the first group, on every rank.
        self.skip_update: Callable[[Any], bool] | None = None
        self._skip: bool | None = None
        self._bound = False

    # ---------------------------------------------------------------- after deepspeed.initialize
    def bind(self, zero_opt: Any, max_norm: float) -> None:
        """Learn the partition layout from DeepSpeed's ZeRO optimizer and build the owner-side
        MuonFamily over this rank's whole matrices. Collective-free; call once on every rank."""
        self._max_norm = float(max_norm)
        self._grad_norm = lambda: getattr(zero_opt, "_global_grad_norm", None)
        self._layouts = []  # per param group: where its parameters lie across the partitions
        for gi, group in enumerate(self.param_groups):
            pg = zero_opt.real_dp_process_group[gi]
            world, rank = dist.get_world_size(pg), dist.get_rank(pg)
            flat, params, offsets, P = zero_group_layout(zero_opt, gi, world)
            names = [self.param_names[id(p)] for p in params]
            self._layouts.append(build_layout(names, [p.shape for p in params], offsets, P, rank, world))
            part = group["params"][0]
            # Our reading of the layout must agree with DeepSpeed's: the master partition is a copy
            # of this rank's slice of the flat buffer (one-time check).
            if (
                part.numel() != P
                or part.dtype != torch.float32
                or not torch.equal(part, flat.narrow(0, rank * P, P).to(torch.float32))
            ):
                raise RuntimeError(
                    "the ZeRO master partition does not match the flat-buffer layout read "
                    f"from {type(zero_opt).__name__}; this DeepSpeed version is not supported"
                )
            if group[ROLE] == "matrix":
                self._group, self._layout, self._device, self._part = pg, self._layouts[gi], part.device, part
        layout = self._layout
        part = self._part
        if layout is not None and part is not None:
            # A matrix that lies whole in this rank's partition is handed to MuonFamily as a view of
            # the master partition (updated in place, no copy); one that straddles a boundary gets a
            # persistent fp32 buffer that the exchange fills and empties every step.
            self._split = [len(layout.pieces[k]) > 1 for k in layout.owned]
            self._kept_split = [pc for pc in layout.kept if self._split[layout.slot[pc.k]]]
            self._staging = []
            for k in layout.owned:
                (first, *more) = layout.pieces[k]
                if more:
                    self._staging.append(torch.zeros(layout.shapes[k], dtype=torch.float32, device=part.device))
                else:
                    self._staging.append(part.detach().narrow(0, first.part_off, first.n).view(layout.shapes[k]))
            if self._staging:
                owned = [(layout.names[k], w) for k, w in zip(layout.owned, self._staging, strict=True)]
                self._muon = self._owner_optimizer(owned)
        self._bound = True

    def _owner_optimizer(self, owned: list[tuple[str, Tensor]]) -> torch.optim.Optimizer:
        """The single-process optimizer over this rank's whole tensors, as the optimizer's record
        builds it for ZeRO's owners: the Muon family's over the matrices, or an elementwise one
        (CBP, LAMB, LARS ...) over the routed groups (decay, trust flags, role) of the tensors it owns."""
        build = self._spec.build[ZERO]
        if not self._routing.elementwise:
            return build(owned, self.cfg, Exchange())
        mine = dict(owned)
        groups = []
        for g in self._routing.elementwise:
            params = [(n, mine[n]) for n, _ in g["params"] if n in mine]
            if params:
                groups.append({**g, "params": params})
        return build(groups, self.cfg, Exchange())

    # ---------------------------------------------------------------- the step
    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """DeepSpeed calls this once per group (ZeRO-1/2) or once for all groups (BF16 ZeRO-1)."""
        if closure is not None:
            raise RuntimeError("ZeroShardedOptimizer does not support closures")
        if not self._bound:
            raise RuntimeError("ZeroShardedOptimizer.bind() must be called after deepspeed.initialize")
        if self.skip_update is not None:
            if self._skip is None:
                self._skip = bool(self.skip_update(self._grad_norm()))
            if self._skip:
                return None
        coef = self._clip_coefficient()
        adam_groups = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None and coef is not None:
                    p.grad.mul_(coef.to(p.grad.device))
            if group[ROLE] == "matrix":
                self._matrix_step(group)
            else:
                adam_groups.append(group)
        if adam_groups and self._adam is not None:
            self._adam.param_groups = adam_groups
            self._adam.state = self.state
            self._adam.step()
        return None

    def begin_step(self) -> None:
        """Called before each DeepSpeed step: the next `step()` call asks `skip_update` afresh."""
        self._skip = None

    def _clip_coefficient(self) -> Tensor | None:
        """min(1, max_norm / (‖g‖ + 1e-6)) as clip_grad_norm_ computes it; None when disabled."""
        if not self._max_norm > 0 or math.isinf(self._max_norm):
            return None
        norm = self._grad_norm()
        if norm is None:
            raise RuntimeError(
                "DeepSpeed did not compute the global gradient norm "
                "(zero_optimization.compute_grad_norm must stay true)"
            )
        norm = torch.as_tensor(norm, dtype=torch.float32)
        return (self._max_norm / (norm + 1e-6)).clamp(max=1.0)

    def _matrix_step(self, group: dict[str, Any]) -> None:
        """Whole-matrix MuonFamily step at the owners; see the module docstring."""
        layout = self._layout
        part: Tensor = group["params"][0]  # this rank's fp32 master partition of the matrix group
        if layout is None or part is not self._part:
            raise RuntimeError("DeepSpeed replaced the ZeRO master partition after bind()")
        grad = part.grad if part.grad is not None else torch.zeros_like(part)
        split = self._split
        grads = [
            torch.empty_like(w) if sp else grad.narrow(0, layout.pieces[k][0].part_off, w.numel()).view_as(w)
            for k, w, sp in zip(layout.owned, self._staging, split, strict=True)
        ]

        def local(t: Tensor, pc: Span) -> Tensor:
            return t.narrow(0, pc.part_off, pc.n)

        def whole(ts: list[Tensor], pc: Span) -> Tensor:
            return ts[layout.slot[pc.k]].view(-1).narrow(0, pc.mat_off, pc.n)

        kept = self._kept_split
        # 1. G and W pieces to their owners: own pieces copied, the rest in one all_to_all
        for pc in kept:
            whole(grads, pc).copy_(local(grad, pc))
            whole(self._staging, pc).copy_(local(part, pc))
        if layout.needs_exchange:
            chunks = []
            for lst in layout.outgoing:  # per peer: its G pieces, then its W pieces
                chunks += [local(grad, pc) for pc in lst] + [local(part, pc) for pc in lst]
            recv = part.new_empty((2 * sum(_numel(lst) for lst in layout.incoming),))
            dist.all_to_all_single(
                recv,
                _cat(chunks, part),
                [2 * _numel(lst) for lst in layout.incoming],
                [2 * _numel(lst) for lst in layout.outgoing],
                group=self._group,
            )
            at = 0
            for lst in layout.incoming:
                size = _numel(lst)
                for pc in lst:
                    whole(grads, pc).copy_(recv.narrow(0, at, pc.n))
                    whole(self._staging, pc).copy_(recv.narrow(0, at + size, pc.n))
                    at += pc.n
                at += size

        # 2. the single-process step, unchanged, on whole fp32 tensors (after any statistic it shares
        #    across ranks, e.g. CBP's equalisation target)
        if self._hooks.sync is not None:
            self._hooks.sync(self._muon, [g["role"] for g in self._routing.elementwise], self._all_reduce, self._device)
        if self._muon is not None:
            for w, g in zip(self._staging, grads, strict=True):
                w.grad = g
            set_lr([self._muon], group["lr"])  # the owner's groups keep their routed LR scales
            self._muon.step()
            for w in self._staging:
                w.grad = None
        del grads

        # 3. updated master-weight pieces back to the ranks whose partitions hold them
        for pc in kept:
            local(part, pc).copy_(whole(self._staging, pc))
        if layout.needs_exchange:
            back = _cat([whole(self._staging, pc) for lst in layout.incoming for pc in lst], part)
            recv = part.new_empty((sum(_numel(lst) for lst in layout.outgoing),))
            dist.all_to_all_single(
                recv,
                back,
                [_numel(lst) for lst in layout.outgoing],
                [_numel(lst) for lst in layout.incoming],
                group=self._group,
            )
            at = 0
            for lst in layout.outgoing:
                for pc in lst:
                    local(part, pc).copy_(recv.narrow(0, at, pc.n))
                    at += pc.n

    # ---------------------------------------------------------------- calibration, diagnostics
    def calibration_constants(self) -> dict[str, float]:
        """{matrix name: c} for lazily calibrated variants ({} otherwise). Collective (one
        all_reduce); c = 0 means "not calibrated yet", as in MuonFamily."""
        layout = self._layout
        if layout is None or not self._hooks.lazy_calibration:
            return {}
        values = torch.zeros(len(layout.names), dtype=torch.float32, device=self._device)
        for k, w in zip(layout.owned, self._staging, strict=True):
            values[k] = self.owner_state(w)["c"]
        if layout.world > 1:
            dist.all_reduce(values, group=self._group)  # each entry is non-zero on its owner only
        return dict(zip(layout.names, values.tolist(), strict=True))

    def diagnostics(self) -> dict[str, float]:
        """The ``diag/...`` keys of ``orscale.collect_diagnostics`` over every rank's tensors, by the
        optimizer record's owner hooks (Muon family per matrix class; CBP's M1 summary; none for
        LAMB/LARS). Collective: call it on every rank at the same step (one all_gather_object, only
        on logging steps)."""
        hooks = self._hooks
        if self._layout is None or hooks.payload is None or hooks.merge is None:
            return {}
        parts = [hooks.payload(self._muon)]
        if self._layout.world > 1:
            parts = [None] * self._layout.world
            dist.all_gather_object(parts, hooks.payload(self._muon), group=self._group)
        return hooks.merge(parts)

    def _all_reduce(self, t: Tensor) -> Tensor:
        if self._layout is not None and self._layout.world > 1:
            dist.all_reduce(t, group=self._group)
        return t

    # ---------------------------------------------------------------- layouts, checkpoints
    def group_layouts(self) -> list[tuple[dict[str, Any], MatrixLayout]]:
        """(param group, where its parameters lie across the ZeRO partitions) for every group."""
        return list(zip(self.param_groups, self._layouts, strict=True))

    @torch.no_grad()
    def copy_from_model(self, model: nn.Module, names: set[str] | None = None) -> None:
        """Copy parameters `names` (default: all) of the whole, replicated model into this rank's
        master partitions: after a resume, or a change made outside the step (M2's transport)."""
        params = dict(model.named_parameters())
        for group, layout in self.group_layouts():
            part = group["params"][0]
            for pc in (pc for ps in layout.pieces for pc in ps if pc.rank == layout.rank):
                if names is None or layout.names[pc.k] in names:
                    src = params[layout.names[pc.k]].detach().reshape(-1).narrow(0, pc.mat_off, pc.n)
                    part.narrow(0, pc.part_off, pc.n).copy_(src)

    def owned_tensors(self) -> list[tuple[str, Tensor]]:
        """(name, whole fp32 tensor) of the matrices this rank owns (orscale.distributed.zero_checkpoint)."""
        layout = self._layout
        return [(layout.names[k], w) for k, w in zip(layout.owned, self._staging, strict=True)] if layout else []

    def owner_state(self, tensor: Tensor) -> dict[str, Any]:
        """The owner-side optimizer's state of one of `owned_tensors()` (mutable)."""
        if self._muon is None:
            raise RuntimeError("this rank owns no tensors: it holds no owner-side state")
        return self._muon.state[tensor]

    def owner_group(self, tensor: Tensor) -> dict[str, Any]:
        """The owner-side optimizer's param group holding one of `owned_tensors()`."""
        if self._muon is None:
            raise RuntimeError("this rank owns no tensors: it holds no owner-side groups")
        return next(g for g in self._muon.param_groups if any(p is tensor for p in g["params"]))

    def state_dict(self) -> dict[str, Any]:
        raise RuntimeError(
            "ZeroShardedOptimizer state is saved by orscale.distributed.zero_checkpoint "
            "(by parameter name, at any world size), not through state_dict()"
        )


def _numel(pieces: list[Span]) -> int:
    return sum(pc.n for pc in pieces)


def _cat(tensors: list[Tensor], like: Tensor) -> Tensor:
    return torch.cat(tensors) if tensors else like.new_empty(0)
