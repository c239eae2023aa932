"""The sweep file's one-line error and the value checks its sections share."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NoReturn

from launch.nested import unknown_key


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


def check_keys(raw: dict, allowed: Sequence[str], what: str) -> None:
    """One line naming the first key of `raw` that is not in `allowed`, with the nearest valid one."""
    bad = sorted(set(map(str, raw)) - set(allowed))
    if bad:
        fail(unknown_key(what, bad[0], allowed))


def integer(raw: Any, where: str, minimum: int | None = None) -> int:
    """`raw` as a YAML integer (not a bool), at least `minimum` when given."""
    if not isinstance(raw, int) or isinstance(raw, bool) or (minimum is not None and raw < minimum):
        fail(f"{where} must be an integer{f' >= {minimum}' if minimum is not None else ''}, got {raw!r}")
    return raw
