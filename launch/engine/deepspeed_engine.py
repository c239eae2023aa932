"""The DeepSpeed ZeRO-1/2 engine (launch/backends/zero.py): `launch.engine.base.Engine`
over DeepSpeed's engine with ``orscale.distributed.zero.ZeroShardedOptimizer`` (AdamW on flat partitions, the Muon
family on whole matrices at an owner rank), so that it matches a single-process run of ``build_optimizers``.

Why fp32 parameters and reductions under bf16 autocast, and why checkpoints are safetensors by parameter name (any
data-parallel size, either stage, nothing unpickled) rather than DeepSpeed's own: docs/choices.md, "ZeRO"; the
forward's autocast: docs/gpu.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import safe_open
from torch.profiler import record_function

from launch.checkpoint.async_writer import host_copy
from launch.checkpoint.portable import MODEL, STATE, ZERO_FORMAT, ZERO_META, ZERO_TAG, FromRank0, dcp_entries
from launch.engine.base import Engine, checkpoint_layout
from launch.engine.parallelize import build_model
from launch.errors import ConfigError
from launch.parallel_config import ParallelConfig
from launch.train_config import TrainConfig
from models import GPT, GPTConfig
from orscale import OptimConfig, set_lr
from orscale.distributed.zero import ZeroShardedOptimizer
from orscale.distributed.zero_checkpoint import (
    LogicalState,
    load_zero_state,
    names_read_whole,
    save_tensors,
    stage_zero_state,
    write_zero_state,
)
from orscale.routing import canonical_name

TAG, META, FORMAT = ZERO_TAG, ZERO_META, ZERO_FORMAT  # the layout this engine writes (launch.checkpoint.portable)


def ds_config(
    stage: int, micro: int, world_size: int, accum_steps: int, dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """The DeepSpeed config dict for this run (nothing is read from a JSON file) at ZeRO `stage`. fp32
    parameters, gradients and reductions; compute in `dtype` under autocast, as the other engines
    compute. `micro`: sequences per micro-batch per rank (train.micro_batch_size)."""
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum_steps,
        "train_batch_size": micro * accum_steps * world_size,
        "gradient_clipping": 0.0,  # the client optimizer clips the raw gradients itself
        "zero_optimization": {
            "stage": stage,
            "elastic_checkpoint": False,  # the client optimizer's state_dict is saved as is, per rank
            "round_robin_gradients": False,
            "compute_grad_norm": True,  # the clip uses DeepSpeed's global norm of the raw gradients
            "load_from_fp32_weights": True,
        },
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
        # DeepSpeed's forward opens this autocast itself (an outer one alone it would switch off).
        # No module is "lower-precision safe": DeepSpeed would reduce their gradients in `dtype`.
        "torch_autocast": {"enabled": dtype != torch.float32, "dtype": str(dtype), "lower_precision_safe_modules": []},
        "communication_data_type": "fp32",
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }


def _check_names(source: Path, saved: set[str], own: set[str]) -> None:
    if saved != own:
        diff = sorted(saved ^ own)
        raise ConfigError(
            f"{source} does not match this model ({len(diff)} tensors differ, e.g. {diff[0]}); "
            "resume with the model config that wrote it"
        )


class DeepSpeedEngine(Engine):
    """A DeepSpeed ZeRO-1/2 engine around the GPT with the project's optimizers."""

    def _build(self, model_cfg: GPTConfig, parallel: ParallelConfig, optim: OptimConfig, train: TrainConfig) -> None:
        if self.backend.zero_stage is None:  # only a ZeRO backend names this engine
            raise ConfigError(f"DeepSpeedEngine runs the ZeRO backends, not parallel.backend={self.backend.name}")
        env, dtype, accum_steps = self.env, self.dtype, self.accum_steps
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        accel = get_accelerator().device_name()
        if accel != env.device.type:
            raise ConfigError(
                f"DeepSpeed's accelerator is {accel!r} but train.device resolved to "
                f"{env.device.type!r}; set DS_ACCELERATOR={env.device.type}"
            )
        if not dist.is_initialized():
            raise RuntimeError(
                "DeepSpeedEngine needs the process group (launch.runtime.process_group.init_distributed)"
            )
        if accel == "cpu":
            # DeepSpeed's comm compiles a shared-memory all-reduce op for the CPU at start (20-40 s on
            # a first run) unless marked incompatible; only its AutoTP inference all-reduce calls it.
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        self.zero_stage: int = self.backend.zero_stage
        self.optim_name = optim.name
        self.world_size = dist.get_world_size()
        self.config = ds_config(self.zero_stage, train.micro_batch_size, self.world_size, accum_steps, dtype)
        model = build_model(model_cfg, parallel, train.seed, env, dtype, backend=self.backend)
        self.optimizer = ZeroShardedOptimizer(model, optim)
        self._ds: Any  # DeepSpeed's engine (an nn.Module with backward/step of its own; untyped)
        self._ds, _, _, _ = deepspeed.initialize(
            model=model, optimizer=self.optimizer, config=self.config, dist_init_required=False
        )
        self.module = self._ds  # what forward and evaluation run on
        self.optimizer.bind(self._ds.optimizer, optim.grad_clip)
        self._micro = 0

    def skip_updates(self, decide: Callable[[torch.Tensor], bool]) -> None:
        """Decided inside DeepSpeed's step, once its global norm exists (the client optimizer asks)."""
        self.optimizer.skip_update = decide

    @property
    def model(self) -> GPT:
        return self._ds.module

    def _accumulating(self, last_micro_batch: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # DeepSpeed reduces at its own accumulation boundary

    def _backward(self, loss: torch.Tensor) -> None:
        self.backward(loss)

    def backward(self, loss: torch.Tensor) -> None:
        """`loss` is already divided by accum_steps (as the trainer computes it): DeepSpeed must not
        divide again. Off the accumulation boundary DeepSpeed's step only counts the micro-batch."""
        self._micro += 1
        if self._micro > self.accum_steps:
            raise RuntimeError(
                f"DeepSpeedEngine.backward called {self._micro} times before step(); accum_steps is {self.accum_steps}"
            )
        self._ds.backward(loss, scale_wrt_gas=False)
        if self._micro < self.accum_steps:
            self._ds.step()

    @record_function("optimizer_step")  # a profiler trace's span (train.profile): reduce, clip, update
    def step(self, lr: float) -> Any:
        """Set lr on every group, then reduce, clip (raw global norm) and update. Returns the global
        norm of the raw gradients (a device tensor where DeepSpeed keeps one: no host sync)."""
        if self._micro != self.accum_steps:
            raise RuntimeError(f"DeepSpeedEngine.step after {self._micro} backward calls; expected {self.accum_steps}")
        set_lr([self.optimizer], lr)  # the AdamW groups at optim.adamw_lr's share of it
        self.optimizer.begin_step()
        self._ds.step()
        self.after_update()
        self._micro = 0
        return self._ds.get_global_grad_norm()

    @torch.no_grad()
    def _load_weights(self, path: Path) -> None:
        """Copy the saved tensors into the model one at a time (memory-mapped reads: no rank holds a
        second whole copy of the weights)."""
        own = self.model.state_dict()  # views of the parameters and persistent buffers
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            _check_names(path, set(fh.keys()), set(own))
            for name, tensor in own.items():
                tensor.copy_(fh.get_tensor(name))

    def after_update(self) -> None:
        """M2 on the whole weights every rank holds (after DeepSpeed copied the updated master
        partitions back), then the transported biases into the master partitions, the copy the
        next step starts from."""
        super().after_update()
        if self.centring is not None:
            self.optimizer.copy_from_model(self.model, self.centring.biases)

    def diagnostics(self) -> dict[str, float]:
        """Same ``diag/...`` keys as ``orscale.collect_diagnostics``. Collective (every rank)."""
        return self.optimizer.diagnostics()

    def save(self, directory: Path) -> None:
        """Collective. Each rank's optimizer state under zero/ (by parameter name), and (rank 0) the
        weights in model.safetensors: ZeRO-1/2 keep whole fp32 weights on every rank, equal to the
        master partitions, so they serve resume, export and evaluation alike."""
        self.stage(directory, None)()

    def stage(self, directory: Path, group: Any) -> Callable[[], None]:
        """Host copies of this rank's optimizer state and (rank 0) the weights, taken now; the
        returned function writes the files `save` writes. No collective in either half (`group` is
        unused): each rank writes its own files."""
        (directory / TAG).mkdir(exist_ok=True)
        state = stage_zero_state(self.optimizer, host_copy)
        # Copies: ZeRO's params are views into its flat buffers, which safetensors refuses.
        weights = {k: host_copy(v) for k, v in self.model.state_dict().items()} if self.env.is_main else {}
        meta = {
            "format": FORMAT,
            "world_size": self.world_size,
            "stage": self.zero_stage,
            "optim": self.optim_name,
        }

        def write() -> None:
            write_zero_state(state, directory / TAG / f"rank{self.env.rank}.safetensors")
            if self.env.is_main:
                save_tensors(weights, directory / "model.safetensors")
                (directory / TAG / META).write_text(json.dumps(meta, indent=1))
            # No barrier here: the checkpointer agrees across ranks after every part has been written
            # (a rank whose write failed must not leave the others waiting in a barrier).

        return write

    def load(self, directory: Path) -> None:
        """Collective. Weights into the model and this rank's fp32 master partitions, then the
        optimizer state (moments, momentum, calibration constants) rebuilt for this world size."""
        meta = checkpoint_layout(directory)
        if meta["kind"] == "dcp":  # written by one process, DDP or FSDP2
            self._load_logical(directory)
        else:
            if meta["optim"] != self.optim_name:
                raise ConfigError(
                    f"{directory} was saved with optim.name={meta['optim']}; this run has {self.optim_name}"
                )
            self._load_weights(directory / "model.safetensors")
            self.optimizer.copy_from_model(self.model)  # DeepSpeed's fp32 master partitions
            load_zero_state(self.optimizer, directory / TAG)
        self._micro = 0

    @torch.no_grad()
    def _load_logical(self, directory: Path) -> None:
        """Another backend's checkpoint (DCP): whole weights and optimizer state by parameter name,
        read on rank 0 alone and handed out one tensor at a time (launch.checkpoint.portable.FromRank0):
        the weights go into the model, and each rank keeps the state its master partitions and owned
        matrices are cut from (orscale.distributed.zero_checkpoint.names_read_whole). Collective."""
        entries = FromRank0(lambda: dcp_entries(directory), self.env.device)
        own = self.model.state_dict()
        names = {canonical_name(k): k for k in own}
        _check_names(directory, {k[len(MODEL) :] for k in entries.names if k.startswith(MODEL)}, set(names))
        kept = {canonical_name(n) for n in names_read_whole(self.optimizer)}
        state: dict[str, dict[str, Any]] = {}
        for key, value in entries:
            if key.startswith(MODEL):
                own[names[key[len(MODEL) :]]].copy_(value)
                continue
            name, leaf = key[len(STATE) :].rsplit(".", 1)
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or name in kept:
                state.setdefault(name, {})[leaf] = value.cpu() if isinstance(value, torch.Tensor) else value
        self.optimizer.copy_from_model(self.model)
        params = dict(self.model.named_parameters())
        mine = {n: state[canonical_name(n)] for n in params if canonical_name(n) in state}
        load_zero_state(self.optimizer, source=LogicalState(mine))
