"""Checkpoints written while training goes on (`run.async_save`): what the checkpointer needs for the two halves
(staging at the step, then a thread per rank that writes and publishes), as docs/running.md, "Checkpoints written in
the background" describes. The thread's collectives run on a process group of their own (`writer_group`), so they
never interleave with the training step's collectives on the default one.

Test-only: `ORSCALE_TEST_ASYNC_WRITE_DELAY=STEP:SECONDS` holds the write of step STEP that long after its files are
written and before it is published (the worst moment for a kill -9); unset, it costs one environment lookup.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.checkpoint.staging import AsyncStager

log = logging.getLogger("orscale")

TEST_DELAY_ENV = "ORSCALE_TEST_ASYNC_WRITE_DELAY"


def writer_group(world_size: int) -> Any | None:
    """A gloo group of every rank for the background write's collectives, or None without a process
    group (one process, `parallel.backend=none`: nothing to agree with). Collective: every rank
    calls it once, in the same order as its other `new_group` calls. gloo also on GPUs: DCP's async
    save needs a CPU backend, and the write must not queue behind the step's NCCL kernels."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.new_group(ranks=list(range(world_size)), backend="gloo")


def host_copy(t: Tensor) -> Tensor:
    """A host copy of `t` that the training step cannot change under the writer; in pinned memory
    when `t` is on a GPU (the copy that blocks training is then a fast DMA). Contiguous."""
    out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.is_cuda)
    out.copy_(t.detach())
    return out


class HostStager(AsyncStager):
    """DCP's stager for a background save (`dcp.async_save(..., async_stager=)`): a host copy of every
    tensor of the state dict, into buffers kept from one save to the next (pinned when the tensor is
    on a GPU: pinning gigabytes again at every save would cost more than the copy), so the first
    save allocates and later ones only copy. A DTensor (FSDP2's shards) is copied through the tensor
    subclass protocol (`__tensor_flatten__`): its local shard to the host, its mesh and placements
    kept, as DCP plans the write from them. Other values are deep-copied.

    torch's DefaultStager does the same, but its deep copy of the non-tensor values fails on torch 2.11
    (the GPU image's: `KeyError: <class 'type'>`, found by bench/gpu_check_diagnostics.py)."""

    _synchronize_after_execute = False  # stage() returns only once every copy has landed

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], Tensor] = {}
        self._from_gpu = False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:  # never a Future: staged when it returns
        self._from_gpu = False
        staged = self._copy(state_dict, ())
        if self._from_gpu:
            torch.cuda.synchronize()  # the device-to-host copies were issued non-blocking
        return staged

    def synchronize_staging(self) -> None:
        return  # nothing in flight once stage() returned

    def close(self) -> None:
        self._buffers.clear()

    def _copy(self, value: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(value, Tensor):
            if type(value) is not Tensor and hasattr(value, "__tensor_flatten__"):  # DTensor: its shard
                names, context = value.__tensor_flatten__()
                inner = {n: self._copy(getattr(value, n), (*path, n)) for n in names}
                unflatten = type(value).__tensor_unflatten__  # type: ignore[attr-defined]  # a subclass's, not Tensor's
                return unflatten(inner, context, value.size(), value.stride())
            return self._host(value, path)
        if isinstance(value, dict):
            return {k: self._copy(v, (*path, k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            items = [self._copy(v, (*path, i)) for i, v in enumerate(value)]
            return items if isinstance(value, list) else tuple(items)
        return copy.deepcopy(value)  # Python's own: immutable values come back as they are

    def _host(self, t: Tensor, path: tuple[Any, ...]) -> Tensor:
        buf = self._buffers.get(path)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = self._buffers[path] = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.is_cuda)
        buf.copy_(t.detach(), non_blocking=t.is_cuda)
        self._from_gpu |= t.is_cuda
        return buf


def pause_for_tests(step: int) -> None:
    """The test-only pause (`ORSCALE_TEST_ASYNC_WRITE_DELAY=STEP:SECONDS`, module docstring)."""
    spec = os.environ.get(TEST_DELAY_ENV)
    if not spec:
        return
    at, seconds = spec.split(":")
    if int(at) == step:
        time.sleep(float(seconds))


class BackgroundWrite:
    """One checkpoint write in flight: `work()` on a thread of its own, its outcome (the published
    directory, or the error every rank agreed on) read by `wait()`.

    A daemon thread: a process that exits without waiting (a second Ctrl-C) ends the write halfway,
    which leaves an unpublished `.tmp_step_N/`, never a checkpoint that looks complete."""

    def __init__(self, step: int, work: Callable[[], Path]) -> None:
        self.step = step
        self._result: Path | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), name=f"checkpoint-write-{step}", daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], Path]) -> None:
        try:
            self._result = work()
        except BaseException as err:  # handed to the training thread by wait(); DCP's is a BaseException
            self._error = err

    def wait(self) -> Path:
        """Block until the write is published (or failed: its error is raised here)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result
