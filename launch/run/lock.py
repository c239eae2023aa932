"""One writer per run directory: an exclusive `flock` on `<run.dir>/.lock`, held by rank 0 for the
run's life and released by the kernel when the process ends however it ends (kill -9 included).
A second launch on the same run.dir gets one line naming the holder."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from launch.errors import ConfigError


class RunLock:
    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / ".lock"
        self._fh = None

    def acquire(self, grace_s: float = 10.0) -> str | None:
        """None once held; otherwise who holds it (from the lock file), for the error message.

        A held lock is retried for `grace_s` seconds first: after kill -9 of torchrun its workers
        die by their parent-death signal, but a worker's exit (and with it the lock) can trail the
        launcher's by a moment, and a requeue that relaunches at once must not be refused for it."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fh = open(self.path, "a+")
        except OSError as err:  # a parent that is a file, no permission, a read-only file system
            raise ConfigError(
                f"run.dir '{self.path.parent}' cannot be created or written "
                f"({err.strerror or err}); choose another run.dir"
            ) from None
        deadline = time.monotonic() + grace_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                fh.seek(0)
                try:
                    holder = json.loads(fh.read() or "{}")
                except ValueError:
                    holder = {}
                fh.close()
                return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('since', '?')}"
        fh.seek(0)
        fh.truncate()
        fh.write(
            json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")})
        )
        fh.flush()
        self._fh = fh
        return None

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
