"""Where relative data, tokenizer and config paths resolve: the working directory, then the
project root, so the bundled configs work from anywhere."""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def resolve_path(spec: str) -> Path:
    """`spec` as given if absolute or present; else under the project root if there; else `spec`."""
    path = Path(spec).expanduser()
    if path.is_absolute() or path.exists():
        return path
    rooted = PROJECT_ROOT / path
    return rooted if rooted.exists() else path
