"""Per-matrix optimizer diagnostics, grouped by matrix class (the list in docs/algorithm.md, "The
trust-ratio design space").

The optimizer keeps the numbers on the device every step; turning them into Python floats is
the only host sync, done once (one transfer) and only when the trainer asks, on logging steps.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import torch

# Columns of the per-step diagnostic tensor [n_matrices, len(STEP_FIELDS)].
STEP_FIELDS: tuple[str, ...] = (
    "r_raw",  # trust ratio before clipping (1 for variants without a trust ratio)
    "r",  # clipped trust ratio actually applied
    "w_norm",  # ‖W‖_F before the update
    "q_norm",  # ‖Q‖_F of the orthogonalised direction (before the shape factor)
    "update_ratio",  # ‖ΔW‖_F / ‖W‖_F = RMS(update) / RMS(param)
    "c",  # calibration constant (0: not calibrated yet; 1: variant without calibration)
    "at_rmin",  # 1 where the raw ratio was clipped up to r_min
    "at_rmax",  # 1 where the raw ratio was clipped down to r_max
)
# Entries of each matrix's cumulative counters, summed over steps: optimizer state CLIP_COUNTS (fp32,
# [len(CUM_FIELDS)]), so that checkpoints carry them like any other state.
CUM_FIELDS: tuple[str, ...] = ("steps", "at_rmin", "at_rmax")
CLIP_COUNTS = "clip_counts"

_CLASS_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("attn.qkv.weight", "attn_qkv"),
    ("attn.out.weight", "attn_out"),
    ("mlp.up.weight", "mlp_up"),
    ("mlp.down.weight", "mlp_down"),
)


def matrix_class(name: str) -> str:
    """'blocks.3.attn.qkv.weight' -> 'attn_qkv'; anything unrecognised -> 'other'."""
    for suffix, cls in _CLASS_SUFFIXES:
        if name.endswith(suffix):
            return cls
    return "other"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def summarize(
    step_names: Sequence[str],
    step_rows: Sequence[Sequence[float]],
    cum_names: Sequence[str],
    cum_rows: Sequence[Sequence[float]],
) -> dict[str, float]:
    """Host-side reduction of per-matrix rows into `diag/<class>/<field>` means.

    Also emits class ``all`` (every matrix) and, from the cumulative counters,
    ``cum_frac_rmin`` / ``cum_frac_rmax``: the fraction of matrix-steps clipped since the
    counters were last reset (what a saturation claim like "r at r_max on 99.5% of steps" needs,
    without logging every step).
    """
    out: dict[str, float] = {}
    by_class: dict[str, list[Sequence[float]]] = defaultdict(list)
    for name, row in zip(step_names, step_rows, strict=True):
        by_class[matrix_class(name)].append(row)
        by_class["all"].append(row)
    for cls, rows in by_class.items():
        col = {f: [row[i] for row in rows] for i, f in enumerate(STEP_FIELDS)}
        for f in ("r_raw", "r", "w_norm", "q_norm", "update_ratio", "c"):
            out[f"diag/{cls}/{f}"] = _mean(col[f])
        out[f"diag/{cls}/frac_rmin"] = _mean(col["at_rmin"])
        out[f"diag/{cls}/frac_rmax"] = _mean(col["at_rmax"])

    cum: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for name, row in zip(cum_names, cum_rows, strict=True):
        for cls in (matrix_class(name), "all"):
            acc = cum[cls]
            for i in range(3):
                acc[i] += row[i]
    for cls, (steps, at_min, at_max) in cum.items():
        if steps > 0:
            out[f"diag/{cls}/cum_frac_rmin"] = at_min / steps
            out[f"diag/{cls}/cum_frac_rmax"] = at_max / steps
    return out


def merge_rows(parts: Sequence[Sequence[Sequence[Any]]]) -> dict[str, float]:
    """`summarize` over several ranks' `diagnostic_rows()` (each rank holding some matrices)."""
    merged = [sum((list(p[i]) for p in parts), []) for i in range(4)]
    return summarize(*merged) if merged[0] else {}


