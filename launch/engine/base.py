"""The one training-engine interface. Each parallelism backend (launch/backends/) names the class that
implements it for it (`torch_engine.TorchEngine` for the PyTorch-native ones,
`deepspeed_engine.DeepSpeedEngine` for ZeRO), so the training loop (`launch.loop`) holds no backend
branch; one batch through it: ARCHITECTURE.md, "One batch".
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.profiler import record_function

from launch.checkpoint.portable import check_checkpoint_layout
from launch.errors import ConfigError
from launch.parallel_config import ParallelConfig
from launch.runtime.attention import pin_attention
from launch.runtime.process_group import DistEnv, all_reduce_sum
from launch.train_config import TrainConfig
from models import GPT, GPTConfig
from orscale import OptimConfig
from orscale.centring import Centring

if TYPE_CHECKING:
    from launch.backends.base import Backend


def checkpoint_layout(path: Path) -> dict[str, Any]:
    """The layout of the checkpoint at `path` (either family's: every engine reads both); one-line
    ConfigError for what no engine can load."""
    try:
        return check_checkpoint_layout(path)
    except ValueError as err:
        raise ConfigError(str(err)) from None


class Engine(ABC):
    """A model with its optimizers and parallelism, as `backend` (the run's, which chose this engine) lays
    them out. `module` is what forward runs on (for evaluation too), `model` the bare GPT (sizes, FLOPs),
    `dtype` the compute dtype. Every engine is built from the same sections of the run config: the
    resolved model, `parallel:`, `optim:` and `train:`."""

    module: nn.Module

    def __init__(
        self,
        backend: Backend,
        model_cfg: GPTConfig,
        parallel: ParallelConfig,
        optim: OptimConfig,
        train: TrainConfig,
        env: DistEnv,
        dtype: torch.dtype,
        accum_steps: int,
    ) -> None:
        self.backend, self.env, self.dtype, self.accum_steps = backend, env, dtype, accum_steps
        self._skip_update: Callable[[Tensor], bool] | None = None
        self._build(model_cfg, parallel, optim, train)
        pin_attention(self.model, train.attention)  # inside the attention call, where compile traces it
        world = env.world_size
        average = (lambda t: all_reduce_sum(t).div_(world)) if world > 1 else None
        # CBP's M2 where the model centres a layer's input (orscale/cbp.py owns the step): one
        # all-reduce per centred layer, and the bias transported on the rows this rank holds.
        self.centring = Centring.of(self.model, average, local=lambda t: t.to_local() if hasattr(t, "to_local") else t)

    @abstractmethod
    def _build(self, model_cfg: GPTConfig, parallel: ParallelConfig, optim: OptimConfig, train: TrainConfig) -> None:
        """Build the model, its parallelism and its optimizers (collective on every rank)."""

    @property
    @abstractmethod
    def model(self) -> GPT:
        """The bare GPT (under whatever wrapping the backend applies)."""

    @staticmethod
    def check_checkpoint(path: Path, world_size: int) -> None:
        """Cheap checks that the checkpoint at `path` loads into this backend at `world_size`: every engine
        reads either layout at any world size (launch.checkpoint.portable), so only the layout is checked."""
        checkpoint_layout(path)

    def autocast(self) -> AbstractContextManager:
        """What forward runs under (training and evaluation): autocast to the compute dtype."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.env.device.type, dtype=self.dtype)

    def forward_backward(self, batch: Tensor, last_micro_batch: bool) -> Tensor:
        """Forward and backward of one micro-batch [B, T+1]; gradients are communicated only on the
        last micro-batch of a step. Returns the micro-batch's share of the step's mean loss."""
        with self._accumulating(last_micro_batch), self.autocast():
            # Spans of a profiler trace (train.profile); without a profiler running, a few µs each.
            with record_function("forward"):
                loss = self.module(batch[:, :-1], batch[:, 1:]) / self.accum_steps
            with record_function("backward"):
                self._backward(loss)
        return loss.detach()

    def skip_updates(self, decide: Callable[[Tensor], bool]) -> None:
        """From now on `step` asks `decide(grad_norm)` (the step's global raw gradient norm, on
        every rank) whether to skip the step's update: the spike guard (launch/features/divergence.py)."""
        self._skip_update = decide

    def after_update(self) -> None:
        """What every rank runs after each optimizer update, whether or not it was skipped: CBP's M2
        where the model has centred layers."""
        if self.centring is not None:
            self.centring.after_step()

    @abstractmethod
    def _accumulating(self, last_micro_batch: bool) -> AbstractContextManager: ...

    @abstractmethod
    def _backward(self, loss: Tensor) -> None: ...

    @abstractmethod
    def step(self, lr: float) -> Tensor:
        """Clip the raw gradients (global norm), update at `lr`, clear the gradients. Returns the
        global norm of the raw gradients as a device tensor (no host sync)."""

    @abstractmethod
    def diagnostics(self) -> dict[str, float]:
        """The optimizer's `diag/...` values of the latest step. Collective (every rank)."""

    @abstractmethod
    def save(self, directory: Path) -> None:
        """Write model and optimizer state into the checkpoint directory (collective)."""

    @abstractmethod
    def stage(self, directory: Path, group: Any) -> Callable[[], None]:
        """Copy model and optimizer state to host memory now (collective); the returned function
        writes that copy into the checkpoint directory as `save` would, on a background thread
        (`group`: the process group for its collectives; launch.checkpoint.async_writer)."""

    @abstractmethod
    def load(self, directory: Path) -> None:
        """Restore model and optimizer state from a checkpoint directory (collective)."""
