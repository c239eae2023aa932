"""What a user reaches for when a run is slow or runs out of memory: profiler traces of a window of steps
(`train.profile`), CUDA memory snapshots of a window of steps (`train.memory_snapshot`), and one line, after a
snapshot, when a step runs out of GPU memory. Where the files land and how windows count: docs/running.md,
"Profiles, memory snapshots, checkpoints written in the background". Off (the default), the loop's one call per
step returns at once: no profiler object exists and nothing is recorded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerAction, ProfilerActivity

from launch.errors import ConfigError, UserError
from launch.run import cuda_memory
from launch.train_config import TrainConfig

log = logging.getLogger("orscale")

_RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
# What torch prints around every window, saying nothing a user can act on: Kineto's (C++, straight to
# file descriptor 2) "USDT:<time> ... profiler_start" / "profiler_stop" lines, and the Python warning
# that each window starts with an empty event list (what the trace per window wants).
_KINETO_LINES = (b"USDT:", (b"] profiler_start", b"] profiler_stop"))
_EVENTS_CLEARED = "Warning: Profiler clears events at the end of each cycle"


class OutOfMemory(UserError):
    """A step ran out of GPU memory: one line (step, rank, torch's figures, what to change)."""


def check_memory_snapshot(train: TrainConfig, device: torch.device) -> None:
    """ConfigError (one line) for a memory snapshot asked of a device without CUDA's allocator."""
    if train.memory_snapshot.enabled and not cuda_memory.available(device):
        raise ConfigError(
            f"train.memory_snapshot.enabled=true records CUDA allocations, but this run's device is "
            f"{device.type}; set train.memory_snapshot.enabled=false, or run on a GPU (train.device=cuda)"
        )


class StepTracing:
    """The profiler and the memory recording of one launch: `step(n)` after every training step
    (every rank), `out_of_memory(err, n)` when step n ran out of memory, `close()` at the end."""

    def __init__(
        self, train: TrainConfig, run_dir: Path, rank: int, device: torch.device, steps_left: int, start_step: int = 0
    ) -> None:
        """`steps_left`: the steps this launch trains; `start_step`: the run's step it starts after (a
        resume's), so that the trace's `ProfilerStep#N` spans carry the run's step numbers."""
        check_memory_snapshot(train, device)
        self.run_dir, self.rank = Path(run_dir), rank
        self._step = 0  # the run's step that finished last
        self._done = 0  # steps this launch finished
        self._profiler: torch.profiler.profile | None = None
        self._memory = train.memory_snapshot if train.memory_snapshot.enabled else None  # None once dumped
        self._snapshot_on_oom = train.memory_snapshot.enabled
        self._recording = False
        p = train.profile
        if p.enabled:
            self._schedule = torch.profiler.schedule(
                skip_first=p.skip_first, wait=p.wait, warmup=p.warmup, active=p.active, repeat=p.repeat
            )
            first_end = p.skip_first + p.wait + p.warmup + p.active
            if first_end > steps_left and rank == 0:  # a config warning: said once
                log.warning(
                    "train.profile: the first trace ends after %d steps of this launch, which has %d: no trace "
                    "will be written (lower train.profile.skip_first/wait/warmup/active)",
                    first_end,
                    steps_left,
                )
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            # torch numbers its steps (the spans `ProfilerStep#N`) from 0 at the start; here from the
            # run's first step of this launch, the schedule still counting this launch's steps.
            first = start_step + 1
            self._profiler = torch.profiler.profile(
                activities=activities,
                schedule=lambda n: self._schedule(max(n - first, 0)),
                on_trace_ready=self._export_trace,
                record_shapes=p.record_shapes,
                profile_memory=p.profile_memory,
                with_stack=p.with_stack,
            )
            self._profiler.step_num = first
            with _quiet_profiler():
                self._profiler.start()
        if self._memory is not None and self._memory.skip_first == 0:
            self._start_recording()

    def step(self, step: int) -> None:
        """After the run's step `step` finished (every rank, every step)."""
        self._step, self._done = step, self._done + 1
        if self._profiler is not None:
            with _quiet_profiler():
                self._profiler.step()
        m = self._memory
        if m is None:
            return
        if not self._recording and self._done == m.skip_first:
            self._start_recording()
        elif self._recording and m.steps and self._done == m.skip_first + m.steps:
            self._say(self._dump("step", step))
            self._stop_recording()
            self._memory = None  # the window is over

    def out_of_memory(self, err: BaseException, step: int) -> OutOfMemory:
        """Dump a memory snapshot (with train.memory_snapshot.enabled: the history if the step was
        recorded, the allocator's state in any case), then the one line the run stops with."""
        torch_says = ". ".join(str(err).splitlines()[0].split(". ")[:3])  # what it tried, the total, what was free
        if self._snapshot_on_oom:
            path = self._dump("oom_step", step)
            self._stop_recording()
            self._memory, self._snapshot_on_oom = None, False
            then = f"memory snapshot: {path} (open it at https://pytorch.org/memory_viz)"
        else:
            then = "train.memory_snapshot.enabled=true records where the memory went"
        return OutOfMemory(
            f"rank {self.rank} ran out of GPU memory in step {step} ({torch_says}); lower train.micro_batch_size "
            f"(gradient accumulation keeps the step's tokens) or set parallel.activation_checkpointing=true; {then}"
        )

    def close(self) -> None:
        """Stop the profiler (a window cut short by the end of the launch is written as it is) and
        the recording (with train.memory_snapshot.steps=0: dumped now)."""
        if self._profiler is not None:
            profiler, self._profiler = self._profiler, None
            with _quiet_profiler():
                profiler.stop()
        if self._memory is not None and self._recording:
            self._say(self._dump("step", self._step))
            self._stop_recording()
        self._memory = None

    def _start_recording(self) -> None:
        assert self._memory is not None
        cuda_memory.start_recording(self._memory.max_entries)
        self._recording = True

    def _stop_recording(self) -> None:
        if self._recording:
            cuda_memory.stop_recording()
            self._recording = False

    def _dump(self, kind: str, step: int) -> Path:
        path = self.run_dir / "memory_snapshot" / f"{kind}_{step}" / f"rank{self.rank}.pickle"
        path.parent.mkdir(parents=True, exist_ok=True)
        cuda_memory.dump(path)
        return path

    def _say(self, path: Path) -> None:
        log.info("memory snapshot: %s (rank%d.pickle per rank; https://pytorch.org/memory_viz)", path.parent, self.rank)

    def _export_trace(self, profiler: Any) -> None:
        """torch.profiler's on_trace_ready: this window's chrome trace, named by the run's step."""
        traced, i = 0, self._done - 1  # count back over the window's recorded steps
        while i >= 0 and self._schedule(i) in _RECORDING and (traced == 0 or self._schedule(i) != _RECORDING[1]):
            traced, i = traced + 1, i - 1
        path = self.run_dir / "profile" / f"step_{self._step}" / f"rank{self.rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(path))
        first = self._step - max(traced, 1) + 1
        log.info(
            "profile: steps %d-%d traced to %s (rank%d.json per rank; open in https://ui.perfetto.dev)",
            first,
            self._step,
            path.parent,
            self.rank,
        )


@contextlib.contextmanager
def _quiet_profiler() -> Iterator[None]:
    """A call into torch.profiler without its two messages of every window (`_KINETO_LINES`,
    `_EVENTS_CLEARED`); whatever else is written meanwhile is passed on after the call. Kineto writes
    from C++ to file descriptor 2, so that descriptor is what is read here (into a file, not a pipe,
    that a long write cannot fill)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_EVENTS_CLEARED)
                yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            prefix, ends = _KINETO_LINES
            kept = [line for line in held if not (line.startswith(prefix) and line.rstrip().endswith(ends))]
            if kept:
                with os.fdopen(os.dup(2), "wb") as out:
                    out.write(b"".join(kept))
