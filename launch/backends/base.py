"""What a parallelism backend (`parallel.backend`) is: one class per name, owning everything that
differs between backends — whether it needs a process group and how many processes it runs on, how
the model is parallelised, which engine runs it, how its checkpoints are laid out, where the
optimizers find the parameters, and the config settings only it accepts. Nothing outside
`launch.backends` compares a backend's name; it asks the backend (`launch.backends.backend_for`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from launch.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from launch.engine.base import Engine
    from launch.parallel_config import ParallelConfig
    from launch.runtime.process_group import DistEnv
    from launch.train_config import TrainConfig
    from models import GPT, GPTConfig
    from orscale import OptimConfig


class Backend:
    """One `parallel.backend`. The class attributes describe it; the methods act for it."""

    name: ClassVar[str]
    label: ClassVar[str]  # what a report calls it
    # Where `orscale.build_optimizers` finds the parameters (its placement: none | ddp | fsdp);
    # None: the backend drives a client optimizer of its own (ZeRO).
    optimizer_placement: ClassVar[str | None]
    # What its engine writes into a checkpoint: "dcp" (torch.distributed.checkpoint, any world
    # size) or "zero" (safetensors by parameter name; launch/checkpoint/portable.py reads both).
    checkpoint_layout: ClassVar[str]
    process_group: ClassVar[bool] = True  # creates the default process group, even on one process
    many_processes: ClassVar[bool] = True  # runs on more than one process
    # FSDP2 DTensor parameters: built on the meta device, `parallel.fsdp.param_dtype`, HSDP meshes,
    # and AdamW's kernel rule for DTensors (orscale.adamw.adamw_auto).
    shards_parameters: ClassVar[bool] = False
    # The `accelerate launch` config kind that announces this backend (ACCELERATE_USE_<kind>=true).
    accelerate_kind: ClassVar[str | None] = None
    zero_stage: ClassVar[int | None] = None  # DeepSpeed's ZeRO stage, for ZeRO backends
    options: ClassVar[tuple[type[Any], ...]] = ()  # the options classes of its own `parallel.<section>`s

    def engine_class(self) -> type[Engine]:
        """The Engine implementation that runs this backend (launch/engine/)."""
        from launch.engine.torch_engine import TorchEngine

        return TorchEngine

    def build_engine(
        self,
        model_cfg: GPTConfig,
        parallel: ParallelConfig,
        optim: OptimConfig,
        train: TrainConfig,
        env: DistEnv,
        dtype: torch.dtype,
        accum_steps: int,
    ) -> Engine:
        """This backend's engine for a run (collective on every rank)."""
        return self.engine_class()(self, model_cfg, parallel, optim, train, env, dtype, accum_steps)

    def check_launch(self, world_size: int) -> None:
        """One-line ConfigError for a launch of `world_size` processes this backend cannot run, before
        any process group exists (identical on every rank)."""

    def check_layout(self, parallel: ParallelConfig) -> None:
        """The `parallel:` settings only a sharding backend accepts: HSDP's dp_replicate."""
        if parallel.dp_replicate != 1:
            raise ConfigError(
                f"parallel.dp_replicate={parallel.dp_replicate} (HSDP) needs parallel.backend=fsdp (got {self.name}); "
                "set parallel.backend=fsdp or parallel.dp_replicate=1"
            )

    def check_optimizer(self, optim: OptimConfig) -> None:
        """One-line ConfigError for an optimizer this backend cannot run (every one runs by default)."""

    def meta_init(self, parallel: ParallelConfig) -> bool:
        """Whether the model is built on the meta device and initialised shard by shard."""
        return False

    def shard(self, model: GPT, parallel: ParallelConfig, env: DistEnv, dtype: torch.dtype) -> None:
        """Shard `model` in place (after compiling its blocks, before compiling the whole model)."""

    def wrap(self, model: GPT, env: DistEnv) -> nn.Module:
        """What forward runs on: the model itself, or a wrapper that communicates its gradients."""
        return model

    def __repr__(self) -> str:
        return f"<backend {self.name}>"
