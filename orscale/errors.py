"""The error of the `optim:` section, below every module that raises it (the config, the schedule and
optimizer tables), so that none of them imports another for it."""

from __future__ import annotations

from collections.abc import Iterable

Checks = list[tuple[bool, str]]  # (holds, the one-line OptimConfigError message when it does not)


class OptimConfigError(ValueError):
    """A user error in the `optim:` section: one line naming the key and what would be valid."""


def require_all(checks: Iterable[tuple[bool, str]]) -> None:
    """OptimConfigError with the message of the first check that does not hold."""
    for ok, message in checks:
        if not ok:
            raise OptimConfigError(message)
