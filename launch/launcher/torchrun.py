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
    """Drops torchrun's "failed (exitcode: 2)" log lines (the worker said why in one line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"(exitcode: {USER_ERROR})" not in record.getMessage()


@record
def _report(err: ChildFailedError) -> None:
    raise err  # torchrun's own report of a crash (what `torchrun` prints)


def main(argv: list[str] | None = None) -> int:
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_HideUserErrorExits())
    os.environ[SHORT_ERRORS_ENV] = "1"  # inherited by the workers: their error line stands alone here
    try:
        run(parse_args(argv))
    except ChildFailedError as err:
        if {f.exitcode for f in err.failures.values()} == {USER_ERROR}:
            return USER_ERROR
        _report(err)
    finally:
        os.environ.pop(SHORT_ERRORS_ENV, None)  # only for this launch's workers (main runs in-process in tests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
