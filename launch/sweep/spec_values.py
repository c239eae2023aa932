"""The sweep file's one-line error and the value checks its sections share."""

from __future__ import annotations

import math
from typing import Any, NoReturn


class SpecError(ValueError):
    """A bad sweep file: the message is one line."""


def fail(msg: str) -> NoReturn:
    raise SpecError(msg)


def lrs(raw: Any, where: str) -> list[float]:
    if not isinstance(raw, list) or not raw:
        fail(f"{where} must be a non-empty list of learning rates, got {raw!r}")
    out = []
    for v in raw:
        try:  # PyYAML reads 1e-3 (no dot) as a string
            f = float(v)
        except (TypeError, ValueError):
            fail(f"{where}: {v!r} is not a number")
        if not (math.isfinite(f) and f > 0):
            fail(f"{where}: learning rate {v!r} must be a positive number")
        out.append(f)
    return out
