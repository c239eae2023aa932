"""One optimizer for the whole Muon family: Muon, Muon+Moonlight, OrScale, OrScale-LM and the
trust-ratio design-space variants of docs/algorithm.md, selected by named choices (``orscale.variants``).

Per 2-D weight W (m×n), gradient G, Nesterov momentum (fp32, no dampening):

    (a) M ← μM + G;  M̂ = μM + G                      (M̂ = M without Nesterov)
    (b) Q = NS₅(M̂)                                    (batched over same-shape matrices)
    (c) r = clip(num / (c·den + ε), r_min, r_max)      (r ≡ 1 for denominator 'none')
        coupled:   W ← W − η·r·(λW + sQ)
        decoupled: W ← (1 − ηλ)·W − η·r·s·Q

The three stages are separate methods so a sharded subclass can run (b) on one owner rank per
matrix, all-reduce the output of ``local_sums_of_squares`` (every norm the step needs, for every
matrix, in ONE tensor) through ``reduce_sums_of_squares``, and call (c) unchanged. All arithmetic
runs on the tensors ``_local`` returns (the tensor itself here; a DTensor's local shard in
``orscale.distributed``), so the same code serves whole matrices and row shards.

A member that changes the direction after (b) does so through two hooks, which every placement's
class runs unchanged: ``shape_directions`` turns each rank's rows of Q into the step's directions
and adds per-matrix partial sums of its own (``extra_sum_columns``) to the step's one reduction;
``direction_scales`` then gives each matrix a factor a from the reduced sums, and the step uses
a·Q wherever it reads Q (its norms, the trust ratio, the update, the diagnostics).

Everything but the matmuls runs as four passes over memory (``orscale.muon_passes``: momentum,
normalisation, norms, update), fused into kernels on CUDA; the state stays one fp32 momentum
buffer per parameter.

The step never syncs with the host: trust ratios, calibration and diagnostics stay on the device
and branch with ``torch.where``; only Python floats (lr, weight decay, choices) steer control flow.
State is created eagerly in ``__init__`` (momentum zeros; ``c`` = 0 meaning "not calibrated"; the
cumulative clip counters at 0) so a checkpoint helper's zero-gradient, lr = 0 dry-run step neither
creates nor calibrates anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, overload

import torch
from torch import Tensor

from orscale.calibration import calibrate, ratio_terms, trust_ratio
from orscale.diagnostics import CLIP_COUNTS, CUM_FIELDS, DiagnosticsMixin
from orscale.muon_passes import apply_pass, momentum_pass, update_norms_pass
from orscale.newton_schulz import NS_KERNELS, newton_schulz_many, ns_schedule, resolve_ns_dtype
from orscale.optim_common import ParamsT, TensorList, call_closure, check_number, copy_state, grad_of
from orscale.variants import MOONLIGHT_FACTOR, Variant, get_variant

# Columns of the per-step sums tensor [n_matrices, N_COLS]. Each entry is a sum over the
# matrix's elements (of squares, or of products for ⟨W,Q⟩), so partial sums over shards add up.
COL_W, COL_G, COL_MHAT, COL_Q, COL_D, COL_WQ = range(6)
N_COLS = 6


@dataclass
class GroupWork:
    """The matrices of one param group that have a gradient at this step."""

    group_index: int
    group: dict[str, Any]
    params: list[Tensor]
    names: list[str]
    index: Tensor | None  # their positions in the group (device tensor); None: all of them
    variant: Variant  # the group's choices (built once per group, not per step)
    s: list[float]  # their shape factors, host floats (what the foreach ops take)
    norms: Tensor | None = None  # [n, 2] ‖M̂‖, ‖G‖ of the local tensors (the momentum pass's)


def matrix_shape(p: Tensor) -> tuple[int, int]:
    """(m, n) of the matrix the step sees: a conv weight [out, in, k…] is flattened to [out, in·k…]."""
    m = p.shape[0]
    return m, (p.numel() // m if m else math.prod(p.shape[1:]))


def shape_factor(shape_choice: str, p: Tensor) -> float:
    """s = 1 ('one') or Moonlight's 0.2·√max(m, n) ('moonlight')."""
    return MOONLIGHT_FACTOR * math.sqrt(max(matrix_shape(p))) if shape_choice == "moonlight" else 1.0


