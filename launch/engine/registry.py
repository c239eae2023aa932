"""Which engine runs which `parallel.backend`: the backend's own answer (launch/backends/). DeepSpeed
is imported only when a ZeRO backend is asked for, so a machine without it runs every other backend."""

from __future__ import annotations

from launch.backends import backend_for
from launch.engine.base import Engine


def engine_class(backend: str) -> type[Engine]:
    """The Engine implementation for `parallel.backend`."""
    return backend_for(backend).engine_class()
