"""The DeepSpeed ZeRO-1/2 engine (``parallel.backend`` = ``zero1`` | ``zero2``): `launch.engine.Engine`
over DeepSpeed's engine. No ``no_sync``: DeepSpeed handles accumulation itself.

The optimizer is ``orscale.distributed.zero.ZeroShardedOptimizer`` (AdamW on flat partitions, the Muon family
on whole matrices at an owner rank): it matches a single-process run of ``build_optimizers``.
DeepSpeed's own ``gradient_clipping`` stays 0; the optimizer clips the raw gradients with the
global norm DeepSpeed computes, exactly like ``clip_grad_norm_`` in the other backends.

One arithmetic across backends: DeepSpeed keeps fp32 parameters, so gradients are accumulated and
reduced in fp32 (its bf16 mode would accumulate ZeRO-2 gradients and reduce them in bf16, while
FSDP2 reduces in fp32 and SPEC §1 takes G in fp32); a bf16 run computes in bf16 through the same
`torch.autocast` as the other engines. The cost is fp32 weights on every rank (ZeRO-1/2 do not
shard parameters): 4 bytes per parameter instead of 2.

Checkpoints are DeepSpeed's own (per-rank optimizer files): they load only at the data-parallel
size, stage and optimizer they were saved with (checked first, from zero_meta.json), and DeepSpeed
reads them with ``torch.load(weights_only=False)``: load only checkpoints you wrote.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from launch.config import Config, ConfigError, UserError
from launch.distributed import DistEnv
from launch.engine import Engine
from launch.parallelize import build_model
from models import GPTConfig
from orscale.distributed.zero import ZERO_OPTIMIZERS, ZeroShardedOptimizer

TAG = "zero"  # DeepSpeed's checkpoint tag: files go to <ckpt_dir>/zero/
META = "zero_meta.json"  # world size, stage, optimizer: checked before DeepSpeed reads anything


def zero_stage(cfg: Config) -> int:
    return {"zero1": 1, "zero2": 2}[cfg.parallel.backend]


def check_zero_config(cfg: Config) -> None:
    """Cheap checks, before any work: one-line ConfigError for what ZeRO cannot run."""
    backend = cfg.parallel.backend
    if backend not in ("zero1", "zero2"):
        raise ConfigError(f"DeepSpeedEngine needs parallel.backend zero1 or zero2, got {backend!r}")
    if cfg.model.resolve().center_mlp:
        raise ConfigError(f"model.center_mlp is not supported with parallel.backend={backend} (the bias transport "
                          "would have to reach DeepSpeed's fp32 partitions); use parallel.backend=fsdp or ddp")
    if cfg.train.skip_spikes:
        raise ConfigError(f"train.skip_spikes is not supported with parallel.backend={backend} (DeepSpeed owns the "
                          "step); use parallel.backend=fsdp or ddp, or leave it off")
    if cfg.optim.name not in ZERO_OPTIMIZERS:
        raise ConfigError(f"parallel.backend={backend} cannot run optim.name={cfg.optim.name!r}: ZeRO-1/2 supports "
                          f"{', '.join(ZERO_OPTIMIZERS)}; use parallel.backend=ddp or fsdp for it")


def ds_config(cfg: Config, world_size: int, accum_steps: int) -> dict[str, Any]:
    """The DeepSpeed config dict for this run (nothing is read from a JSON file). fp32 parameters,
    gradients and reductions; compute precision is the engine's autocast."""
    micro = cfg.train.micro_batch_size
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum_steps,
        "train_batch_size": micro * accum_steps * world_size,
        "gradient_clipping": 0.0,  # the client optimizer clips the raw gradients itself
        "zero_optimization": {
            "stage": zero_stage(cfg),
            "elastic_checkpoint": False,  # the client optimizer's state_dict is saved as is, per rank
            "round_robin_gradients": False,
            "compute_grad_norm": True,  # the clip uses DeepSpeed's global norm of the raw gradients
            "load_from_fp32_weights": True,
        },
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
        "communication_data_type": "fp32",
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }
    return config


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def check_checkpoint_world_size(ckpt_dir: str | Path, world_size: int) -> dict[str, Any]:
    """The checkpoint's meta; ConfigError unless it was saved at `world_size` ranks."""
    path = Path(ckpt_dir) / META
    if not path.is_file():
        raise UserError(f"{ckpt_dir} is not a DeepSpeed ZeRO checkpoint of this trainer (no {META})")
    meta = json.loads(path.read_text())
    if meta["world_size"] != world_size:
        raise ConfigError(f"DeepSpeed ZeRO checkpoints only load at the data-parallel size they were saved with: "
                          f"{ckpt_dir} was saved by {meta['world_size']} ranks, this run has {world_size}; "
                          f"resume with {meta['world_size']} processes (FSDP/DDP checkpoints reshard, ZeRO's do not)")
    return meta


