"""The table of parallelism backends (`parallel.backend`), one class per name. Everything that differs
between backends is asked of the backend (launch/backends/base.py), never decided by comparing its name
elsewhere. A new backend is a class in a file of this package and one line in `BACKENDS`."""

from __future__ import annotations

from typing import Any

from launch.backends.base import Backend
from launch.backends.torch_native import DDPBackend, FSDPBackend, NoBackend
from launch.backends.zero import Zero1Backend, Zero2Backend
from launch.errors import ConfigError

BACKENDS: dict[str, type[Backend]] = {
    "none": NoBackend,
    "ddp": DDPBackend,
    "fsdp": FSDPBackend,
    "zero1": Zero1Backend,
    "zero2": Zero2Backend,
}
BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS)
# `parallel.backend: auto`, resolved against the launched world size (launch.config.resolve).
AUTO, ONE_PROCESS, SEVERAL_PROCESSES = "auto", "none", "fsdp"


def backend_for(name: str) -> Backend:
    """The backend registered as `name` (`parallel.backend`, resolved: never auto)."""
    if name not in BACKENDS:
        raise ConfigError(f"parallel.backend must be one of {', '.join(BACKENDS)}; got {name!r}")
    return BACKENDS[name]()


def resolve_auto(name: str, world_size: int) -> str:
    """`parallel.backend` with auto resolved: one process runs unsharded (FSDP2 on one GPU measured
    0.967 of its tokens/s, docs/gpu.md), several processes shard with FSDP2."""
    if name != AUTO:
        return name
    return SEVERAL_PROCESSES if world_size > 1 else ONE_PROCESS


def backend_options() -> list[type[Any]]:
    """The options class of every `parallel.<section>` a backend owns, each once."""
    return list(dict.fromkeys(o for kind in BACKENDS.values() for o in kind.options))


def names_of(kind: type[Backend]) -> str:
    """'zero1 or zero2': the registered names of the backends of one family, for a message."""
    names = [name for name, cls in BACKENDS.items() if issubclass(cls, kind)]
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
