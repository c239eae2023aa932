"""What a failed checkpoint write means, said in one line: the file system, the space it needs and
has, the latest checkpoint that is still good. Also the early warning before a save that will not
fit (the size of the previous checkpoint against the free space)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

GIB = 2**30
# torch.save reports a full disk as "RuntimeError: ... unexpected pos ..." without an errno: below
# this much free space a failed write is taken for a full disk.
NEARLY_FULL = 64 * 2**20


def mount_point(path: Path) -> Path:
    """The mount point of the file system holding `path` (or its nearest existing parent)."""
    p = path.resolve()
    while not p.exists():
        p = p.parent
    dev = p.stat().st_dev
    while p != p.parent and p.parent.stat().st_dev == dev:
        p = p.parent
    return p


def free_bytes(path: Path) -> int:
    p = path
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def dir_bytes(path: Path) -> int:
    """Bytes of the files under `path`; a file that vanishes meanwhile counts 0 (a size is advice)."""
    total = 0
    for f in path.rglob("*") if path.is_dir() else ():
        try:
            total += f.stat().st_size if f.is_file() else 0
        except FileNotFoundError:
            continue
    return total


def size_text(n: int) -> str:
    """Bytes for a message: GiB from 1 GiB up, MiB below (a tiny model's checkpoint is not 0.00 GiB)."""
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def describe_failure(err: BaseException, root: Path, need: int, written: int, latest: Path | None) -> str | None:
    """One line for a checkpoint write that failed with `err`, or None when `err` is not an I/O
    failure of the file system (a bug: the caller re-raises it as it is). DCP's CheckpointException
    (every rank's failures) is read through to the first rank's exception.

    `need`: the size of `latest`, the run's newest checkpoint (0: none), which the next one matches
    (the same model and optimizer state); `written`: what the failed save had written (its
    temporary directory, removed before the line is read: its space counts as free). Without an
    earlier checkpoint the line can only say the save needs more than was written."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        err = next(iter(failures.values()))[0]
    fs = mount_point(root)
    free = f"{size_text(free_bytes(root) + written)} free"
    if need:
        size = f"needs ~{size_text(need)}, the size of step {_step(latest)}; {free}"
    elif written:
        size = f"needs more than the {size_text(written)} it wrote before failing; {free}"
    else:
        size = free
    code = getattr(err, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT) or (isinstance(err, RuntimeError) and free_bytes(root) < NEARLY_FULL):
        what = "disk quota exceeded" if code == errno.EDQUOT else "no space left"
        reason = f"{what} on {fs} ({size})"
    elif code in (errno.EROFS, errno.EACCES, errno.EPERM):  # the directory, not the disk: say which and the fix
        what = "is on a read-only file system" if code == errno.EROFS else "is not writable (permission denied)"
        reason = f"{root} {what}; make it writable, or give the run a run.dir where it can write"
    elif isinstance(err, OSError):
        where = f" ({err.filename})" if getattr(err, "filename", None) else ""
        reason = f"{os.strerror(code) if code else err}{where} on {fs}"
    else:
        return None
    good = f"step {_step(latest)} ({latest}) is the latest intact" if latest else "no earlier checkpoint"
    return f"{reason}; {good}"


def _step(checkpoint: Path | None) -> int:
    return int(checkpoint.name.split("_")[-1]) if checkpoint is not None else 0
