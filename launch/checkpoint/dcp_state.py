"""The engine's sharded checkpoint part for PyTorch-native backends (one process, DDP, FSDP2): a
model and its optimizers through `torch.distributed.checkpoint`, read back without unpickling code."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

from launch.checkpoint.async_writer import HostStager
from launch.checkpoint.dcp_safe import dcp_load
from orscale.diagnostics import CLIP_COUNTS

# DCP warns on every single-process save/load that it assumes no process group: that is intended.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


class ModelAndOptimizers:
    """A sharded part: a model and its optimizers (momentum, AdamW moments, fp32 calibration
    constants) through `torch.distributed.checkpoint` in `dcp/`. Every rank writes its own shards
    (DTensor-aware under FSDP2), so the checkpoint loads at any world size."""

    def __init__(self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        self.module, self.optimizers = module, list(optimizers)
        self._stager = HostStager()  # its host buffers, made at the first background save, are reused

    def save(self, directory: Path) -> None:
        model_sd, optim_sd = get_state_dict(self.module, self.optimizers)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(Path(directory) / "dcp"))

    def stage(self, directory: Path, group: Any) -> Callable[[], None]:
        """Copy the state to host memory now (launch.checkpoint.async_writer.HostStager) and start
        DCP's asynchronous write of that copy into `directory` (its planning collectives on
        `group`); the returned function waits for the write. Collective."""
        model_sd, optim_sd = get_state_dict(self.module, self.optimizers)
        path = str(Path(directory) / "dcp")
        written = dcp.async_save(
            {"model": model_sd, "optim": optim_sd},
            checkpoint_id=path,
            # No copy-ahead: the state is on the host already, and DCP's default (10 MB) builds a
            # loader that asks CUDA for the current stream and synchronizes it from the writer
            # thread, whose current device is GPU 0 on every rank (a context there per rank).
            storage_writer=FileSystemWriter(path, per_thread_copy_ahead=0),
            process_group=group,
            async_stager=self._stager,
        )
        assert isinstance(written, Future)  # an AsyncSaveResponse only for a stager that returns a Future
        return written.result  # waits; DCP's exception (CheckpointException), if any, raised on the writer thread

    def load(self, directory: Path) -> None:
        model_sd, optim_sd = get_state_dict(self.module, self.optimizers)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        dcp_load(state, str(Path(directory) / "dcp"), optional_state=(CLIP_COUNTS,))  # older checkpoints: from 0
        set_state_dict(self.module, self.optimizers, model_state_dict=state["model"], optim_state_dict=state["optim"])

    def load_logical(self, weights: dict[str, Any], state: dict[str, Any]) -> None:
        """Whole weights and optimizer state by parameter name (another backend's checkpoint, read
        by launch.checkpoint.portable), sharded as this module's parameters are. Collective. Under a
        process group only rank 0 passes them (read there alone); the other ranks pass empty dicts
        and receive each tensor from rank 0 as it is placed (torch's `broadcast_from_rank0`)."""
        grouped = dist.is_available() and dist.is_initialized()
        _, current = get_state_dict(self.module, self.optimizers)  # the param groups, by name
        optim: dict[str, Any] = {"state": state, "param_groups": current["param_groups"]} if state else {}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=grouped)
        # The two halves as set_state_dict orders them, called apart: it would take a rank's empty
        # weights for "optimizer only" and skip the model's broadcast that rank 0 joins.
        set_optimizer_state_dict(self.module, self.optimizers, optim, options=options)
        set_model_state_dict(self.module, weights, options=options)
