"""Pre-tokenised shards: one token file per source file, written by `python -m data.prepare`, read
through `numpy.memmap` (`data.source=tokens`, `data.data_files=[DIR]`).

DIR/manifest.json   format, tokenizer fingerprint, the source it came from, dtype, and per file:
                    its token file, its row-offset file and the rows of each of its pieces
DIR/NNNNN.tokens    every row's ids followed by EOS, concatenated (uint16 when the vocabulary has
                    < 65,536 ids, else uint32); a skipped row holds no tokens
DIR/NNNNN.offsets.npy  int64 [rows + 1]: row r is tokens[offsets[r]:offsets[r + 1]]

The pieces and rows are the text corpus's own, so packing, sharding, shuffling and resume work the
same way on either source and give the same windows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from data.data_config import DataConfig
from data.data_errors import DataError, first_line
from data.paths import resolve_path
from data.tokenizer import TextTokenizer

SHARDS_MANIFEST = "manifest.json"
SHARDS_FORMAT = 1


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def shard_names(k: int) -> tuple[str, str]:
    return f"{k:05d}.tokens", f"{k:05d}.offsets.npy"


def read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / SHARDS_MANIFEST
    if not path.is_file():
        raise DataError(
            f"'{directory}' holds no {SHARDS_MANIFEST}; write token shards with "
            "python -m data.prepare --config CONFIG --out DIR"
        )
    try:
        manifest = json.loads(path.read_text())
        assert manifest["format"] == SHARDS_FORMAT and isinstance(manifest["files"], list)
        for entry in manifest["files"]:
            assert {"tokens", "offsets", "pieces"} <= set(entry)
    except (ValueError, KeyError, TypeError, AssertionError) as err:
        raise DataError(
            f"token shard manifest '{path}' is not valid ({first_line(err) or 'missing fields'}); "
            "write it again with python -m data.prepare"
        ) from None
    return manifest


class TokenDocuments:
    """The pieces of a pre-tokenised corpus, rows as token arrays (int32), read through memmap."""

    def __init__(self, directory: Path, manifest: dict[str, Any]) -> None:
        self.directory, self.manifest = directory, manifest
        self.dtype = np.dtype(manifest["dtype"])
        self._pieces: list[tuple[int, int, int]] = []  # (file, first row, end row)
        self._tokens: list[np.ndarray] = []
        self._offsets: list[np.ndarray] = []
        for k, entry in enumerate(manifest["files"]):
            tokens_path, offsets_path = directory / entry["tokens"], directory / entry["offsets"]
            for path in (tokens_path, offsets_path):
                if not path.is_file():
                    raise DataError(
                        f"token shard file '{path}' is missing; write the shards again with "
                        "python -m data.prepare (it resumes)"
                    )
            try:
                offsets = np.load(offsets_path, mmap_mode="r")
            except (ValueError, OSError) as err:
                raise DataError(f"token shard index '{offsets_path}' is unreadable: {first_line(err)}") from None
            expected = int(offsets[-1]) * self.dtype.itemsize if len(offsets) else 0
            if tokens_path.stat().st_size != expected or len(offsets) != sum(entry["pieces"]) + 1:
                raise DataError(
                    f"token shard '{tokens_path}' is truncated or does not match its index "
                    f"({tokens_path.stat().st_size} bytes, expected {expected}); write it again "
                    "with python -m data.prepare"
                )
            self._tokens.append(
                np.memmap(tokens_path, dtype=self.dtype, mode="r") if expected else np.zeros(0, dtype=self.dtype)
            )
            self._offsets.append(offsets)
            row = 0
            for rows in entry["pieces"]:
                self._pieces.append((k, row, row + rows))
                row += rows
        self.pieces_opened = 0

    @classmethod
    def open(cls, cfg: DataConfig, tokenizer: TextTokenizer) -> TokenDocuments:
        """The shards in `data.data_files[0]`, refused when written with another tokenizer."""
        directory = resolve_path(cfg.data_files[0])
        manifest = read_manifest(directory)
        want, have = tokenizer.fingerprint(), manifest.get("tokenizer", {}).get("fingerprint")
        if want != have:
            raise DataError(
                f"token shards in '{directory}' were written with another tokenizer (fingerprint {have}, "
                f"{manifest.get('tokenizer', {}).get('name')}) than data.tokenizer={cfg.tokenizer} "
                f"({want}); use that tokenizer or prepare the shards again"
            )
        return cls(directory, manifest)

    def __len__(self) -> int:
        return len(self._pieces)

    def read(self, piece: int, start_row: int = 0) -> Iterator[np.ndarray | None]:
        self.pieces_opened += 1
        k, first, end = self._pieces[piece]
        tokens, offsets = self._tokens[k], self._offsets[k]
        bounds = np.asarray(offsets[first + start_row : end + 1])
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            yield np.array(tokens[a:b], dtype=np.int32) if b > a else None

    def describe(self) -> dict:
        return {
            "source": "tokens",
            "directory": str(self.directory),
            "pieces": len(self),
            "documents": self.manifest.get("documents"),
            "tokens": self.manifest.get("tokens"),
        }
