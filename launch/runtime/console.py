"""Console logging for the project's loggers ("orscale.*"), the same in every process."""

from __future__ import annotations

import logging


def setup_logging(rank: int) -> None:
    """Console logging for the project's loggers ("orscale.*"): INFO on rank 0, warnings elsewhere.

    Configures only our logger (not the root), so an embedding application or pytest keeps its
    own handlers; idempotent across calls.
    """
    logger = logging.getLogger("orscale")
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    fmt = "%(asctime)s %(levelname)s %(message)s" if rank == 0 else f"[rank {rank}] %(levelname)s %(message)s"
    handler = next((h for h in logger.handlers if getattr(h, "_orscale_console", False)), None)
    if handler is None:
        handler = logging.StreamHandler()
        handler._orscale_console = True
        logger.addHandler(handler)
    handler.setFormatter(logging.Formatter(fmt, datefmt="%H:%M:%S"))
