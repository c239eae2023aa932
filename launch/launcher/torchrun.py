"""torchrun (`torch.distributed.run`) as `launch.launcher` starts it (`python -m launch.launcher.torchrun`):
the same arguments and behaviour, but when every failed worker exited with a user error (status 2: its
one `error: ...` line is already printed) torchrun's own traceback and failure report are left out, so
that line is what the user sees. A worker that crashed keeps torchrun's full report."""

from __future__ import annotations

import logging
import os
import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.run import parse_args, run

from launch.runtime.console import SHORT_ERRORS_ENV

USER_ERROR = 2  # launch.loop.main's exit status for a one-line user error


class _HideUserErrorExits(logging.Filter):
    """Drops torchrun's "failed (exitcode: 2)" log lines (the worker said why in one line), and holds its
    "Sending process N closing signal SIGTERM" lines (torchrun ending the workers that wait for it after
    a user error), which come before the failure they belong to: passed on before another exit status's
    line (`release`, also once the launch is over), or dropped when the launch ended on user errors alone."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "released", False):
            return True
        message = record.getMessage()
        if "closing signal" in message or "via signal" in message:  # SubprocessContext's, MultiprocessContext's
            self.held.append(record)
            return False
        if f"(exitcode: {USER_ERROR})" in message:
            return False
        if message.startswith("failed (exitcode: "):
            self.release()
        return True

    def release(self) -> None:
        """Log the held lines, in their order."""
        held, self.held = self.held, []
        for line in held:
            line.released = True
            logging.getLogger(line.name).handle(line)


@record
def _report(err: ChildFailedError) -> None:
    raise err  # torchrun's own report of a crash (what `torchrun` prints)


def main(argv: list[str] | None = None) -> int:
    logger, quiet = logging.getLogger("torch.distributed.elastic.multiprocessing.api"), _HideUserErrorExits()
    logger.addFilter(quiet)
    os.environ[SHORT_ERRORS_ENV] = "1"  # inherited by the workers: their error line stands alone here
    try:
        run(parse_args(argv))
    except ChildFailedError as err:
        if {f.exitcode for f in err.failures.values()} == {USER_ERROR}:
            quiet.held.clear()
            return USER_ERROR
        quiet.release()
        _report(err)
    finally:
        quiet.release()  # torchrun ended its workers for another reason (a signal it handles)
        logger.removeFilter(quiet)
        os.environ.pop(SHORT_ERRORS_ENV, None)  # only for this launch's workers (main runs in-process in tests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
