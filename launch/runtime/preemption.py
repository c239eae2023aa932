"""SIGTERM/SIGINT (preemption, Ctrl-C) set a flag; the loop saves a checkpoint and exits 0.

Ranks must stop at the same step, so the flag is agreed on with an all-reduce, but without a host
sync on the training device each step: every step posts an asynchronous all-reduce of this rank's
flag on a CPU (gloo) group and reads the result posted one step earlier, long complete by then.
All ranks see the same sequence of results, so they stop together, one step after the signal.
"""

from __future__ import annotations

import signal
from typing import Any

import torch
import torch.distributed as dist

from launch.runtime.process_group import DistEnv


class StopFlag:
    def __init__(self, env: DistEnv) -> None:
        self.raised = False
        self._previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}
        self._group: Any | None = None
        self._work: Any | None = None
        self._posted: torch.Tensor | None = None
        if env.world_size > 1 and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")  # collective: every rank builds it, in order

    def _handle(self, signum, frame) -> None:
        self.raised = True

    def agreed(self) -> bool:
        """True on every rank at the same step once any rank was signalled. Call once per step on
        every rank."""
        if self._group is None:
            return self.raised
        decided = False
        if self._work is not None and self._posted is not None:
            self._work.wait()  # posted a step ago: already done
            decided = bool(self._posted.item() > 0)  # a CPU tensor: no device sync
        self._posted = torch.tensor([float(self.raised)], device="cpu")
        self._work = dist.all_reduce(self._posted, group=self._group, async_op=True)
        return decided

    def restore(self) -> None:
        """Finish the pending all-reduce and give the signals back to whoever had them (matters
        when train() is called as a library)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
