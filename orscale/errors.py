"""The error of the `optim:` section, below every module that raises it (the config, the schedule and
optimizer tables), so that none of them imports another for it."""

from __future__ import annotations


class OptimConfigError(ValueError):
    """A user error in the `optim:` section: one line naming the key and what would be valid."""
