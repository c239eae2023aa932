"""Process groups from torchrun's environment (NCCL on GPU, gloo on CPU) and small collectives. `torchrun`, `srun`
+ torchrun rendezvous, `accelerate launch` and the DeepSpeed launcher all set RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT; nothing here depends on which one ran.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist

from launch.environment import EnvFacts
from launch.errors import ConfigError
from launch.runtime.hangs import elastic_store, nccl_ends_on_timeout, nccl_flight_recorder, set_default_timeout

if TYPE_CHECKING:
    from launch.backends.base import Backend


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str  # parallel.backend
    local_world_size: int | None = None  # ranks on this node (torchrun's LOCAL_WORLD_SIZE); None: the world

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()


def init_distributed(
    backend: Backend, device_setting: str = "auto", timeout_s: float = 1800.0, run_dir: str | Path | None = None
) -> DistEnv:
    """Create the default process group when `backend` asks for one (every backend but `none`), even on
    one process. `device_setting`: train.device (auto | cpu | cuda). `timeout_s`: every collective's
    (parallel.init_timeout_s; the loop sets parallel.comm_timeout_s once start-up is over). `run_dir`:
    where NCCL's flight recorder writes its dumps at a timeout (launch/runtime/hangs.py)."""
    facts = EnvFacts.from_env()
    world_size, rank, local_rank = facts.world_size, facts.rank, facts.local_rank
    use_cuda = device_setting == "cuda" or (device_setting == "auto" and torch.cuda.is_available())
    if use_cuda:
        if not torch.cuda.is_available():
            raise ConfigError("train.device=cuda but no CUDA device is visible; use train.device=cpu")
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs are visible; "
                "launch at most one process per GPU"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if backend.process_group and not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:  # a plain `python train.py` run: a group of one
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
            os.environ.setdefault("LOCAL_RANK", "0")  # DeepSpeed asserts it is set
        timeout = datetime.timedelta(seconds=timeout_s)
        set_default_timeout(timeout)  # for the groups made later (preemption's, FSDP2's mesh, DeepSpeed's)
        if use_cuda:
            if (warning := nccl_ends_on_timeout()) is not None:
                logging.getLogger("orscale").warning(warning)
            nccl_flight_recorder(run_dir)
        dist.init_process_group(
            "nccl" if use_cuda else "gloo",
            timeout=timeout,
            device_id=device if use_cuda else None,
            store=elastic_store(timeout),  # None: env:// as usual
            rank=rank,
            world_size=world_size,
        )
    return DistEnv(rank, world_size, local_rank, device, backend.name, facts.local_world_size)


def compute_dtype(setting: str, device: torch.device) -> torch.dtype:
    """The one bf16 decision of a run (`train.dtype`): autocast, FSDP2's param dtype and DeepSpeed's
    bf16 mode all follow it. `auto` is bf16 on a CUDA device that supports it, fp32 otherwise;
    explicit `bf16` is honoured (on CPU too: autocast runs there, slowly)."""
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if setting == "bf16" else torch.float32


def set_tf32(enabled: bool, device: torch.device) -> str | None:
    """`train.tf32`: CUDA's fp32 matmuls on TF32 tensor cores (`tf32`) or in full fp32 (`ieee`).
    Returns the setting now in force, for the run's record; None off CUDA, where nothing changes."""
    if device.type != "cuda":
        return None
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9 (mixing it with allow_tf32 raises)
        matmul.fp32_precision = "tf32" if enabled else "ieee"
        return str(matmul.fp32_precision)
    matmul.allow_tf32 = enabled
    return "tf32" if matmul.allow_tf32 else "ieee"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def shutdown(clean: bool = True) -> None:
    """Destroy the process group. `clean`: first wait for every rank, so no rank tears down gloo
    while a peer is still inside its last collective (that aborts the peer). Skip the barrier on
    error paths, where a peer may be gone."""
    if dist.is_available() and dist.is_initialized():
        if clean:
            dist.barrier()
        dist.destroy_process_group()


def barrier(group: Any = None) -> None:
    """`group`: a process group (None: the default one)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=group)


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's `obj` (small Python objects only: loader states, flags); `group`: a process
    group of every rank (None: the default one)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


T = TypeVar("T")


def rank0_decides(fn: Callable[[], T]) -> T:
    """`fn()` evaluated on rank 0 only and its result handed to every rank, so that all ranks act on
    one decision about shared files (lock, resume point) and none waits on a peer that failed: an
    exception on rank 0 is re-raised there and raised on the others as the same message."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return fn()
    outcome: list[Any] = [None]
    error: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            outcome[0] = ("ok", fn())
        except Exception as err:  # every rank must leave the broadcast below
            error, outcome[0] = err, ("user" if isinstance(err, ValueError) else "fail", str(err))
    dist.broadcast_object_list(outcome, src=0)
    if error is not None:
        raise error
    kind, value = outcome[0]
    if kind == "user":
        raise ConfigError(value)
    if kind == "fail":
        raise RuntimeError(f"rank 0 failed: {value}")
    return value
