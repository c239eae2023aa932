"""Which engine runs which `parallel.backend`. DeepSpeed is imported only when a ZeRO backend is
asked for, so a machine without it runs every other backend."""

from __future__ import annotations

from launch.engine.base import Engine


def engine_class(backend: str) -> type[Engine]:
    """The Engine implementation for `parallel.backend`."""
    if backend in ("zero1", "zero2"):
        from launch.engine.deepspeed_engine import DeepSpeedEngine

        return DeepSpeedEngine
    from launch.engine.torch_engine import TorchEngine

    return TorchEngine
