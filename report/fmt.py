"""How report.md and the figures write things: optimizer names, tables, numbers (one rule: a true
minus sign, ∞, "diverged"), LRs, parameter counts and provenance."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from orscale.registry import report_labels
from records.points import tied
from records.read import RunRecord

# Names the report shows that no optimizer registers (the paper's results under another protocol),
# each with its label and the name it is listed after.
REPORT_ONLY = {"orscale_lm_transfer": ("OrScale-LM at Moonlight's LRs", "orscale_lm")}


def _opt_names() -> dict[str, str]:
    names: dict[str, str] = {}
    for name, label in report_labels().items():  # the optimizer table's labels, in its order
        names[name] = label
        names.update({extra: text for extra, (text, after) in REPORT_ONLY.items() if after == name})
    return names


OPT_NAMES = _opt_names()


def opt_name(name: str) -> str:
    base, _, tag = name.partition("#")
    return OPT_NAMES.get(base, base) + (f" #{tag}" if tag else "")


def order(names: Any) -> list[str]:
    """Optimizers in the report's order: the named ones as listed above, then the rest by name."""
    return sorted(names, key=lambda n: (list(OPT_NAMES).index(n) if n in OPT_NAMES else 99, n))


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def num(v: Any, nd: int = 4, sign: bool = False) -> str:
    """A number with `nd` decimals (and its sign), "—" for none, "diverged" for NaN."""
    if v is None or not isinstance(v, (int, float)):
        return "—"
    if not math.isfinite(v):
        return "∞" if v > 0 else "−∞" if v < 0 else "diverged"
    return (f"{v:+.{nd}f}" if sign else f"{v:.{nd}f}").replace("-", "−")


def sig(v: Any, nd: int = 3) -> str:
    """A number with `nd` significant digits."""
    if v is None or not isinstance(v, (int, float)):
        return "—"
    return "∞" if math.isinf(v) else f"{v:.{nd}g}"


def interval(lo: float, hi: float, nd: int = 4) -> str:
    return f"[{num(lo, nd, True)}, {num(hi, nd, True)}]"


def human(n: float) -> str:
    """12,384 -> 12.4k; 1.8e6 -> 1.8M (parameter counts on axes and in legends)."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.3g}"


def fmt_point(p: tuple[float, float]) -> str:
    """A run's two peak LRs: "0.004" when the AdamW group's equals the matrices', else "0.004 / 0.016"
    (matrices / AdamW group: embedding, head, norm gains)."""
    return f"{p[0]:.4g}" + ("" if tied(p) else f" / {p[1]:.4g}")


def short_commit(c: str) -> str:
    """First 10 hex digits, keeping train.py's '-dirty' mark (uncommitted changes) visible."""
    return c[:10] + ("-dirty" if c.endswith("-dirty") else "")


def provenance(runs: list[RunRecord], root: Path) -> str:
    return "<br>".join(
        f"`{r.path.relative_to(root)}` @{'+'.join(map(short_commit, r.commits)) or 'unknown'} cfg:{r.cfg_hash}"
        for r in runs
    )
