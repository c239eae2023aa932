"""Console logging for the project's loggers ("orscale.*"), the same in every process, and the
one way a user error reaches the console."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
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
    """Console logging for the project's loggers ("orscale.*"): INFO on rank 0, warnings elsewhere.

    Configures only our logger (not the root), so an embedding application or pytest keeps its
    own handlers; idempotent across calls.
    """
    logger = logging.getLogger("orscale")
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    fmt = "%(asctime)s %(levelname)s %(message)s" if rank == 0 else f"[rank {rank}] %(levelname)s %(message)s"
    handler = next((h for h in logger.handlers if isinstance(h, _StderrHandler)), None)
    if handler is None:
        handler = _StderrHandler()
        logger.addHandler(handler)
    handler.setFormatter(logging.Formatter(fmt, datefmt="%H:%M:%S"))


# Set by `launch.runtime.elastic` (what `python -m launch.launcher` runs) for its workers: it drops
# torchrun's traceback and failure report after a user error, so the error line stands alone.
SHORT_ERRORS_ENV = "ORSCALE_SHORT_ERRORS"


def report_user_error(err: BaseException, rank: int) -> None:
    """A user error as every command shows it: `error: <first line>` on stderr, any detail lines
    (indented) under it; rank 0 only. Under plain torchrun, which follows it with its traceback and
    failure report, the line names the launcher that does not, and torchrun's error file gets it, so
    that report's root cause is this line instead of a pointer to torchrun's docs."""
    if rank != 0:
        return
    first, *detail = str(err).splitlines() or [type(err).__name__]
    if "TORCHELASTIC_RUN_ID" in os.environ and not os.environ.get(SHORT_ERRORS_ENV):
        first += " (plain torchrun adds its traceback; python -m launch.launcher prints this line alone)"
    _print_error(f"error: {first}", detail)


def report_failure(err: BaseException) -> None:
    """A failure that is not the user's but is said in one line all the same (a collective that
    timed out, launch/runtime/hangs.py): `error: <line>` on this rank, whichever it is, and in
    torchrun's error file, so that torchrun's failure report names it as the root cause."""
    first, *detail = str(err).splitlines() or [type(err).__name__]
    _print_error(f"error: {first}", detail)


def _print_error(first: str, detail: list[str]) -> None:
    text = "\n".join([first, *detail])
    print(text, file=sys.stderr, flush=True)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:  # torchrun's @record format: {"message": {"message", "extraInfo": {"py_callstack", ...}}}
        extra = {"py_callstack": text, "timestamp": str(int(time.time()))}
        with contextlib.suppress(OSError):
            Path(error_file).write_text(json.dumps({"message": {"message": first, "extraInfo": extra}}))
