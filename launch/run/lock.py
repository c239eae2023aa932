"""One writer per run directory: an exclusive `flock` on `<run.dir>/.lock`, held by rank 0 for the run's life and
released by the kernel when the process ends however it ends (kill -9 included). A run that ends (finished, stopped,
or on an error it reports) removes the lock file as it releases it; one killed keeps it, naming its holder, and the
next launch takes it over (the flock is what is held, not the file). A start that fails before training also removes
the directories taking the lock created, so a refused launch leaves nothing the user did not have."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import IO

from launch.errors import ConfigError
from launch.launcher.parent_death import adopted_by_init


class RunLock:
    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / ".lock"
        self._fh: IO[str] | None = None
        self._created: list[Path] = []  # what acquire made, the lock file first, then its directories

    def acquire(self, grace_s: float = 10.0) -> str | None:
        """None once held; otherwise who holds it (from the lock file), for the error message.

        A held lock is retried for `grace_s` seconds first: after kill -9 of torchrun its workers
        die by their parent-death signal, but a worker's exit (and with it the lock) can trail the
        launcher's by a moment, and a requeue that relaunches at once must not be refused for it.
        A holder seen running on this host with its launcher is a live launch: refused at once."""
        deadline = time.monotonic() + grace_s
        while True:
            fh, created = self._open()
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    holder = _read_holder(fh)
                    if time.monotonic() < deadline and not _running_here(holder):
                        time.sleep(0.2)
                        continue
                    fh.close()
                    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('since', '?')}"
            if self._is_current(fh):
                break
            fh.close()  # a failed start removed the file while we waited on it: lock the one there now
        fh.seek(0)
        fh.truncate()
        fh.write(
            json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")})
        )
        fh.flush()
        self._fh, self._created = fh, created
        return None

    def _open(self) -> tuple[IO[str], list[Path]]:
        """The lock file opened (created with its directories if need be), and what was created."""
        missing, parent = [], self.path.parent
        while not parent.exists() and parent != parent.parent:
            missing.append(parent)
            parent = parent.parent
        existed = self.path.exists()
        try:
            try:
                fh = self._create()
            except FileNotFoundError:  # another launch's failed start removed the directory just then
                fh = self._create()
        except OSError as err:  # a parent that is a file, no permission, a read-only file system
            raise ConfigError(
                f"run.dir '{self.path.parent}' cannot be created or written "
                f"({err.strerror or err}); choose another run.dir"
            ) from None
        return fh, ([] if existed else [self.path]) + missing

    def _create(self) -> IO[str]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return open(self.path, "a+")

    def _is_current(self, fh: IO[str]) -> bool:
        """Whether `fh` is still the file at the lock's path (not one removed by `release(discard)`)."""
        try:
            return os.stat(self.path).st_ino == os.fstat(fh.fileno()).st_ino
        except FileNotFoundError:
            return False

    def release(self, discard: bool = False) -> None:
        """Unlock and remove the lock file (removed while held: a launch waiting on it locks the file
        there afterwards, `acquire`). `discard`: the run never started (a refused or failed start):
        also remove each directory `acquire` made for it that is still empty."""
        if self._fh is None:
            return
        if self._is_current(self._fh):
            self.path.unlink(missing_ok=True)
        for path in self._created if discard else []:
            if path == self.path:
                continue
            try:
                path.rmdir()
            except OSError:  # not empty (something else was written there) or gone: keep the rest
                break
        self._created = []
        fcntl.flock(self._fh, fcntl.LOCK_UN)
        self._fh.close()
        self._fh = None


def _read_holder(fh: IO[str]) -> dict:
    """The holder's record ({} while it is being written or if unreadable)."""
    fh.seek(0)
    try:
        holder = json.loads(fh.read() or "{}")
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _running_here(holder: dict) -> bool:
    """Whether the holder is a process on this host that still has its launcher and is not being
    killed: a live launch. False when that cannot be told (another host, no /proc): then wait."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        lines = Path(f"/proc/{holder['pid']}/status").read_text().splitlines()
    except OSError:
        return False
    status = dict(line.split(":", 1) for line in lines if ":" in line)
    sigkill = 1 << (signal.SIGKILL - 1)  # pending: its launcher died and the parent-death signal is on its way
    pending = int(status.get("SigPnd", "0"), 16) | int(status.get("ShdPnd", "0"), 16)
    orphaned = adopted_by_init(int(status.get("PPid", "1")))
    return status.get("State", "Z").split()[0] not in ("Z", "X") and not orphaned and not pending & sigkill
