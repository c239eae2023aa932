"""The trust ratio of the Muon family from a matrix's norms (docs/algorithm.md, steps 5–6 and the
design-space table): which norms form its numerator and denominator, OrScale-LM's lazy calibration
constant, and the clip. Pure tensor functions on the device (no host sync), one entry per matrix;
`orscale.muon_family` calls them in stage (c) of its step."""

from __future__ import annotations

import torch
from torch import Tensor


def ratio_terms(
    denominator: str, w_n: Tensor, mh_n: Tensor, q_n: Tensor, d_n: Tensor, s: Tensor, inv_sqrt_numel: Tensor
) -> tuple[Tensor, Tensor | None]:
    """(numerator, denominator) of r for a variant's `denominator` choice (None: no trust ratio)."""
    if denominator == "update":
        return w_n, d_n  # ‖W‖ / ‖λW + sQ‖
    if denominator == "q":
        return w_n, s * q_n  # ‖W‖ / ‖sQ‖
    if denominator == "momentum":
        return w_n, mh_n  # ‖W‖ / ‖M̂‖ (the unit mismatch)
    if denominator == "rms_ratio":
        return w_n * inv_sqrt_numel, mh_n * inv_sqrt_numel  # RMS(W) / RMS(M̂) (MuScale)
    return w_n, None


def calibrate(
    c_states: list[Tensor] | None,
    num: Tensor,
    den: Tensor | None,
    g_n: Tensor,
    w_n: Tensor,
    s: Tensor,
    lr: float,
    eps: float,
) -> tuple[Tensor, Tensor]:
    """(c used in the ratio, c for diagnostics). `c_states`: each matrix's stored 0-d constant for a
    lazily calibrated variant (None: c = 1). Lazy: set once, where still 0 and the step has
    lr > 0, ‖G‖ > 0 and ‖W‖ > 0, to num₀/den₀ (= ‖W₀‖/‖D₀‖), or s if either is < ε; written back
    into `c_states` in place."""
    if c_states is None or den is None:
        ones = torch.ones_like(w_n)
        return ones, ones
    c = torch.stack(c_states)
    if lr > 0:
        fresh = (c == 0) & (g_n > 0) & (w_n > 0)
        value = torch.where((num >= eps) & (den >= eps), num / den, s)
        c = torch.where(fresh, value, c)
        torch._foreach_copy_(c_states, list(c.unbind(0)))
    # Not calibrated yet (no usable step so far): divide by the fallback s rather than by 0.
    return torch.where(c > 0, c, s), c


def trust_ratio(
    num: Tensor, den: Tensor | None, c: Tensor, eps: float, r_min: float, r_max: float
) -> tuple[Tensor, Tensor]:
    """(raw r, clipped r) with r = num / (c·den + ε), clipped to [r_min, r_max]; r ≡ 1 without a
    denominator (plain Muon / Moonlight)."""
    if den is None:
        ones = torch.ones_like(num)
        return ones, ones
    raw = num / (c * den + eps)
    return raw, raw.clamp(r_min, r_max)