class DiagnosticsMixin:
    """Host-side readers for an optimizer that, at each step, appends ``(names, tensor[n,
    len(STEP_FIELDS)])`` to ``self._last_diag`` and keeps each matrix's cumulative counters in its
    state, ``state[p][CLIP_COUNTS]`` (tensor[len(CUM_FIELDS)]), on the device."""

    _last_diag: list[tuple[list[str], torch.Tensor]]
    param_groups: list[dict]
    state: Any

    def _names(self, gi: int, group: dict) -> list[str]:
        """Every parameter's name in group `gi` (the optimizer defines it)."""
        raise NotImplementedError

    def record_step(
        self,
        names: list[str],
        counters: list[torch.Tensor],
        values: list[torch.Tensor],
        clip: tuple[float, float] | None,
    ) -> None:
        """Append this step's rows for ``names`` (``values``: the STEP_FIELDS before the clip
        flags, each [n]) and add to their cumulative ``counters`` (each matrix's CLIP_COUNTS, in
        the same order); ``clip`` = (r_min, r_max) of a clipped trust ratio, None without one.
        Stays on the device."""
        r_raw = values[0]
        if clip is None:
            at_min = at_max = torch.zeros_like(r_raw)
        else:
            at_min, at_max = (r_raw <= clip[0]).float(), (r_raw >= clip[1]).float()
        self._last_diag.append((names, torch.stack([*values, at_min, at_max], dim=1)))
        inc = torch.stack([torch.ones_like(at_min), at_min, at_max], dim=1)
        torch._foreach_add_(counters, list(inc.unbind(0)))

    def diagnostics(self) -> dict[str, float]:
        """Means per matrix class of the latest step's diagnostics (``diag/<class>/<field>``) and
        cumulative clip fractions; one device→host transfer. {} before the first step."""
        if not self._last_diag:
            return {}
        return summarize(*self.diagnostic_rows())

    def diagnostic_rows(self) -> tuple[list[str], list[list[float]], list[str], list[list[float]]]:
        """(names, latest-step rows, names, cumulative rows): what `summarize` takes, so ranks that
        each hold some matrices can merge theirs before summarising. One device→host transfer."""
        if not self._last_diag:
            return [], [], [], []
        device = self._last_diag[0][1].device
        counters = [self.state[p][CLIP_COUNTS] for group in self.param_groups for p in group["params"]]
        parts = [t.reshape(-1) for _, t in self._last_diag] + counters
        flat = torch.cat([t.to(device) for t in parts]).tolist()  # the one transfer
        step_names, step_rows, at = [], [], 0
        for names, t in self._last_diag:
            width = t.shape[1]
            for name in names:
                step_names.append(name)
                step_rows.append(flat[at : at + width])
                at += width
        cum_names, cum_rows = [], []
        for gi, group in enumerate(self.param_groups):
            for name in self._names(gi, group):
                cum_names.append(name)
                cum_rows.append(flat[at : at + len(CUM_FIELDS)])
                at += len(CUM_FIELDS)
        return step_names, step_rows, cum_names, cum_rows

    def matrix_diagnostics(self) -> dict[str, dict[str, float]]:
        """Per-matrix values of the latest step, {name: {field: value}} (one transfer)."""
        if not self._last_diag:
            return {}
        names = [n for ns, _ in self._last_diag for n in ns]
        rows = torch.cat([t for _, t in self._last_diag]).tolist()
        return {n: dict(zip(STEP_FIELDS, row, strict=True)) for n, row in zip(names, rows, strict=True)}


def collect_diagnostics(optimizers: Iterable[torch.optim.Optimizer]) -> dict[str, float]:
    """Merge `diagnostics()` of every optimizer that has one ({} for e.g. AdamW)."""
    out: dict[str, float] = {}
    for opt in optimizers:
        fn = getattr(opt, "diagnostics", None)
        if callable(fn):
            out.update(fn())
    return out
