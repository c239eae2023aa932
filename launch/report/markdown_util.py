"""Small shared pieces of report.md and summary.json: optimizer display names, the table writer and
strict JSON."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

OPT_NAMES = {
    "adamw": "AdamW",
    "muon_moonlight": "Muon+Moonlight",
    "orscale_lm": "OrScale-LM",
    "muon": "Muon",
    "orscale": "OrScale",
    "cbp": "CBP",
    "lamb": "LAMB",
    "lars": "LARS",
}


def opt_name(name: str) -> str:
    base, _, tag = name.partition("#")
    return OPT_NAMES.get(base, base) + (f" #{tag}" if tag else "")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def strict_json(x: Any) -> Any:
    """NaN -> null and ±inf -> "inf"/"-inf" (a speedup beyond AdamW's asymptote), tuples -> lists:
    summary.json stays valid JSON for any reader, not only Python's."""
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): strict_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [strict_json(v) for v in x]
    if isinstance(x, np.generic):
        return strict_json(x.item())
    return x


def human(n: float) -> str:
    """12,384 -> 12.4k; 1.8e6 -> 1.8M (parameter counts on axes and in legends)."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.3g}"
