"""A checkpoint's manifest: every file's size and checksum, written after the parts and before
meta.json, so a resume can tell a complete checkpoint from one a crash, a full disk or a bad copy
truncated or changed, and fall back to an earlier one instead of failing deep inside a loader."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
_CHUNK = 1 << 22


def _hasher() -> tuple[str, Callable[[], Any] | None]:
    try:  # xxhash comes with `datasets`; ~10x faster than crc32 on multi-GB checkpoints
        import xxhash

        return "xxh3_64", xxhash.xxh3_64
    except ImportError:
        return "crc32", None


def checksum(path: Path) -> tuple[str, str]:
    name, make = _hasher()
    with open(path, "rb") as fh:
        if make is None:
            value = 0
            while chunk := fh.read(_CHUNK):
                value = zlib.crc32(chunk, value)
            return name, f"{value:08x}"
        h = make()
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
        return name, h.hexdigest()


def write_manifest(directory: Path, exclude: tuple[str, ...] = ()) -> None:
    """Record every file under `directory` (but `exclude`d names) as {relative path: size, checksum}."""
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel in exclude or rel == MANIFEST:
            continue
        algo, digest = checksum(path)
        files[rel] = {"bytes": path.stat().st_size, algo: digest}
    (directory / MANIFEST).write_text(json.dumps({"files": files}, indent=0))


def verify_manifest(directory: Path) -> str | None:
    """None if every file the manifest lists is there with its size and checksum; otherwise what is
    wrong, naming the file. A checkpoint without a manifest (older) passes: it is tried as is."""
    path = directory / MANIFEST
    if not path.is_file():
        return None
    try:
        files = json.loads(path.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return f"{path} is not a valid manifest"
    for rel, want in files.items():
        f = directory / rel
        if not f.is_file():
            return f"{f} is missing"
        if f.stat().st_size != want["bytes"]:
            return f"{f} has {f.stat().st_size} bytes, the manifest says {want['bytes']}"
        algo, digest = checksum(f)
        if algo in want and want[algo] != digest:
            return f"{f} does not match its checksum"
    return None
