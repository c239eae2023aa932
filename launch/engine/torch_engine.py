"""The PyTorch-native engine: one process, DDP or FSDP2 (launch/backends/torch_native.py). The model
is built and parallelised by `parallelize` as its backend says, the optimizers by `orscale.build_optimizers`
at the backend's placement, and
checkpoints go through `torch.distributed.checkpoint` (`dcp/`, loadable at any world size)."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.profiler import record_function

from launch.checkpoint.dcp_state import ModelAndOptimizers
from launch.checkpoint.portable import (
    checkpoint_kind,
    dcp_stores_whole,
    read_on_rank0,
    read_optimizer_state,
    read_weights,
)
from launch.engine.base import Engine
from launch.engine.parallelize import build_model, drops_gradients, no_sync
from launch.errors import ConfigError
from launch.parallel_config import ParallelConfig
from launch.train_config import TrainConfig
from models import GPT, GPTConfig
from orscale import OptimConfig, build_optimizers, collect_diagnostics, set_lr
from orscale.adamw import adamw_implementation
from orscale.optim_common import place_loaded_state
from orscale.routing import canonical_name


class TorchEngine(Engine):
    """PyTorch-native data parallelism: one process, DDP or FSDP2."""

    def _build(self, model_cfg: GPTConfig, parallel: ParallelConfig, optim: OptimConfig, train: TrainConfig) -> None:
        env, backend = self.env, self.backend
        if backend.optimizer_placement is None:  # a backend with a client optimizer of its own (ZeRO)
            raise ConfigError(f"TorchEngine cannot run parallel.backend={backend.name}; use its own engine")
        self._shards = backend.shards_parameters
        self._model = build_model(model_cfg, parallel, train.seed, env, self.dtype, backend=backend)
        self.module = backend.wrap(self._model, env)
        self.optimizers = build_optimizers(
            self._model,
            optim,
            backend.optimizer_placement,
            mode=parallel.muon_mode,
            replica_split=parallel.muon_replica_split,
            overlap=parallel.muon_overlap,
            bucket_numel=parallel.muon_bucket_numel,
        )
        self.max_norm = optim.grad_clip if optim.grad_clip > 0 else math.inf
        self._adamw_impl = optim.fused
        self._checkpoint = ModelAndOptimizers(self.module, self.optimizers)
        self._drop_grads = drops_gradients(self.module)

    @property
    def model(self) -> GPT:
        return self._model

    def _accumulating(self, last_micro_batch: bool) -> AbstractContextManager:
        return no_sync(self.module, last_micro_batch)

    def _backward(self, loss: Tensor) -> None:
        loss.backward()

    @record_function("optimizer_step")  # a profiler trace's span (train.profile): clip and update
    def step(self, lr: float) -> Tensor:
        set_lr(self.optimizers, lr)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a replicated DTensor
        skip = self._skip_update is not None and self._skip_update(norm)
        for opt in self.optimizers:
            if not skip:
                opt.step()
            opt.zero_grad(set_to_none=self._drop_grads)
        self.after_update()
        return norm

    def diagnostics(self) -> dict[str, float]:
        return collect_diagnostics(self.optimizers)

    def save(self, directory: Path) -> None:
        self._checkpoint.save(directory)

    def stage(self, directory: Path, group: Any) -> Callable[[], None]:
        return self._checkpoint.stage(directory, group)

    def load(self, directory: Path) -> None:
        if checkpoint_kind(directory) == "dcp" and not self._laid_out_otherwise(directory):
            self._checkpoint.load(directory)  # DCP's own load: each rank reads what it keeps
        else:
            self._load_logical(directory)
        for opt in self.optimizers:  # a loaded AdamW keeps its saved fused/foreach flags: this run's win
            if isinstance(opt, torch.optim.AdamW):
                impl = adamw_implementation(self._adamw_impl, opt.param_groups)
                for group in opt.param_groups:
                    group.update(fused=impl.get("fused"), foreach=impl.get("foreach"))
            place_loaded_state(opt)  # torch's rule with this run's flags (fused: step on p's device)

    def _laid_out_otherwise(self, directory: Path) -> bool:
        """Whether the DCP checkpoint holds its tensors otherwise than this run's ranks do, so that DCP's
        own load would have every rank read all of it: shards (FSDP2) into DDP replicas, or whole tensors
        (one process, DDP) into FSDP2 shards. DDP from whole tensors keeps DCP's own load, in which every
        rank reads every tensor (its replica)."""
        if self.env.world_size == 1:
            return False
        return dcp_stores_whole(directory) == self._shards

    def _load_logical(self, directory: Path) -> None:
        # Whole weights and optimizer state by name (ZeRO-1/2's layout, or a DCP checkpoint laid out
        # otherwise), read on rank 0 alone and placed on every rank as this engine's parameters are
        # (FSDP2 DTensors, DDP replicas, plain tensors): the other ranks read nothing.
        shapes = {canonical_name(n): p.shape for n, p in self._model.named_parameters()}
        read = read_on_rank0(lambda: (read_weights(directory), read_optimizer_state(directory, shapes)))
        self._checkpoint.load_logical(*(read or ({}, {})))
