"""The Muon family as a table of named choices (docs/algorithm.md, "Baselines" and "The trust-ratio
design space").

Every member shares one step (``orscale.muon_family.MuonFamily``); they differ only in:

* ``shape``        — shape factor s: ``one`` (s = 1) | ``moonlight`` (s = 0.2·√max(m, n)).
* ``denominator``  — what the trust ratio r = num / (c·den + ε) divides by:
    ``none``      no trust ratio at all (r ≡ 1, no clipping): plain Muon / Moonlight;
    ``update``    ‖λW + sQ‖_F, the real update direction D (OrScale's principle);
    ``q``         ‖sQ‖_F (= ‖Q‖_F when s = 1), the orthogonalised direction alone;
    ``momentum``  ‖M̂‖_F, raw Nesterov momentum (gradient units: the unit mismatch);
    ``rms_ratio`` RMS(M̂) with numerator RMS(W) (MuScale). Note RMS(W)/RMS(M̂) = ‖W‖/‖M̂‖ for
                  a single matrix, so this differs from ``momentum`` only in where ε enters.
  The numerator is ‖W‖_F except for ``rms_ratio``.
* ``decay``        — ``coupled``: W ← W − η·r·(λW + sQ) (decay inside the trust-scaled step);
                     ``decoupled``: W ← (1 − ηλ)·W − η·r·s·Q.
* ``calibration``  — ``none``: c = 1; ``lazy``: c = num₀/den₀ set once at the first step with a
                     gradient (fallback c = s when either is < ε), so that r₀ = 1.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

SHAPES = ("one", "moonlight")
DENOMINATORS = ("none", "update", "q", "momentum", "rms_ratio")
DECAYS = ("coupled", "decoupled")
CALIBRATIONS = ("none", "lazy")
MOONLIGHT_FACTOR = 0.2  # s = 0.2·√max(m, n): matches AdamW's per-element update RMS


@dataclass(frozen=True)
class Variant:
    """One member of the Muon family as its four choices (shape factor, trust-ratio denominator,
    weight decay, calibration); the module docstring says what each value means."""

    shape: str
    denominator: str
    decay: str
    calibration: str

    def __post_init__(self) -> None:
        for field, allowed in (
            ("shape", SHAPES),
            ("denominator", DENOMINATORS),
            ("decay", DECAYS),
            ("calibration", CALIBRATIONS),
        ):
            value = getattr(self, field)
            if value not in allowed:
                raise ValueError(f"Muon-family {field} must be one of {', '.join(allowed)}; got {value!r}")
        if self.denominator == "none" and self.calibration != "none":
            raise ValueError("calibration='lazy' needs a trust ratio (denominator != 'none')")

    def replace(self, **changes: str | None) -> Variant:
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


# docs/algorithm.md's baselines and its trust-ratio design space, row by row.
VARIANTS: dict[str, Variant] = {
    "muon": Variant("one", "none", "decoupled", "none"),
    "muon_moonlight": Variant("moonlight", "none", "decoupled", "none"),
    "orscale": Variant("one", "update", "coupled", "none"),
    "orscale_lm": Variant("moonlight", "update", "coupled", "lazy"),
    "orscale_qnorm": Variant("one", "q", "decoupled", "none"),
    "mutrust": Variant("one", "momentum", "decoupled", "none"),
    "muscale": Variant("moonlight", "rms_ratio", "decoupled", "none"),
    "orscale_lm_uncalibrated": Variant("moonlight", "update", "coupled", "none"),
    # Calibrated against its own denominator ‖sQ₀‖, then decoupled decay: the runaway corner.
    "orscale_lm_decoupled": Variant("moonlight", "q", "decoupled", "lazy"),
}


def get_variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise ValueError(f"unknown Muon-family preset {name!r}; valid: {', '.join(VARIANTS)}")
    return VARIANTS[name]
