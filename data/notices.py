"""Messages that can repeat thousands of times in a long run (a skipped row, a shard wrapping
around): logged in full the first time, then only as a count at 10, 100, 1000, ... occurrences,
so a log stays readable and still says how often it happened. One `Notices` per reader (a run's
documents, a run's loader), so each run reports its own."""

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
