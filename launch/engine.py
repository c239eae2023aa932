"""One training-engine interface, one implementation per parallelism backend.

    engine = build_engine(model_cfg, cfg, env, dtype, accum_steps)
    for micro in range(accum_steps):
        loss = engine.forward_backward(batch, last_micro_batch=micro == accum_steps - 1)
    grad_norm = engine.step(lr)          # clip the raw gradients, set lr, update; no host sync
    engine.diagnostics()                 # collective, on logging steps
    engine.save(dir) / engine.load(dir)  # a sharded checkpoint part (collective)

* `TorchEngine` (`none` | `ddp` | `fsdp`): the model built and parallelised by
  `launch.parallelize`, the optimizers by `orscale.build_optimizers`, checkpoints through
  `torch.distributed.checkpoint` (`dcp/`; loads at any world size).
* `DeepSpeedEngine` (`zero1` | `zero2`, `launch/deepspeed_engine.py`): DeepSpeed's engine around
  the project's ZeRO client optimizer, DeepSpeed's own checkpoint format.
The training loop sees only this interface, so it holds no backend branch.
"""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ContextManager

import torch
from torch import Tensor, nn

from launch.checkpoint import ModelAndOptimizers
from launch.config import Config, ConfigError
from launch.distributed import DistEnv, all_reduce_sum
from launch.parallelize import build_model, no_sync, wrap_ddp
from launch.spikes import SpikeGuard
from models import GPT, GPTConfig
from models.centered_linear import update_means
from orscale import build_optimizers, collect_diagnostics, set_lr


class Engine(ABC):
    """A model with its optimizers and parallelism. `module` is what forward runs on (for
    evaluation too), `model` the bare GPT (sizes, FLOPs), `dtype` the compute dtype."""

    module: nn.Module
    model: GPT

    def __init__(self, env: DistEnv, dtype: torch.dtype, accum_steps: int) -> None:
        self.env, self.dtype, self.accum_steps = env, dtype, accum_steps
        self._step_loss = torch.zeros((), device=env.device)  # this rank's loss of the current step

    @staticmethod
    def check_config(cfg: Config) -> None:
        """Cheap checks before anything is built: ConfigError for what this backend cannot run."""

    @staticmethod
    def check_checkpoint(path: Path, world_size: int) -> None:
        """Cheap checks that the checkpoint at `path` loads into this backend at `world_size`."""

    def autocast(self) -> ContextManager:
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.env.device.type, dtype=self.dtype)

    def forward_backward(self, batch: Tensor, last_micro_batch: bool) -> Tensor:
        """Forward and backward of one micro-batch [B, T+1]; gradients are communicated only on the
        last micro-batch of a step. Returns the micro-batch's share of the step's mean loss."""
        with self._accumulating(last_micro_batch), self.autocast():
            loss = self.module(batch[:, :-1], batch[:, 1:]) / self.accum_steps
            self._backward(loss)
        self._step_loss += loss.detach()
        return loss.detach()

    def _update_centring(self) -> None:
        """CBP's M2 after the step: every rank's input mean averaged (one all-reduce per centred
        layer), the EMA mean moved and the bias transported on the rows this rank holds."""
        world = self.env.world_size
        average = (lambda t: all_reduce_sum(t).div_(world)) if world > 1 else None
        update_means(self.model, average=average, local=lambda t: t.to_local() if hasattr(t, "to_local") else t)

    @abstractmethod
    def _accumulating(self, last_micro_batch: bool) -> ContextManager: ...

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
    def load(self, directory: Path) -> None:
        """Restore model and optimizer state from a checkpoint directory (collective)."""


class TorchEngine(Engine):
    """PyTorch-native data parallelism: one process, DDP or FSDP2."""

    def __init__(self, model_cfg: GPTConfig, cfg: Config, env: DistEnv, dtype: torch.dtype,
                 accum_steps: int) -> None:
        super().__init__(env, dtype, accum_steps)
        backend = cfg.parallel.backend
        self.model = build_model(model_cfg, cfg.parallel, cfg.train.seed, env, dtype)
        self.module = wrap_ddp(self.model, env) if backend == "ddp" else self.model
        self.optimizers = build_optimizers(self.model, cfg.optim, backend=backend, mode=cfg.parallel.muon_mode)
        self.max_norm = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf
        self._checkpoint = ModelAndOptimizers(self.module, self.optimizers)
        t = cfg.train
        self.spikes = SpikeGuard(t.spike_window, t.spike_sigma, env.world_size) if t.skip_spikes else None

    @staticmethod
    def check_checkpoint(path: Path, world_size: int) -> None:
        if not (path / "dcp").is_dir():
            raise ConfigError(f"{path} was saved by parallel.backend zero1/zero2 (no dcp/ inside); resume it with "
                              "zero1 or zero2 (at any world size)")

    def _accumulating(self, last_micro_batch: bool) -> ContextManager:
        return no_sync(self.module, last_micro_batch)

    def _backward(self, loss: Tensor) -> None:
        loss.backward()

    def step(self, lr: float) -> Tensor:
        set_lr(self.optimizers, lr)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a replicated DTensor
        skip = self.spikes is not None and self.spikes.is_spike(self._step_loss, norm)
        for opt in self.optimizers:
            if not skip:
                opt.step()
            opt.zero_grad(set_to_none=True)
        if self.model.cfg.center_mlp:
            self._update_centring()
        self._step_loss = torch.zeros_like(self._step_loss)
        return norm

    def diagnostics(self) -> dict[str, float]:
        extra = {"skipped_steps": self.spikes.skipped} if self.spikes is not None else {}
        return {**collect_diagnostics(self.optimizers), **extra}

    def save(self, directory: Path) -> None:
        self._checkpoint.save(directory)

    def load(self, directory: Path) -> None:
        self._checkpoint.load(directory)


def engine_class(backend: str) -> type[Engine]:
    """The Engine implementation for `parallel.backend`."""
    if backend in ("zero1", "zero2"):
        from launch.deepspeed_engine import DeepSpeedEngine  # DeepSpeed is imported only when used

        return DeepSpeedEngine
    return TorchEngine


def build_engine(model_cfg: GPTConfig, cfg: Config, env: DistEnv, dtype: torch.dtype, accum_steps: int,
                 **kwargs: Any) -> Engine:
    return engine_class(cfg.parallel.backend)(model_cfg, cfg, env, dtype, accum_steps, **kwargs)
