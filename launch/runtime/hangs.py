"""Hangs that end: collective timeouts, and what a timed-out collective becomes (docs/running.md, "Hangs that
end"). Without a timeout, a rank that stops answering would keep every other rank waiting in its next collective
for ever; past it gloo raises in the waiting call (`CommFailure`, one line, exit status 3) and NCCL's watchdog ends
the process, and the launcher's restart resumes from the newest checkpoint.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.torch_version import TorchVersion

COMM_FAILURE_EXIT = 3  # launch.loop.main's exit status after a CommFailure (2 is a user error)

# torch 2.13 reads TORCH_NCCL_ASYNC_ERROR_HANDLING (NCCL_ASYNC_ERROR_HANDLING is its old name, still
# read) when a NCCL group is made: 1 aborts the communicators and ends the process on a timeout
# (torchrun's default for its workers), 3 ends it without the abort (torch's own default); 0 only
# logs and 2 only aborts, so with them a timed-out collective can leave the process hanging.
ASYNC_ERROR_HANDLING = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING")
_ENDS_THE_PROCESS = ("1", "3")


class CommFailure(RuntimeError):
    """A collective that timed out or lost its peer: one line (the rank, what, where, the way
    back), printed by every rank that saw it (the stalled one may be rank 0) and exit status 3."""


def nccl_ends_on_timeout() -> str | None:
    """Make a timed-out NCCL collective end this process instead of hanging it (set before the NCCL
    group exists). Returns a warning line when the environment already holds a setting that does
    not end it (kept: it was chosen)."""
    for name in ASYNC_ERROR_HANDLING:
        value = os.environ.get(name)
        if value is not None:
            if value.strip() in _ENDS_THE_PROCESS:
                return None
            return (
                f"{name}={value}: a NCCL collective past parallel.comm_timeout_s will not end this process "
                f"(it may hang instead); unset {name} or set it to 1"
            )
    os.environ[ASYNC_ERROR_HANDLING[0]] = "1"
    return None


# NCCL's flight recorder: a ring of the last collectives each process group issued, with their state
# (scheduled, started, completed), written per rank when the watchdog sees a timeout, before it ends the
# process. A host stack cannot name a stuck NCCL collective (it returned to Python at once and waits on
# the GPU); this record does. The ring's size and the dump file have two names each, (current, older):
# c10d reads such a list with its first name winning, and an older name that is set logs "... is
# deprecated; use <current> instead" in every process (c10d/Utils.hpp, getCvar*). torch before 2.9 reads
# only the older names. So each is set under the one name this torch reads first.
FR_BUFFER_SIZE = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_DUMP_ON_TIMEOUT = ("TORCH_NCCL_DUMP_ON_TIMEOUT",)
FR_DUMP_FILE = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")  # a prefix: the rank is appended
FR_CURRENT_NAMES_SINCE = "2.9"
FR_ENTRIES = "2000"  # entries of the ring (torch's own default since it records by default)
FR_PREFIX = "nccl_trace_rank_"  # <run.dir>/nccl_trace_rank_<R>


def _name_read_first(names: tuple[str, ...]) -> str:
    """The name of a setting that this torch reads first: the current one, the older one before 2.9."""
    current = TorchVersion(torch.__version__) >= FR_CURRENT_NAMES_SINCE
    return names[0] if current else names[-1]


def nccl_flight_recorder(run_dir: str | Path | None) -> dict[str, str]:
    """Turn NCCL's flight recorder on, its dumps at a timeout written to `<run_dir>/nccl_trace_rank_<R>`
    (call before the NCCL group exists; docs/running.md, "Hangs that end"). A setting the user made
    (under either of its names) is kept. Returns what was set."""
    wanted = [(FR_BUFFER_SIZE, FR_ENTRIES), (FR_DUMP_ON_TIMEOUT, "1")]
    if run_dir is not None:
        wanted.append((FR_DUMP_FILE, str(Path(run_dir).resolve() / FR_PREFIX)))
    set_now: dict[str, str] = {}
    for names, value in wanted:
        if not any(name in os.environ for name in names):
            name = _name_read_first(names)
            os.environ[name] = set_now[name] = value
    return set_now


def elastic_store(timeout: datetime.timedelta) -> dist.Store | None:
    """torchrun's agent store seen through a prefix of this restart attempt, for
    `init_process_group(store=...)`; None when the workers do not share their agent's store.

    torch 2.13's env:// rendezvous hands every attempt of `--max-restarts` the same agent store
    with no per-attempt prefix (its comment assumes a new store per retry; the agent keeps one), so
    a restarted group can read its peers' addresses from the attempt before: gloo then connects to
    a dead port and fails or hangs (4 restarts in 6 here, 0 in 6 with the prefix).
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return None
    addr, port, world = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(addr, port, world, is_master=False, timeout=timeout)
    return dist.PrefixStore(f"/orscale/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def set_default_timeout(timeout: datetime.timedelta) -> None:
    """The timeout of every process group made from now on without one of its own: preemption's
    gloo group, FSDP2's device-mesh groups, DeepSpeed's. `new_group` takes torch's module-wide
    default (30 min for gloo, 10 for NCCL), not the default group's, and there is no public setter."""
    c10d.default_pg_timeout = timeout
    if c10d.default_pg_nccl_timeout is not None:
        c10d.default_pg_nccl_timeout = timeout


def set_comm_timeout(seconds: float) -> None:
    """Every process group's timeout, the existing ones' and later ones', to `seconds`
    (`parallel.comm_timeout_s`, once the run's start-up is over). Collective: a barrier first, so
    that no rank waits under the short timeout for a peer still inside start-up under the long one."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.barrier()
    timeout = datetime.timedelta(seconds=seconds)
    set_default_timeout(timeout)
    for group in list(c10d._world.pg_map):  # this rank's groups (torch has no public listing)
        c10d._set_pg_timeout(timeout, group)


GLOO_PAIR_CLOSURE = "application timeout caused pair closure"


def comm_failure(err: BaseException, rank: int, where: str, timeout: str, resume: str) -> CommFailure | None:
    """`err` as a CommFailure when it is a collective that timed out or lost its peer, else None
    (any other error keeps its traceback). `where`: "in step N" or "during start-up"; `timeout`:
    the setting that applied ("parallel.comm_timeout_s=600"); `resume`: where the run resumes from."""
    text = str(err)
    first = text.splitlines()[0] if text else type(err).__name__
    low = first.lower()
    # gloo raises plain RuntimeErrors that name its sources ("[.../gloo/transport/tcp/pair.cc:553]
    # Connection closed by peer"), except the one it gives every other operation of a rank whose
    # recv timed out ("Application timeout caused pair closure": seen in CI raised by a checkpoint's
    # all_gather_object); NCCL's and the stores' errors are DistErrors.
    if not (isinstance(err, dist.DistError) or "gloo" in low or GLOO_PAIR_CLOSURE in low):
        return None
    if any(s in low for s in ("timed out", "timeout", "timing out")):
        what = (
            f"a collective timed out ({timeout}) {where}: a peer rank stopped answering "
            "(stalled, stopped, or its host is gone)"
        )
    elif any(s in first for s in ("closed by peer", "reset by peer", "Broken pipe", "Connection refused")):
        what = f"a collective failed {where}: a peer rank's connection closed (it exited or was killed; see its log)"
    else:
        what = f"a collective failed {where}: {first.strip()}"
    return CommFailure(f"rank {rank}: {what}; {resume}")
