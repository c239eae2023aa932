"""Training engines: one class per backend behind one interface, and the parallelism they apply from
outside the model."""

from launch.engine.base import Engine
from launch.engine.registry import engine_class

__all__ = ["Engine", "engine_class"]
