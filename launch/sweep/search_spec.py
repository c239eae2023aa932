"""`lr_search` in a sweep file: tune each (scale, optimizer)'s LR on one seed, edge-extended, and
optionally the AdamW group's LR too (a 2-D coordinate search; launch/sweep/plan.py runs it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from launch.sweep.spec_values import check_keys, integer
from launch.sweep.spec_values import fail as _fail
from launch.sweep.spec_values import lrs as _lrs

SEARCH_KEYS = ("seed", "max_extra", "factor", "adamw_lr", "shared")

ADAMW_SEARCH_KEYS = ("ratios", "rounds")


@dataclass(frozen=True)
class LrSearch:
    """`lr_search`: tune on `seed`, extend an edge optimum by `factor` up to `max_extra` times;
    `adamw_ratios` (not empty): then tune optim.adamw_lr too, `rounds` coordinate rounds;
    `shared`: also score the tied optimum."""

    seed: int
    max_extra: int = 2
    factor: float | None = None  # None: the grid's own ratio between neighbours (2 when it has one LR)
    adamw_ratios: tuple[float, ...] = ()
    rounds: int = 1
    shared: bool = False


def parse_search(raw: Any) -> LrSearch | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or "seed" not in raw:
        _fail(f"'lr_search' must be a mapping with a 'seed' (and optional max_extra, factor), got {raw!r}")
    check_keys(raw, SEARCH_KEYS, "lr_search key")
    seed, extra = integer(raw["seed"], "lr_search.seed"), integer(raw.get("max_extra", 2), "lr_search.max_extra", 0)
    factor = raw.get("factor")
    if factor is not None and not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 1):
        _fail(f"lr_search.factor must be a number > 1, got {factor!r}")
    shared = raw.get("shared", False)
    if not isinstance(shared, bool):
        _fail(f"lr_search.shared must be true or false, got {shared!r}")
    ratios, rounds = _adamw_search(raw.get("adamw_lr"))
    if shared and not ratios:
        _fail("lr_search.shared scores the tied optimum beside the tuned one: it needs lr_search.adamw_lr")
    return LrSearch(seed, extra, float(factor) if factor is not None else None, ratios, rounds, shared)


def _adamw_search(raw: Any) -> tuple[tuple[float, ...], int]:
    """`lr_search.adamw_lr`: {ratios: [...], rounds: N} -> (ratios, rounds); absent: ((), 1)."""
    if raw is None:
        return (), 1
    if not isinstance(raw, dict) or "ratios" not in raw:
        _fail(f"lr_search.adamw_lr must be a mapping with 'ratios' (and optional rounds), got {raw!r}")
    check_keys(raw, ADAMW_SEARCH_KEYS, "lr_search.adamw_lr key")
    ratios = _lrs(raw["ratios"], "lr_search.adamw_lr.ratios")
    if any(math.isclose(r, 1.0) for r in ratios):
        _fail("lr_search.adamw_lr.ratios: 1 is the shared protocol's point, already run; list the others")
    return tuple(ratios), integer(raw.get("rounds", 1), "lr_search.adamw_lr.rounds", 1)
