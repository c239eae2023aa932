"""Data-pipeline user errors and path resolution shared by the data modules."""

from __future__ import annotations

from pathlib import Path

from launch.config import UserError

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class DataError(UserError):
    """A user error in the data setup: one line naming the file or key and the fix."""


def resolve_path(spec: str) -> Path:
    """Relative paths are tried against the working directory, then the project root, so the
    bundled configs work from anywhere."""
    path = Path(spec).expanduser()
    if path.is_absolute() or path.exists():
        return path
    rooted = PROJECT_ROOT / path
    return rooted if rooted.exists() else path


def first_line(err: BaseException) -> str:
    """A library exception's first message line (or its type), for one-line user errors."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
