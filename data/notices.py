"""Messages that can repeat thousands of times in a long run: a skipped row (`Notices`: logged in full
the first time, then only as a count at 10, 100, 1000, ... occurrences, so a log stays readable and
still says how often it happened) and a shard reading its documents again (`Passes`: one line per
pass). One of each per reader (a run's documents, a run's loader), so each run reports its own."""

from __future__ import annotations

import logging
import threading
from collections import Counter


class Notices:
    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()  # the loader's reader thread and the trainer may both report

    def __call__(self, key: str, message: str, *args: object, level: int = logging.WARNING) -> None:
        """Log `message % args` the first time `key` is seen; afterwards only the count, at every
        power of ten."""
        with self._lock:
            self.counts[key] += 1
            n = self.counts[key]
        if n == 1:
            self.log.log(level, message + " (repeats are counted, not logged)", *args)
        elif _is_power_of_ten(n):
            self.log.log(level, "%s: %d times so far", key, n)


def _is_power_of_ten(n: int) -> bool:
    while n % 10 == 0:
        n //= 10
    return n == 1


class Passes:
    """How many passes over its documents each of a loader's logical shards has begun (1: the first),
    said in one line each time one of them begins a pass that none had begun, so a run that repeats
    its data logs one line per pass and every line counts passes from 1."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.begun: dict[int, int] = {}  # shard -> passes begun
        self._lock = threading.Lock()  # the reader thread wraps shards around; a load resets them

    def restore(self, shard: int, passes: int) -> None:
        """Where a shard stands after a start or a resume (what an earlier launch already said)."""
        with self._lock:
            self.begun[shard] = passes

    def begin(self, shard: int, passes: int) -> None:
        """`shard` begins its pass number `passes` (2 or more: it read all of its documents again)."""
        with self._lock:
            new = passes > max(self.begun.values(), default=1)
            self.begun[shard] = passes
            repeating, fewest = sum(p > 1 for p in self.begun.values()), min(self.begun.values())
            shards = len(self.begun)
        if new:
            self.log.info(
                "data: logical shard %d begins pass %d over its documents (the run sees training data again); "
                "this rank's logical shards past their first pass: %d of %d, fewest passes: %d",
                shard,
                passes,
                repeating,
                shards,
                fewest,
            )
