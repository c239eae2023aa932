"""Console logging for the project's loggers ("orscale.*"), the same in every process, and the
one way a user error reaches the console."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at each record: a handler kept across calls must not
    hold a stream that was replaced since (pytest's captures, a redirected console)."""

    @property
    def stream(self):  # noqa: ANN201 (logging's own attribute)
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def setup_logging(rank: int) -> None:
    """Console logging for the project's loggers ("orscale.*"): INFO on rank 0, warnings elsewhere. Only our
    logger (not the root), so an embedding application or pytest keeps its own handlers; idempotent."""
    logger = logging.getLogger("orscale")
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    fmt = "%(asctime)s %(levelname)s %(message)s" if rank == 0 else f"[rank {rank}] %(levelname)s %(message)s"
    handler = next((h for h in logger.handlers if isinstance(h, _StderrHandler)), None)
    if handler is None:
        handler = _StderrHandler()
        logger.addHandler(handler)
    handler.setFormatter(logging.Formatter(fmt, datefmt="%H:%M:%S"))


# Set by `launch.launcher.torchrun` (what `python -m launch.launcher` runs) for its workers: it drops
# torchrun's traceback and failure report after a user error, so the error line stands alone.
SHORT_ERRORS_ENV = "ORSCALE_SHORT_ERRORS"


# How long a rank other than 0 waits, after a user error, for rank 0 to say it and exit.
RANK_ZERO_GRACE_S = 30.0


def report_user_error(err: BaseException, rank: int, rank_zero_grace_s: float = RANK_ZERO_GRACE_S) -> None:
    """A user error as every command shows it: `error: <first line>` on stderr, any detail lines
    (indented) under it, said by rank 0. Under plain torchrun, which follows it with its traceback and
    failure report, the line names the launcher that does not, and torchrun's error file gets it, so
    that report's root cause is this line instead of a pointer to torchrun's docs.

    Another rank must not exit first: the launcher ends every worker as soon as one fails, which
    would kill rank 0 before its line is out (seen under CI load). So it waits for the launcher's
    SIGTERM (then exits 2, silently); if none comes within the grace, rank 0 did not fail the same
    way, and this rank says the error itself, prefixed with its rank."""
    first, *detail = str(err).splitlines() or [type(err).__name__]
    if rank != 0:
        _wait_for_the_launcher_to_end_this_rank(rank_zero_grace_s)  # does not return if it does
        _print_error(f"[rank {rank}] error: {first}", detail)
        return
    if "TORCHELASTIC_RUN_ID" in os.environ and not os.environ.get(SHORT_ERRORS_ENV):
        first += " (plain torchrun adds its traceback; python -m launch.launcher prints this line alone)"
    _print_error(f"error: {first}", detail)


def report_failure(err: BaseException) -> None:
    """A failure that is not the user's but is said in one line all the same (a collective that
    timed out, launch/runtime/hangs.py): `error: <line>` on this rank, whichever it is, and in
    torchrun's error file, so that torchrun's failure report names it as the root cause."""
    first, *detail = str(err).splitlines() or [type(err).__name__]
    _print_error(f"error: {first}", detail)


def _wait_for_the_launcher_to_end_this_rank(grace_s: float) -> None:
    """Sleep up to `grace_s`; the launcher's SIGTERM (sent once a peer has exited) ends the process
    there with status 2, the user-error status, so the launch reads as one user error. Returns
    when the grace ran out (at once where signals cannot be set: not the main thread)."""
    if grace_s <= 0 or threading.current_thread() is not threading.main_thread():
        return
    sys.stderr.flush()
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(2))
    time.sleep(grace_s)


def _print_error(first: str, detail: list[str]) -> None:
    text = "\n".join([first, *detail])
    print(text, file=sys.stderr, flush=True)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:  # torchrun's @record format: {"message": {"message", "extraInfo": {"py_callstack", ...}}}
        extra = {"py_callstack": text, "timestamp": str(int(time.time()))}
        with contextlib.suppress(OSError):
            Path(error_file).write_text(json.dumps({"message": {"message": first, "extraInfo": extra}}))
