"""Workers do not outlive their launcher. Standard library only: `train.py` calls this before its
heavy imports, so a launcher killed during start-up (a requeue, a kill -9 of `torchrun`) takes its
workers with it instead of leaving orphans that train into the run directory."""

from __future__ import annotations

import os
import sys

# What PID 1 runs when a container starts the launcher itself as its first process: then a
# worker's parent is PID 1 and alive (anything else at PID 1 is an init that adopted an orphan).
_LAUNCHERS = ("python", "torchrun", "accelerate", "deepspeed")


def init_cmdline() -> str:
    """What PID 1 runs ("" if it cannot be read)."""
    try:
        with open("/proc/1/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def adopted_by_init(ppid: int | None = None) -> bool:
    """Whether a process whose parent is `ppid` (default: this process's) was adopted by an init,
    so that its launcher is gone."""
    init = init_cmdline()
    ppid = os.getppid() if ppid is None else ppid
    return ppid == 1 and bool(init) and not any(name in init for name in _LAUNCHERS)


def die_with_parent() -> None:
    """Under torchrun (Linux): ask the kernel to SIGKILL this worker when its launcher dies, and
    exit at once if the launcher is already gone (this worker was re-parented to init)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    ask_for_death_signal()
    if os.getppid() != parent or adopted_by_init():  # the launcher died before the request took effect
        os._exit(1)


def ask_for_death_signal() -> None:
    """Linux: ask the kernel to SIGKILL this process when its parent dies (PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