def scaled_sums(sq: Tensor, a: Tensor, s: Tensor, wd: float, coupled: bool) -> Tensor:
    """The step's norm sums [n, N_COLS] of directions Q (as the norms pass saw them) for the
    directions a·Q: ‖aQ‖² = a²‖Q‖², ⟨W,aQ⟩ = a⟨W,Q⟩ and, coupled, ‖λW + s·aQ‖² from those three."""
    out = sq.clone()
    out[:, COL_Q] = sq[:, COL_Q] * a.square()
    out[:, COL_WQ] = sq[:, COL_WQ] * a
    if coupled:
        out[:, COL_D] = (wd * wd * sq[:, COL_W] + 2 * wd * s * out[:, COL_WQ] + s.square() * out[:, COL_Q]).clamp_min(0)
    return out


def _variant(group: dict[str, Any]) -> Variant:
    return Variant(group["shape"], group["denominator"], group["decay"], group["calibration"])


def _check_numbers(group: dict[str, Any]) -> None:
    """The group's hyper-parameters, each a finite number in its range (one line where not)."""
    check_number("lr", group["lr"])
    check_number("weight_decay", group["weight_decay"])
    check_number("momentum", group["momentum"], lambda x: 0 <= x < 1, "in [0, 1)")
    check_number("r_min", group["r_min"], lambda x: x > 0, "> 0")
    check_number("r_max", group["r_max"], lambda x: x >= group["r_min"], f"≥ r_min ({group['r_min']})")
    check_number("eps", group["eps"], lambda x: x > 0, "> 0")


