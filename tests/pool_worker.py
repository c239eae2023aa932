"""One rank of `tests.pool.RankPool`: imports torch and the project once, then runs the jobs it is
sent, each in a process group of its own, and puts the process back as it found it after each.

    python -m tests.pool_worker HOST PORT RANK NPROC      (started by tests/pool.py)
"""

from __future__ import annotations

import datetime
import faulthandler
import gc
import logging
import os
import pickle
import random
import signal
import sys
import threading
import traceback
import warnings
from multiprocessing.connection import Client
from typing import Any

from launch.launcher.parent_death import ask_for_death_signal

PRISTINE: dict[str, dict[str, Any]] = {}
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
GROUP_TIMEOUT = datetime.timedelta(seconds=300)  # below the pool's job timeout: a hang raises here first


class _Snapshot:
    """What a job may change in this process and the next job must not inherit."""

    def __init__(self) -> None:
        import torch
        import torch.distributed.distributed_c10d as c10d

        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.threads = torch.get_num_threads()
        self.signals = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        self.loggers = {
            name: (lg.level, list(lg.handlers), lg.propagate)
            for name, lg in [("", logging.getLogger())] + list(logging.Logger.manager.loggerDict.items())
            if isinstance(lg, logging.Logger)
        }
        self.warning_filters = list(warnings.filters)
        self.pg_timeouts = (c10d.default_pg_timeout, c10d.default_pg_nccl_timeout)
        self.threads_alive = set(threading.enumerate())
        self.default_dtype = torch.get_default_dtype()

    def restore(self) -> list[str]:
        """Put everything back; returns what the job left running (threads), to fail loudly."""
        import torch
        import torch.distributed.distributed_c10d as c10d

        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.environ)
        torch.set_num_threads(self.threads)
        torch.set_default_dtype(self.default_dtype)
        for sig, handler in self.signals.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        for name, (level, handlers, propagate) in self.loggers.items():
            lg = logging.getLogger(name or None)
            lg.setLevel(level)
            lg.handlers[:] = handlers
            lg.propagate = propagate
        warnings.filters[:] = self.warning_filters
        c10d.default_pg_timeout, c10d.default_pg_nccl_timeout = self.pg_timeouts
        if "torch._dynamo" in sys.modules:  # compiled graphs and recompile counters start afresh
            torch._dynamo.reset()
        _restore_module_globals(PRISTINE)
        gc.collect()
        left = [t for t in threading.enumerate() if t not in self.threads_alive and t.is_alive() and not t.daemon]
        return [t.name for t in left]


# Modules whose globals cache process-group state (DeepSpeed's groups and communication backend, its
# autocast flag): restored to their state at the worker's start after every job, as the job's
# process group is gone (the next job's deepspeed.initialize makes new ones).
CACHING_MODULES = ("deepspeed.utils.groups", "deepspeed.comm.comm", "deepspeed.runtime.torch_autocast")


def _module_globals() -> dict[str, dict[str, Any]]:
    import importlib

    out = {}
    for name in CACHING_MODULES:
        module = importlib.import_module(name)
        out[name] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in vars(module).items() if _state(k, v)}
    return out


def _state(name: str, value: Any) -> bool:
    return not name.startswith("__") and (value is None or isinstance(value, (bool, dict)))


def _restore_module_globals(pristine: dict[str, dict[str, Any]]) -> None:
    for module_name, values in pristine.items():
        module = sys.modules[module_name]
        for key, value in values.items():
            setattr(module, key, dict(value) if isinstance(value, dict) else value)


def _seed_everything(seed: int = 0) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _run_job(
    payload: bytes, rank: int, nproc: int, store: Any, job: int
) -> tuple[Any, str | None, str]:  # value, error line, traceback
    import torch.distributed as dist

    snapshot = _Snapshot()
    value, error, trace = None, None, ""
    try:
        fn, args, kwargs, group, _timeout = pickle.loads(payload)
        if group:  # what torchrun gives its workers (the snapshot takes it back after the job)
            os.environ.update(
                RANK=str(rank),
                WORLD_SIZE=str(nproc),
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(nproc),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(store.port),
            )
            dist.init_process_group(
                "gloo",
                store=dist.PrefixStore(f"job{job}", store),
                rank=rank,
                world_size=nproc,
                timeout=GROUP_TIMEOUT,
            )
        _seed_everything()
        value = fn(*args, **kwargs)
    except BaseException as err:  # SystemExit included: report it, keep serving
        error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        trace = traceback.format_exc()
    try:
        if error is None and dist.is_initialized():
            dist.barrier()  # no rank tears gloo down while a peer is still in its last collective
    except RuntimeError:
        pass  # a peer failed and left: its error is the job's (the pool restarts after it)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        left = snapshot.restore()
        if left and error is None:
            error = f"RuntimeError: the job left threads running: {', '.join(left)}"
        sys.stdout.flush()
        sys.stderr.flush()
    return value, error, trace


def main() -> None:
    ask_for_death_signal()  # the pool's parent is pytest: if it dies, so does this worker
    # A native crash (an abort, a segfault) writes every thread's Python stack to this rank's log,
    # which comes back with the job's result: which job, which call.
    faulthandler.enable()
    host, port, rank, nproc = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:5])
    conn = Client((host, port), authkey=bytes.fromhex(os.environ.pop("ORSCALE_POOL_AUTHKEY")))
    conn.send(rank)
    os.environ["POOL_RANK"] = str(rank)  # which rank of the pool this is, with or without a group
    import torch  # noqa: F401  # the imports every job needs, paid once
    import torch.distributed as dist

    import launch.loop  # noqa: F401
    from tests.pool import RankResult

    global PRISTINE
    PRISTINE = _module_globals()

    # Rank 0's store takes a port the kernel hands it (port 0) and says which: a port chosen first
    # and bound later can be taken in between (another launch, a gloo connection's ephemeral port).
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, nproc, is_master=True, timeout=GROUP_TIMEOUT, wait_for_workers=False)
        conn.send(store.port)
    else:
        store = dist.TCPStore("127.0.0.1", conn.recv(), nproc, is_master=False, timeout=GROUP_TIMEOUT)
    conn.send("ready")
    job = 0
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            break
        if payload == _EXIT:
            break
        job += 1
        value, error, trace = _run_job(payload, rank, nproc, store, job)
        # Plain pickle, not Connection.send's ForkingPickler: torch registers reducers there that
        # pass tensors as file descriptors, which only a process of this family can receive.
        try:
            answer = pickle.dumps(RankResult(rank, value=value, error=error, traceback=trace))
        except Exception as err:  # an unpicklable value is the job's error, not the pool's
            answer = pickle.dumps(RankResult(rank, error=f"the job's value cannot be sent back: {err!r}"))
        conn.send_bytes(answer)
    os._exit(0)  # no interpreter teardown: nothing left to flush, and gloo threads must not linger


_EXIT = pickle.dumps(None)  # what RankPool.close sends

if __name__ == "__main__":
    main()
