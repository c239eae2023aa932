"""SIGTERM/SIGINT (preemption, Ctrl-C) set a flag; the loop saves a checkpoint and exits 0.

Ranks must stop at the same step, so the flag is agreed on with an all-reduce, but without a host
sync on the training device each step: every step posts an asynchronous all-reduce of this rank's
flag on a CPU (gloo) group and reads the result posted one step earlier, long complete by then.
All ranks see the same sequence of results, so they stop together, one step after the signal.
A failed data read is agreed on at once instead (`agree_on_read`, on the same group), before the
step's collectives.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from launch.runtime.process_group import DistEnv


@dataclass(frozen=True)
class Stop:
    """Why every rank stops at a step: a stop signal came, or a rank's data reader failed on a step
    it read ahead (the lowest such rank), or both."""

    signal: bool
    failed_reader: int | None


class StopFlag:
    def __init__(self, env: DistEnv) -> None:
        self.raised = False  # a stop signal came to this rank
        self.reader_failed = False  # this rank's reader failed on a later step (launch.features.reader_failure)
        self._previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}
        self._group: Any | None = None
        self._work: Any | None = None
        self._posted: torch.Tensor | None = None
        self._rank, self._world = env.rank, env.world_size
        if env.world_size > 1 and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")  # collective: every rank builds it, in order

    def _handle(self, signum, frame) -> None:
        self.raised = True

    def agreed(self) -> Stop | None:
        """The same Stop on every rank at the same step once any rank was signalled or its reader
        failed (None until then). Call once per step on every rank."""
        if self._group is None:
            return self._decided(self._flags())
        decided = None
        if self._work is not None and self._posted is not None:
            self._work.wait()  # posted a step ago: already done
            decided = self._decided(self._posted)  # a CPU tensor: no device sync
        self._posted = self._flags()
        self._work = dist.all_reduce(self._posted, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        return decided

    def _flags(self) -> torch.Tensor:
        """[signalled, world - rank where the reader failed] on this rank: the maximum over ranks names
        the lowest rank whose reader failed."""
        return torch.tensor([float(self.raised), float(self._world - self._rank if self.reader_failed else 0)])

    def _decided(self, flags: torch.Tensor) -> Stop | None:
        signalled, reader = (int(v) for v in flags.tolist())
        if not signalled and not reader:
            return None
        return Stop(signal=bool(signalled), failed_reader=self._world - reader if reader else None)

    def agree_on_read(self, failure: BaseException | None) -> tuple[int, str] | None:
        """(rank, its one line) of the lowest rank whose read of this step failed (`failure`: this
        rank's), the same on every rank, or None when every rank has its windows. Call once per step
        on every rank, after the read and before the step's collectives: a rank whose reader failed
        would otherwise leave its peers waiting in those collectives until the comm timeout. A
        blocking all-reduce of one flag on this gloo group (no device sync); the lines are gathered
        only when some rank failed."""
        if self._group is None:
            return None if failure is None else (0, str(failure))
        failed = torch.tensor([float(failure is not None)], device="cpu")
        dist.all_reduce(failed, group=self._group)
        if failed.item() == 0:
            return None
        lines: list[str | None] = [None] * dist.get_world_size(self._group)
        dist.all_gather_object(lines, None if failure is None else str(failure).splitlines()[0], group=self._group)
        rank = next(r for r, line in enumerate(lines) if line is not None)
        return rank, str(lines[rank])

    def restore(self) -> None:
        """Finish the pending all-reduce and give the signals back to whoever had them (matters
        when train() is called as a library)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
