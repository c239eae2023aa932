"""Small shared pieces of report.md and summary.json: optimizer display names, the table writer,
number and provenance formatting, and strict JSON."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from launch.run.records import RunRecord

OPT_NAMES = {
    "adamw": "AdamW",
    "muon_moonlight": "Muon+Moonlight",
    "orscale_lm": "OrScale-LM",
    "orscale_lm_transfer": "OrScale-LM at Moonlight's LRs",
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


def fmt(x: float | None, nd: int = 4, sign: bool = False) -> str:
    if x is None:
        return "—"
    if not math.isfinite(x):
        return "diverged" if isinstance(x, float) and math.isnan(x) else str(x)
    return f"{x:+.{nd}f}" if sign else f"{x:.{nd}f}"


def fmt_lr(lr: float) -> str:
    return f"{lr:.4g}"


def fmt_point(point: tuple[float, float]) -> str:
    """A run's two peak LRs: "0.004" when the AdamW group's equals the matrices', else "0.004 / 0.016"
    (matrices / AdamW group: embedding, head, norm gains)."""
    lr, adamw = point
    return fmt_lr(lr) + ("" if math.isclose(lr, adamw, rel_tol=1e-6) else f" / {fmt_lr(adamw)}")


def short_commit(c: str) -> str:
    """First 10 hex digits, keeping train.py's '-dirty' mark (uncommitted changes) visible."""
    return c[:10] + ("-dirty" if c.endswith("-dirty") else "")


def provenance(runs: list[RunRecord], root: Path) -> str:
    return "<br>".join(
        f"`{r.path.relative_to(root)}` @{'+'.join(map(short_commit, r.commits)) or 'unknown'} cfg:{r.cfg_hash}"
        for r in runs
    )