class MuonFamily(DiagnosticsMixin, torch.optim.Optimizer):
    """Muon-family optimizer for 2-D weight matrices (fp32 master weights assumed); a tensor of more
    dims (a conv weight [out, in, k…], contiguous) is stepped as the matrix [out, in·k…].

    ``variant`` is a preset name from ``orscale.variants.VARIANTS`` (or a ``Variant``); ``shape``,
    ``denominator``, ``decay`` and ``calibration`` override single choices of it. Params may be
    given as ``(name, tensor)`` pairs (e.g. ``model.named_parameters()``): names are used to group
    diagnostics by matrix class and in error messages. ``lr`` in each group must stay a Python
    float (the trainer sets ``group["lr"]`` every step). ``track_diagnostics=False`` skips the
    norms only diagnostics need (``diagnostics()`` then returns {}). ``ns_dtype`` ``auto``: bf16 on
    CUDA, fp32 elsewhere (the config's default too). ``compile_passes``: the elementwise passes
    (``orscale.muon_passes``) compiled into fused kernels, or eager (None: compiled where the
    parameters are on CUDA). ``ns_kernel``: ``orscale.newton_schulz.NS_KERNELS``. Copies
    (``copy.deepcopy``, pickle, ``torch.save(opt)``) step exactly as the original would. A whole
    model's optimizer (embeddings, norms and biases on AdamW): ``orscale.OrScaleLM``.
    """

    # The state kept in fp32 whatever the parameters' dtype (restored so by load_state_dict); a
    # member with state of its own adds its keys.
    fp32_state: ClassVar[tuple[str, ...]] = ("momentum_buffer", "c", CLIP_COUNTS)
    # Per-matrix columns `shape_directions` adds to the step's one reduction.
    extra_sum_columns: ClassVar[int] = 0
    # Whether `direction_scales` gives factors (the step then keeps the norms it rescales).
    scales_directions: ClassVar[bool] = False

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        *,
        variant: str | Variant = "orscale_lm",
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        ns_coefficients: str = "polar_express",
        ns_dtype: str = "auto",
        r_min: float = 0.1,
        r_max: float = 5.0,
        eps: float = 1e-6,
        shape: str | None = None,
        denominator: str | None = None,
        decay: str | None = None,
        calibration: str | None = None,
        track_diagnostics: bool = True,
        compile_passes: bool | None = None,
        ns_kernel: str = "auto",
    ) -> None:
        base = get_variant(variant) if isinstance(variant, str) else variant
        v = base.replace(shape=shape, denominator=denominator, decay=decay, calibration=calibration)
        ns_schedule(ns_coefficients, ns_steps)  # validates both
        if ns_dtype != "auto":
            resolve_ns_dtype(ns_dtype)
        self.variant_name = variant if isinstance(variant, str) else "custom"
        # Off: compute only the norms the variant needs (no ⟨W,Q⟩, no per-step diag tensors).
        self.track_diagnostics = track_diagnostics
        # The elementwise passes around Newton–Schulz (orscale.muon_passes) compiled into fused
        # kernels (None: where the parameters are on CUDA) or run eager, op by op.
        self.compile_passes = compile_passes
        if ns_kernel not in NS_KERNELS:
            raise ValueError(f"ns_kernel must be one of {', '.join(NS_KERNELS)}, got {ns_kernel!r}")
        self.ns_kernel = ns_kernel  # newton_schulz.NS_KERNELS: who computes NS's symmetric products
        # Per group, host-built once: shape factors and 1/√numel as device vectors, so the step
        # needs no host→device copies.
        self._consts: list[dict[str, Any]] = []
        self._index_cache: dict[tuple[int, tuple[int, ...]], Tensor] = {}
        self._last_diag: list[tuple[list[str], Tensor]] = []
        # Work counters of the latest step (host ints; the sharded subclasses fill the comm ones).
        self.ns_calls = 0  # matrices orthogonalised on this rank
        self.bytes_sent = 0  # bytes this rank's optimizer collectives sent to other ranks
        self.n_collectives = 0  # collectives issued
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            ns_coefficients=ns_coefficients,
            ns_dtype=ns_dtype,
            r_min=r_min,
            r_max=r_max,
            eps=eps,
            shape=v.shape,
            denominator=v.denominator,
            decay=v.decay,
            calibration=v.calibration,
        )
        super().__init__(params, defaults)

    # ---------------------------------------------------------------- groups, state, names
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            _variant(group)  # validates per-group overrides of the choices
            _check_numbers(group)
            for name, p in zip(self._names(len(self.param_groups) - 1, group), group["params"], strict=True):
                if p.ndim < 2:
                    raise ValueError(
                        f"MuonFamily handles 2-D weight matrices only; parameter '{name}' has "
                        f"shape {tuple(p.shape)}: route it to AdamW instead"
                    )
                if p.ndim > 2 and not self._local(p).is_contiguous():  # flattened in place: a view
                    raise ValueError(
                        f"MuonFamily steps '{name}' {tuple(p.shape)} as a [out, in·k…] view, which needs "
                        "a contiguous tensor (not channels_last): make it contiguous or route it to AdamW"
                    )
        except ValueError:
            self.param_groups.pop()
            raise
        if group["ns_dtype"] == "auto":
            # bf16 where it is fast (tensor cores: the paper's choice); fp32 on a CPU, where bf16
            # matmuls are emulated on most chips (~45x slower on the CI's) and buy no speed.
            on_cuda = bool(group["params"]) and group["params"][0].device.type == "cuda"
            group["ns_dtype"] = "bf16" if on_cuda else "fp32"
        self._init_state(group)
        self._build_consts()

    def _init_state(self, group: dict[str, Any]) -> None:
        """Eager state: momentum zeros (fp32), for lazy calibration c = 0 (fp32, 0-d), and the
        cumulative clip counters (fp32, [len(CUM_FIELDS)]: in the state, so every checkpoint carries
        them and a resumed run's diag/*/cum_frac_* continue; zeros where a checkpoint lacks them)."""
        for p in group["params"]:
            st = self.state[p]
            if "momentum_buffer" not in st:
                st["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)
            if group["calibration"] == "lazy" and "c" not in st:
                st["c"] = torch.zeros((), dtype=torch.float32, device=p.device)
            if CLIP_COUNTS not in st:
                st[CLIP_COUNTS] = torch.zeros(len(CUM_FIELDS), dtype=torch.float32, device=p.device)

    def _build_consts(self) -> None:
        self._consts, self._index_cache = [], {}
        for group in self.param_groups:
            ps = group["params"]
            device = ps[0].device if ps else torch.device("cpu")
            s = [shape_factor(group["shape"], p) for p in ps]
            inv = [1.0 / math.sqrt(max(p.numel(), 1)) for p in ps]
            self._consts.append(
                {
                    "s": torch.tensor(s, dtype=torch.float32, device=device),
                    "inv_sqrt_numel": torch.tensor(inv, dtype=torch.float32, device=device),
                    "s_host": s,
                    "variant": _variant(group),
                }
            )

    # ---------------------------------------------------------------- local views
    def _local(self, t: Tensor) -> Tensor:
        """The tensor the step's arithmetic runs on: `t` itself here; a DTensor's local shard in
        the sharded subclass (so elementwise math never triggers DTensor collectives)."""
        return t

    # flatten(1) is the tensor itself for a matrix, a [out, in·k…] view of a conv weight.
    def _local_params(self, w: GroupWork) -> list[Tensor]:
        return [self._local(p).flatten(1) for p in w.params]

    def _local_grads(self, w: GroupWork) -> list[Tensor]:
        return [self._local(grad_of(p)).flatten(1) for p in w.params]

    def _local_momenta(self, w: GroupWork) -> list[Tensor]:
        return [self._local(self.state[p]["momentum_buffer"]).flatten(1) for p in w.params]

    def _names(self, gi: int, group: dict[str, Any]) -> list[str]:
        names = group.get("param_names")
        if names:
            return list(names)
        return [f"group{gi}.param{i}" for i in range(len(group["params"]))]

    def __getstate__(self) -> dict[str, Any]:
        """What a copy carries (torch's own keeps only defaults, state and groups: the copy could not
        step); the per-group constants are rebuilt by ``__setstate__``, on the copy's device."""
        return copy_state(self, exclude=("_consts", "_index_cache"))

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._build_consts()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load, then undo torch's cast of floating state to the param dtype.

        ``Optimizer.load_state_dict`` casts every floating state tensor to its param's dtype; with
        bf16 params that would round the calibration constant and the momentum to bf16. We restore
        them as fp32 from the source tensors, and re-create any state the checkpoint lacks.
        """
        super().load_state_dict(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for sid, p in zip(saved_ids, params, strict=True):
            saved = state_dict["state"].get(sid, {})
            for key in self.fp32_state:
                value = saved.get(key)
                if isinstance(value, Tensor):
                    self.state[p][key] = value.to(device=p.device, dtype=torch.float32, copy=True)
        for group in self.param_groups:
            self._init_state(group)
        self._build_consts()

    # ---------------------------------------------------------------- the step
    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = call_closure(closure)
        work = self._active_work()
        self._last_diag = []
        self.ns_calls = self.bytes_sent = self.n_collectives = 0
        if not work:
            return loss
        m_hats = [self.momentum_update(w) for w in work]  # (a)
        qs = [self.orthogonalize(w, mh) for w, mh in zip(work, m_hats, strict=True)]  # (b)
        sums, directions = self.local_sums_of_squares(work, m_hats, qs)
        del m_hats, qs
        sums = self.reduce_sums_of_squares(sums)
        self.apply_updates(work, sums, directions)  # (c)
        return loss

    def _active_work(self) -> list[GroupWork]:
        work = []
        for gi, group in enumerate(self.param_groups):
            names = self._names(gi, group)
            pos = [i for i, p in enumerate(group["params"]) if p.grad is not None]
            if not pos:
                continue
            if not group["lr"] >= 0:  # NaN too, which would skip every update (a comparison: no graph break)
                raise ValueError(f"param group {gi}'s lr must be a number ≥ 0, got {group['lr']!r}")
            ps = [group["params"][i] for i in pos]
            for i, p in zip(pos, ps, strict=True):
                if grad_of(p).is_sparse:
                    raise RuntimeError(f"MuonFamily: sparse gradient for '{names[i]}'")
            index = None
            if len(pos) < len(group["params"]):
                # Rare (some matrices got no gradient). The index tensor is built once per
                # pattern; that first build is a host→device copy, later steps reuse it.
                key = (gi, tuple(pos))
                if key not in self._index_cache:
                    self._index_cache[key] = torch.tensor(pos, device=ps[0].device)
                index = self._index_cache[key]
            consts = self._consts[gi]
            s_host = consts["s_host"] if index is None else [consts["s_host"][i] for i in pos]
            work.append(GroupWork(gi, group, ps, [names[i] for i in pos], index, consts["variant"], s_host))
        return work

    def _compiled(self, w: GroupWork) -> bool:
        return self.compile_passes if self.compile_passes is not None else w.params[0].device.type == "cuda"

    def momentum_update(self, w: GroupWork) -> TensorList:
        """(a) M ← μM + G in place; returns M̂ = μM + G (Nesterov) or M itself, fp32. One pass
        (orscale.muon_passes), which also leaves ‖M̂‖ and ‖G‖ of the local tensors in `w.norms`."""
        g = w.group
        bufs = self._local_momenta(w)
        # ‖G‖ is lazy calibration's "has a gradient" test (read at lr > 0 steps only; asked at every
        # step so that an lr of 0 does not give the compiled pass a graph of its own)
        lazy = w.variant.calibration == "lazy"
        m_hats, w.norms = momentum_pass(
            bufs, self._local_grads(w), g["momentum"], g["nesterov"], True, lazy, self._compiled(w)
        )
        return m_hats if g["nesterov"] else bufs

    def orthogonalize(self, w: GroupWork, m_hats: TensorList) -> list[Tensor]:
        """(b) Q = NS(M̂), batched by shape, in the NS dtype (the update reads it as it is). X₀ is
        normalised with the momentum pass's ‖M̂‖ in one pass per bucket."""
        g = w.group
        norms = w.norms[:, 0] if w.norms is not None else None
        qs = newton_schulz_many(
            m_hats,
            g["ns_steps"],
            g["ns_coefficients"],
            g["ns_dtype"],
            norms=norms,
            compiled=self._compiled(w),
            kernel=self.ns_kernel,
        )
        self.ns_calls += len(qs)
        return qs

    def local_sums_of_squares(
        self, work: list[GroupWork], m_hats: list[TensorList], qs: list[list[Tensor]]
    ) -> tuple[Tensor, list[list[Tensor]]]:
        """Every norm the step needs, for every matrix, as one [N, N_COLS + extra_sum_columns] fp32
        tensor.

        Columns: ‖W‖², ‖G‖², ‖M̂‖², ‖Q‖², ‖λW+sQ‖², ⟨W,Q⟩ — each only where the variant (or a
        diagnostic) needs it, zeros otherwise: ‖G‖ and ‖M̂‖ from the momentum pass, the others in
        one pass over W and Q (orscale.muon_passes); then ``shape_directions``' own columns. Also
        returns what the update reads: Q as ``shape_directions`` returned it (the update pass forms
        D = λW + sQ from it where it is used).
        """
        blocks, directions = [], []
        for w, q in zip(work, qs, strict=True):  # M̂ is not read again: its norms came with it
            g, v = w.group, w.variant
            q, extra = self.shape_directions(w, list(q))
            ws = [p if p.dtype == torch.float32 else p.float() for p in self._local_params(w)]
            diag = self.track_diagnostics
            coupled = v.decay == "coupled"
            want = [
                diag or v.denominator != "none",  # ‖W‖²
                diag or v.denominator == "q",  # ‖Q‖²
                (coupled and diag) or v.denominator == "update",  # ‖λW + sQ‖²
                not coupled and diag,  # ⟨W,Q⟩ gives ‖ηλW + ηrsQ‖ (update ratio) without forming it
            ]
            if self.scales_directions and want[2]:  # ‖λW + s·aQ‖² from ‖W‖², ‖Q‖², ⟨W,Q⟩ once a is known
                want = [True, True, False, True]
            four = update_norms_pass(ws, list(q), w.s, g["weight_decay"], want, self._compiled(w))
            zeros = torch.zeros(len(ws), dtype=torch.float32, device=ws[0].device)
            cols = [zeros] * N_COLS
            cols[COL_W], cols[COL_Q], cols[COL_D], cols[COL_WQ] = four.unbind(1)
            norms = w.norms if w.norms is not None else torch.stack([zeros, zeros], dim=1)
            if v.calibration == "lazy" and g["lr"] > 0:
                cols[COL_G] = norms[:, 1].square()  # "has a gradient" test
            if v.denominator in ("momentum", "rms_ratio"):
                cols[COL_MHAT] = norms[:, 0].square()
            block = torch.stack(cols, dim=1)
            blocks.append(block if extra is None else torch.cat([block, extra.to(torch.float32)], dim=1))
            directions.append(list(q))
        return torch.cat(blocks), directions

    def shape_directions(self, w: GroupWork, qs: list[Tensor]) -> tuple[list[Tensor], Tensor | None]:
        """Hook after (b): this rank's rows of each Q of `w` (as ``orthogonalize`` returned them) →
        the step's directions, and [len(qs), extra_sum_columns] partial sums over those rows (the
        step's reduction adds them up across ranks; None without columns). Identity here."""
        return qs, None

    def direction_scales(self, w: GroupWork, sums: Tensor, extra: Tensor) -> Tensor | None:
        """Hook after the reduction (for a class with ``scales_directions``): each matrix's factor a
        ([n], on the device) multiplying its direction, from the reduced norms (`sums`, [n, N_COLS])
        and ``shape_directions``' reduced columns (`extra`); None: 1."""
        return None

    def reduce_sums_of_squares(self, sums: Tensor) -> Tensor:
        """Hook for sharded execution (one all_reduce of local partial sums); identity here."""
        return sums

    def apply_updates(self, work: list[GroupWork], sums: Tensor, directions: list[list[Tensor]]) -> None:
        """(c) norms → calibration → trust ratio → in-place update, plus device-side diagnostics."""
        row = 0
        for w, dirs in zip(work, directions, strict=True):
            n = len(w.params)
            params = self._local_params(w)
            sq, extra = sums[row : row + n, :N_COLS], sums[row : row + n, N_COLS:]
            row += n
            g, v = w.group, w.variant
            lr, wd, eps = g["lr"], g["weight_decay"], g["eps"]
            r_min, r_max = g["r_min"], g["r_max"]
            consts = self._consts[w.group_index]
            s, inv = consts["s"], consts["inv_sqrt_numel"]
            if w.index is not None:
                s, inv = s[w.index], inv[w.index]
            a = self.direction_scales(w, sq, extra) if self.scales_directions else None
            if a is not None:
                sq = scaled_sums(sq, a, s, wd, v.decay == "coupled")
            norms = sq.clamp_min(0).sqrt()
            w_n, g_n, mh_n, q_n, d_n = (norms[:, i] for i in (COL_W, COL_G, COL_MHAT, COL_Q, COL_D))
            num, den = ratio_terms(v.denominator, w_n, mh_n, q_n, d_n, s, inv)
            c_states = [self.state[p]["c"] for p in w.params] if v.calibration == "lazy" else None
            c_eff, c_diag = calibrate(c_states, num, den, g_n, w_n, s, lr, eps)
            r_raw, r = trust_ratio(num, den, c_eff, eps, r_min, r_max)

            if lr > 0:  # lr is a host float: an lr = 0 step leaves the weights untouched
                coupled = v.decay == "coupled"
                # coupled: W += coef·D, D = λW + sQ;  decoupled: W ← (1 − ηλ)·W, then W += coef·Q.
                # coef stays on the device (no host sync); one pass over W and Q.
                coef = -lr * r if coupled else -lr * r * s
                if a is not None and coupled:  # D = λW + s·aQ: the pass reads aQ
                    torch._foreach_mul_(dirs, list(a.unbind(0)))
                elif a is not None:
                    coef = coef * a
                keep = 1.0 if coupled or wd == 0 else 1.0 - lr * wd
                apply_pass(params, dirs, coef, w.s, wd, keep, coupled, self._compiled(w))

            if self.track_diagnostics:
                self._record(w, v, sq, r_raw, r, c_diag, s)

    def _record(self, w: GroupWork, v: Variant, sq: Tensor, r_raw: Tensor, r: Tensor, c: Tensor, s: Tensor) -> None:
        """Per-matrix diagnostics of this step, kept on the device (see diagnostics.STEP_FIELDS)."""
        g = w.group
        lr, wd = g["lr"], g["weight_decay"]
        w_n, q_n, d_n = (sq[:, i].clamp_min(0).sqrt() for i in (COL_W, COL_Q, COL_D))
        if v.decay == "coupled":
            upd = lr * r * d_n  # ΔW = η·r·D
        else:  # ‖ηλW + η·r·s·Q‖ from ‖W‖², ‖Q‖², ⟨W,Q⟩
            wq = sq[:, COL_WQ]
            sq_upd = (wd * w_n) ** 2 + 2 * wd * r * s * wq + (r * s * q_n) ** 2
            upd = lr * sq_upd.clamp_min(0).sqrt()
        ratio = torch.where(w_n > 0, upd / w_n.clamp_min(1e-30), torch.zeros_like(upd))
        clip = None if v.denominator == "none" else (g["r_min"], g["r_max"])
        counters = [self.state[p][CLIP_COUNTS] for p in w.params]
        self.record_step(w.names, counters, [r_raw, r, w_n, q_n, ratio, c], clip)