class DeepSpeedEngine(Engine):
    """A DeepSpeed ZeRO-1/2 engine around the GPT with the project's optimizers."""

    check_config = staticmethod(check_zero_config)

    @staticmethod
    def check_checkpoint(path: Path, world_size: int) -> None:
        check_checkpoint_world_size(path / TAG, world_size)

    def __init__(self, model_cfg: GPTConfig, cfg: Config, env: DistEnv, dtype: torch.dtype, accum_steps: int,
                 ds_overrides: Optional[dict[str, Any]] = None) -> None:
        super().__init__(env, dtype, accum_steps)
        check_zero_config(cfg)
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        accel = get_accelerator().device_name()
        if accel != env.device.type:
            raise ConfigError(f"DeepSpeed's accelerator is {accel!r} but train.device resolved to "
                              f"{env.device.type!r}; set DS_ACCELERATOR={env.device.type}")
        if not dist.is_initialized():
            raise RuntimeError("DeepSpeedEngine needs the process group (launch.distributed.init_distributed)")
        self.cfg = cfg
        self.world_size = dist.get_world_size()
        self.config = _merge(ds_config(cfg, self.world_size, accum_steps), ds_overrides or {})
        model = build_model(model_cfg, cfg.parallel, cfg.train.seed, env, dtype)
        self.optimizer = ZeroShardedOptimizer(model, cfg.optim)
        self.module, _, _, _ = deepspeed.initialize(model=model, optimizer=self.optimizer, config=self.config,
                                                    dist_init_required=False)
        self.optimizer.bind(self.module.optimizer, cfg.optim.grad_clip)
        self._micro = 0

    @property
    def model(self) -> torch.nn.Module:
        return self.module.module

    def _accumulating(self, last_micro_batch: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # DeepSpeed reduces at its own accumulation boundary

    def _backward(self, loss: torch.Tensor) -> None:
        self.backward(loss)

    def backward(self, loss: torch.Tensor) -> None:
        """`loss` is already divided by accum_steps (as the trainer computes it): DeepSpeed must not
        divide again. Off the accumulation boundary DeepSpeed's step only counts the micro-batch."""
        self._micro += 1
        if self._micro > self.accum_steps:
            raise RuntimeError(f"DeepSpeedEngine.backward called {self._micro} times before step(); "
                               f"accum_steps is {self.accum_steps}")
        self.module.backward(loss, scale_wrt_gas=False)
        if self._micro < self.accum_steps:
            self.module.step()

    def step(self, lr: float) -> Any:
        """Set lr on every group, then reduce, clip (raw global norm) and update. Returns the global
        norm of the raw gradients (a device tensor where DeepSpeed keeps one: no host sync)."""
        if self._micro != self.accum_steps:
            raise RuntimeError(f"DeepSpeedEngine.step after {self._micro} backward calls; expected {self.accum_steps}")
        for group in self.optimizer.param_groups:
            group["lr"] = float(lr)
        self.module.step()
        self._micro = 0
        self._step_loss = torch.zeros_like(self._step_loss)
        return self.module.get_global_grad_norm()

    def diagnostics(self) -> dict[str, float]:
        """Same ``diag/...`` keys as ``orscale.collect_diagnostics``. Collective (every rank)."""
        return self.optimizer.diagnostics()

    def calibration_constants(self) -> dict[str, float]:
        """{matrix name: c} (collective); {} for variants without lazy calibration."""
        return self.optimizer.calibration_constants()

    def save(self, directory: Path) -> None:
        """Collective. DeepSpeed's files under zero/, and (rank 0) model.safetensors: ZeRO-1/2 keep
        whole weights on every rank, so a safe, world-size-free copy serves export and evaluation."""
        self.save_native(str(directory / TAG), {})
        if self.env.is_main:
            # Clones: ZeRO's params are views into its flat buffers, which safetensors refuses.
            weights = {k: v.detach().clone().contiguous() for k, v in self.model.state_dict().items()}
            save_file(weights, str(directory / "model.safetensors"))

    def load(self, directory: Path) -> None:
        self.load_native(str(directory / TAG))

    def save_native(self, ckpt_dir: str, client_state: dict) -> None:
        """Collective. DeepSpeed's files under <ckpt_dir>/zero/, plus zero_meta.json. The calibration
        constants travel in the client state (and in the optimizer state of their owner rank)."""
        calibration = self.optimizer.calibration_constants()
        meta = {"world_size": self.world_size, "stage": zero_stage(self.cfg), "optim": self.cfg.optim.name}
        state = {"orscale_client": client_state, "orscale_zero": {**meta, "calibration": calibration}}
        self.module.save_checkpoint(ckpt_dir, tag=TAG, client_state=state, save_latest=False)
        if self.env.is_main:
            tmp = Path(ckpt_dir) / (META + ".tmp")
            tmp.write_text(json.dumps(meta, indent=1))
            os.replace(tmp, Path(ckpt_dir) / META)
        dist.barrier()

    def load_native(self, ckpt_dir: str) -> dict:
        """Collective. Restores model, fp32 master weights and optimizer state (momentum, moments,
        calibration constants); returns the client state given to `save`."""
        meta = check_checkpoint_world_size(ckpt_dir, self.world_size)
        if meta["optim"] != self.cfg.optim.name or meta["stage"] != zero_stage(self.cfg):
            raise ConfigError(f"{ckpt_dir} was saved with parallel.backend=zero{meta['stage']} and optim.name="
                              f"{meta['optim']}; this run has {self.cfg.parallel.backend} and {self.cfg.optim.name}")
        path, client_state = self.module.load_checkpoint(ckpt_dir, tag=TAG, load_optimizer_states=True,
                                                         load_lr_scheduler_states=False)
        if path is None:
            raise UserError(f"DeepSpeed found no checkpoint under {ckpt_dir}/{TAG}")
        self.optimizer.set_calibration_constants(client_state["orscale_zero"]["calibration"])
        self._micro = 0
        return client_state["orscale_client"]
