"""DeepSpeed ZeRO-1/2 for the trainer (``parallel.backend`` = ``zero1`` | ``zero2``).

    zero = ZeroEngine(model, cfg, env, accum_steps)       # after build_model, instead of wrap + optimizers
    for micro in range(accum_steps):                        # no no_sync(): DeepSpeed handles accumulation
        loss = zero.module(x, y) / accum_steps
        zero.backward(loss)
    grad_norm = zero.step(lr)                               # raw global norm; clip; lr; update
    zero.diagnostics()                                      # collective, on logging steps
    zero.save(dir, client_state) / zero.load(dir)           # collective; same data-parallel size only

The optimizer is ``orscale.zero.ZeroShardedOptimizer`` (AdamW on flat partitions, the Muon family
on whole matrices at an owner rank): it matches a single-process run of ``build_optimizers``.
DeepSpeed's own ``gradient_clipping`` stays 0; the optimizer clips the raw gradients with the
global norm DeepSpeed computes, exactly like ``clip_grad_norm_`` in the other backends.

Checkpoints are DeepSpeed's own (per-rank optimizer files): they load only at the data-parallel
size, stage and optimizer they were saved with (checked first, from zero_meta.json), and DeepSpeed
reads them with ``torch.load(weights_only=False)``: load only checkpoints you wrote.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist

from launch.config import Config, ConfigError, UserError
from launch.distributed import DistEnv
from orscale.zero import ZeroShardedOptimizer, check_zero_optimizer

TAG = "zero"  # DeepSpeed's checkpoint tag: files go to <ckpt_dir>/zero/
META = "zero_meta.json"  # world size, stage, optimizer: checked before DeepSpeed reads anything


def zero_stage(cfg: Config) -> int:
    return {"zero1": 1, "zero2": 2}[cfg.parallel.backend]


def check_zero_config(cfg: Config) -> None:
    """Cheap checks, before any work: one-line ConfigError for what ZeRO cannot run."""
    backend = cfg.parallel.backend
    if backend not in ("zero1", "zero2"):
        raise ConfigError(f"ZeroEngine needs parallel.backend zero1 or zero2, got {backend!r}")
    check_zero_optimizer(cfg.optim, backend)


def use_bf16(cfg: Config, env: DistEnv) -> bool:
    """bf16 params + fp32 master partitions on CUDA with bf16 compute; fp32 everywhere else."""
    if env.device.type != "cuda":
        return False
    if cfg.train.dtype == "auto":
        return torch.cuda.is_bf16_supported()
    return cfg.train.dtype == "bf16"


def ds_config(cfg: Config, world_size: int, accum_steps: int, bf16: bool) -> dict[str, Any]:
    """The DeepSpeed config dict for this run (nothing is read from a JSON file)."""
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
        "bf16": {"enabled": bf16},
        "fp16": {"enabled": False},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }
    if bf16 and zero_stage(cfg) == 1:
        # ZeRO-1 then keeps fp32 gradients (DeepSpeed's BF16 optimizer); ZeRO-2 reduces in bf16.
        config["data_types"] = {"grad_accum_dtype": "fp32"}
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


class ZeroEngine:
    """A DeepSpeed ZeRO-1/2 engine around `model` with the project's optimizers."""

    def __init__(self, model: torch.nn.Module, cfg: Config, env: DistEnv, accum_steps: int,
                 ds_overrides: Optional[dict[str, Any]] = None) -> None:
        check_zero_config(cfg)
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        accel = get_accelerator().device_name()
        if accel != env.device.type:
            raise ConfigError(f"DeepSpeed's accelerator is {accel!r} but train.device resolved to "
                              f"{env.device.type!r}; set DS_ACCELERATOR={env.device.type}")
        if not dist.is_initialized():
            raise RuntimeError("ZeroEngine needs the process group (launch.distributed.init_distributed)")
        self.cfg, self.env, self.accum_steps = cfg, env, accum_steps
        self.world_size = dist.get_world_size()
        self.bf16 = use_bf16(cfg, env)
        self.config = _merge(ds_config(cfg, self.world_size, accum_steps, self.bf16), ds_overrides or {})
        self.optimizer = ZeroShardedOptimizer(model, cfg.optim)
        self.module, _, _, _ = deepspeed.initialize(model=model, optimizer=self.optimizer, config=self.config,
                                                    dist_init_required=False)
        self.optimizer.bind(self.module.optimizer, cfg.optim.grad_clip)
        self._micro = 0

    @property
    def model(self) -> torch.nn.Module:
        return self.module.module

    def backward(self, loss: torch.Tensor) -> None:
        """`loss` is already divided by accum_steps (as the trainer computes it): DeepSpeed must not
        divide again. Off the accumulation boundary DeepSpeed's step only counts the micro-batch."""
        self._micro += 1
        if self._micro > self.accum_steps:
            raise RuntimeError(f"ZeroEngine.backward called {self._micro} times before step(); "
                               f"accum_steps is {self.accum_steps}")
        self.module.backward(loss, scale_wrt_gas=False)
        if self._micro < self.accum_steps:
            self.module.step()

    def step(self, lr: float) -> Any:
        """Set lr on every group, then reduce, clip (raw global norm) and update. Returns the global
        norm of the raw gradients (a device tensor where DeepSpeed keeps one: no host sync)."""
        if self._micro != self.accum_steps:
            raise RuntimeError(f"ZeroEngine.step after {self._micro} backward calls; expected {self.accum_steps}")
        for group in self.optimizer.param_groups:
            group["lr"] = float(lr)
        self.module.step()
        self._micro = 0
        return self.module.get_global_grad_norm()

    def diagnostics(self) -> dict[str, float]:
        """Same ``diag/...`` keys as ``orscale.collect_diagnostics``. Collective (every rank)."""
        return self.optimizer.diagnostics()

    def calibration_constants(self) -> dict[str, float]:
        """{matrix name: c} (collective); {} for variants without lazy calibration."""
        return self.optimizer.calibration_constants()

    def save(self, ckpt_dir: str, client_state: dict) -> None:
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

    def load(self, ckpt_dir: str) -> dict:
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
