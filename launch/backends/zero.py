"""DeepSpeed ZeRO stages 1 and 2 (`zero1`, `zero2`), run by
`launch.engine.deepspeed_engine.DeepSpeedEngine` around the project's client optimizer
(`orscale.distributed.zero`); checkpoints are safetensors by parameter name (docs/choices.md, "ZeRO").
DeepSpeed is imported only when one of these backends runs."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from launch.backends.base import Backend
from launch.errors import ConfigError

if TYPE_CHECKING:
    from launch.engine.base import Engine
    from orscale import OptimConfig


class ZeroBackend(Backend):
    """A DeepSpeed ZeRO stage: fp32 master partitions, the Muon family on whole matrices at owner ranks."""

    optimizer_placement = None  # ZeRO drives its own client optimizer
    checkpoint_layout = "zero"
    accelerate_kind = "DEEPSPEED"

    def engine_class(self) -> type[Engine]:
        from launch.engine.deepspeed_engine import DeepSpeedEngine

        return DeepSpeedEngine

    def check_launch(self, world_size: int) -> None:
        if importlib.util.find_spec("deepspeed") is None:
            raise ConfigError(f"parallel.backend={self.name} needs DeepSpeed: pip install deepspeed")

    def check_optimizer(self, optim: OptimConfig) -> None:
        from orscale.distributed.zero import ZERO_OPTIMIZERS

        if optim.name not in ZERO_OPTIMIZERS:
            raise ConfigError(
                f"parallel.backend={self.name} cannot run optim.name={optim.name!r}: ZeRO-1/2 supports "
                f"{', '.join(ZERO_OPTIMIZERS)}; use parallel.backend=ddp or fsdp for it"
            )


class Zero1Backend(ZeroBackend):
    """ZeRO-1: optimizer state partitioned."""

    name = "zero1"
    label = "ZeRO-1"
    zero_stage = 1


class Zero2Backend(ZeroBackend):
    """ZeRO-2: optimizer state and gradients partitioned."""

    name = "zero2"
    label = "ZeRO-2"
    zero_stage = 2
