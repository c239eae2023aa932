"""Training engines: the interface (`base.Engine`), one class per backend (`torch_engine`,
`deepspeed_engine`), the registry that picks one (`registry`) and the parallelism applied from outside
the model (`parallelize`)."""

from launch.engine.base import Engine
from launch.engine.registry import engine_class

__all__ = ["Engine", "engine_class"]
