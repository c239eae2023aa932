"""Stalls outside collectives, reported, not ended (docs/running.md, "Hangs that end"): while a step makes no
progress for `train.stall_dump_s`, one line naming the rank and the step, then every thread's stack on stderr, again
each `stall_dump_s` while it lasts. A watcher thread writes the header and `faulthandler.dump_traceback` the stacks
(of threads blocked in C too); not `faulthandler.dump_traceback_later` alone, whose dumps would not say which step
stalled (the watcher needs the GIL, which a blocked read or wait releases). A NCCL collective returns to Python at once
and waits on the GPU, so a stack shows the next host sync instead: NCCL's flight recorder names a stuck one
(`launch/runtime/hangs.py`).
"""

from __future__ import annotations

import faulthandler
import logging
import sys
import threading
import time

log = logging.getLogger("orscale")


class StallWatch:
    """`beat(step)` when a step begins; `close()` at the end. `every_s` 0: off (beats still record
    the step, which the loop's failure lines name)."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._beat = (0, time.monotonic())  # (step, when it began): one tuple, replaced whole
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        if every_s > 0:
            self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)
            self._thread.start()

    @property
    def step(self) -> int:
        """The step now running (0 before the first)."""
        return self._beat[0]

    def beat(self, step: int) -> None:
        self._beat = (step, time.monotonic())  # no lock: one reference assignment

    def close(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _watch(self) -> None:
        dumped: tuple[tuple[int, float], int] = (self._beat, 0)  # (the beat, dumps made during it)
        while not self._done.wait(min(1.0, self.every_s / 4)):
            beat = self._beat
            dumps = dumped[1] if dumped[0] is beat else 0
            waited = time.monotonic() - beat[1]
            if waited >= (dumps + 1) * self.every_s:
                self._dump(beat[0], waited)
                dumped = (beat, dumps + 1)

    def _dump(self, step: int, waited: float) -> None:
        log.warning(
            "stall: step %d has run for %.0f s without finishing (train.stall_dump_s=%g); every thread's "
            "stack follows: look for a read, a wait or a gloo collective that does not return (a stuck NCCL "
            "collective shows as the next host sync here; NCCL's flight recorder names it)",
            step,
            waited,
            self.every_s,
        )
        for stream in (sys.stderr, sys.__stderr__):  # a stand-in stderr without a file descriptor: the real one
            if stream is None:
                continue
            try:
                stream.flush()
                faulthandler.dump_traceback(file=stream, all_threads=True)
                return
            except (AttributeError, ValueError, OSError):
                continue
