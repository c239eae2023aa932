"""Data-pipeline user errors: one line naming the file or key and the fix."""

from __future__ import annotations


class DataError(ValueError):
    """A user error in the data setup (`data:` section, files, tokenizer): the trainer prints its
    one-line message and exits 2."""


def first_line(err: BaseException) -> str:
    """A library exception's first message line (or its type), for one-line user errors."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
