"""The reading layer of the data path: a corpus as files cut into *pieces*, each read on its own.

A corpus is a list of files (which ones is its source's business: `data/sources/`); each file is cut
into pieces that can be read with no index and no read of what comes before:
  * parquet: one piece per row group (from the file's footer);
  * JSON Lines (and any line-based text format): one piece per `data.piece_bytes` bytes; a piece
    holds the rows that *start* in its byte range (a row straddling the end belongs to the piece
    it starts in);
  * compressed JSON Lines (`.gz`, `.bz2`, `.xz`; `.zst` with the `zstandard` package): one piece
    per file, since a compressed stream cannot be entered in the middle (a resume inside it
    decompresses from the file's start; the data path's unit of parallelism is then the file).
A document's address is (piece, row within the piece), so a reader opens exactly the pieces it
needs and a resume seeks instead of re-reading (`data.sources.registry.read_texts(piece, cfg, start_row)`).
"""

from __future__ import annotations

import bisect
import bz2
import contextlib
import gzip
import json
import lzma
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from data.data_errors import DataError, first_line
from data.notices import Notices

if TYPE_CHECKING:  # data.hub_http imports httpx2: only runs that read the Hub (or fail) import it
    from data.hub_http import HubReadError


COMPRESSED = (".gz", ".bz2", ".xz", ".zst")
PARQUET_BATCH_ROWS = 1024  # rows per pyarrow batch inside a row group (bounds memory on big groups)


@dataclass(frozen=True)
class Piece:
    index: int  # position in the corpus's published order
    path: str
    kind: str  # how its rows are read: "parquet", "json", or another source's line-based kind
    unit: int  # row group, or byte block of `piece_bytes`
    start: int  # byte range [start, end) for line-based files; 0 for parquet
    end: int


@dataclass(frozen=True)
class CorpusFile:
    path: str
    kind: str
    units: int  # pieces in this file
    size: int  # bytes (line-based files)
    row_groups: bool = False  # its pieces are its row groups (parquet), not byte ranges


def hub_failure(err: BaseException) -> HubReadError | None:
    """The `HubReadError` behind `err` (libraries re-raise it as their own errors), if any."""
    from data.hub_http import HubReadError

    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, HubReadError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    return None


def compression(path: str) -> str | None:
    """The compression suffix of `path` (".gz", ...), or None."""
    return next((s for s in COMPRESSED if path.endswith(s)), None)


def _open(path: str, mode: str = "rb"):
    """Local path or fsspec URL (hf://... through huggingface_hub's file system). Remote files are
    read without fsspec's read-ahead: each pyarrow read (a footer, a row group's column chunk) is
    then exactly one ranged request, retried on its own (`data/hub_http.py`)."""
    if "://" in path:
        from fsspec.core import url_to_fs

        fs, inner = url_to_fs(path)
        return fs.open(inner, mode, cache_type="none")
    return open(path, mode)


def _open_text_stream(path: str):
    """A binary reader of the decompressed bytes of a compressed JSON Lines file."""
    kind = compression(path)
    if kind == ".zst":
        try:
            import zstandard
        except ImportError:
            raise DataError(
                f"data file '{path}' is zstd-compressed: pip install zstandard (or decompress it)"
            ) from None
        import io

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(_open(path)))
    openers: dict[str | None, Any] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
    return openers[kind](_open(path))


def _read_failure(path: str, where: str, err: BaseException) -> DataError:
    """The one line for a read that failed: after its retries (which request, its last status),
    or because the bytes are not what they should be."""
    failed = hub_failure(err)
    if failed is not None:
        return DataError(
            f"data file '{path}' {where} could not be read: {failed.status} after {failed.attempts} attempts "
            f"({failed.method} {failed.url}); the Hub is down or rate-limiting: the same command resumes from "
            "the last checkpoint (data.hub.retries sets the budget)"
        )
    return DataError(f"data file '{path}' {where} could not be read: {first_line(err)}")


_FOOTERS: dict[str, Any] = {}  # remote file -> its parquet metadata: a piece's read is then one request
_FOOTERS_KEPT = 64  # shards move through the files together; a footer can be ~MBs for thousands of row groups


@contextlib.contextmanager
def _parquet_file(path: str) -> Iterator[Any]:
    """A `pyarrow.parquet.ParquetFile` over a handle that is closed when the block ends."""
    import pyarrow.parquet as pq

    with _open(path) as fh:
        try:
            pf = pq.ParquetFile(fh, metadata=_FOOTERS.get(path))
        except Exception as err:
            if hub_failure(err) is not None:
                raise _read_failure(path, "footer", err) from None
            raise DataError(f"data file '{path}' is not a readable parquet file: {first_line(err)}") from None
        if "://" in path and path not in _FOOTERS:
            if len(_FOOTERS) >= _FOOTERS_KEPT:
                _FOOTERS.pop(next(iter(_FOOTERS)))
            _FOOTERS[path] = pf.metadata
        yield pf


def describe_parquet(path: str) -> CorpusFile:
    """A parquet file, one piece per row group (from its footer)."""
    with _parquet_file(path) as pf:
        return CorpusFile(path, "parquet", pf.metadata.num_row_groups, 0, row_groups=True)


def describe_file(path: str, kind: str, piece_bytes: int) -> CorpusFile:
    """A line-based file of `kind`, one piece per `piece_bytes` bytes (a compressed one: one piece)."""
    size = os.path.getsize(path)
    if compression(path):
        return CorpusFile(path, kind, 1, size)  # one piece: the whole stream
    return CorpusFile(path, kind, -(-size // piece_bytes), size)


class Catalog:
    """Every piece of a corpus in published order, without holding one object per piece."""

    def __init__(self, files: list[CorpusFile], piece_bytes: int) -> None:
        self.files, self.piece_bytes = files, piece_bytes
        self._first = [0]
        for f in files:
            self._first.append(self._first[-1] + f.units)

    def __len__(self) -> int:
        return self._first[-1]

    def __getitem__(self, index: int) -> Piece:
        if not 0 <= index < len(self):
            raise IndexError(index)
        k = bisect.bisect_right(self._first, index) - 1
        f, unit = self.files[k], index - self._first[k]
        if f.row_groups:
            return Piece(index, f.path, f.kind, unit, 0, 0)
        if compression(f.path):
            return Piece(index, f.path, f.kind, 0, 0, f.size)
        start = unit * self.piece_bytes
        return Piece(index, f.path, f.kind, unit, start, min(start + self.piece_bytes, f.size))

    def describe(self) -> dict:
        out: dict = {"files": len(self.files), "pieces": len(self), "piece_bytes": self.piece_bytes}
        pinned = re.match(r"hf://datasets/[^@]+@([^/]+)/", self.files[0].path) if self.files else None
        if pinned:  # the hub commit read: data.hub.revision=<it> reads the same files in a later run
            out["revision"] = pinned.group(1)
        return out


def _json_lines(piece: Piece) -> Iterator[bytes]:
    """The lines that start in [start, end): skip the partial first line unless at the file start.
    A compressed file is one piece: all of its lines."""
    if compression(piece.path):
        with _open_text_stream(piece.path) as fh:
            yield from fh
        return
    with _open(piece.path) as fh:
        if piece.start > 0:
            fh.seek(piece.start - 1)
            fh.readline()  # the end of the line that started before this piece (or just its newline)
        while fh.tell() < piece.end:
            line = fh.readline()
            if not line:
                return
            yield line


def _decode_json(line: bytes, piece: Piece, row: int, text_field: str) -> object:
    if not line.strip():
        return None  # a blank line is an empty document: it keeps its row number
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, ValueError) as err:
        raise DataError(
            f"data file '{piece.path}' could not be decoded near byte {piece.start} (row {row} of piece "
            f"{piece.unit}): {first_line(err)}; fix or remove that line"
        ) from None
    if not isinstance(record, dict):
        raise DataError(f"data file '{piece.path}' row {row} of piece {piece.unit} is not a JSON object")
    if text_field not in record:
        raise DataError(
            f"data file '{piece.path}' has no field '{text_field}' (fields: {', '.join(record)}); set data.text_field"
        )
    return record[text_field]


def json_rows(piece: Piece, text_field: str, start_row: int) -> Iterator[object]:
    """The `text_field` of each row of a JSON Lines piece from row `start_row` on (None for a blank line)."""
    lines = _json_lines(piece)
    for _ in range(start_row):
        if next(lines, None) is None:
            return
    for i, line in enumerate(lines):
        yield _decode_json(line, piece, start_row + i, text_field)


def parquet_rows(piece: Piece, text_field: str, start_row: int) -> Iterator[object]:
    """The `text_field` column of a parquet piece (one row group) from row `start_row` on."""
    with _parquet_file(piece.path) as pf:  # closed when the rows are read (or the reader is dropped)
        if text_field not in pf.schema_arrow.names:
            raise DataError(
                f"data file '{piece.path}' has no field '{text_field}' "
                f"(fields: {', '.join(pf.schema_arrow.names)}); set data.text_field"
            )
        if start_row >= pf.metadata.row_group(piece.unit).num_rows:
            return  # a resume at the group's end: the footer says so, reading the group would download it whole
        skipped = 0
        try:
            for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=[piece.unit], columns=[text_field]):
                if skipped + batch.num_rows <= start_row:  # a resume seeks by whole batches
                    skipped += batch.num_rows
                    continue
                yield from batch.column(0).to_pylist()[max(0, start_row - skipped) :]
                skipped += batch.num_rows
        except DataError:
            raise
        except Exception as err:
            raise _read_failure(piece.path, f"row group {piece.unit}", err) from None


def kept_texts(rows: Iterator[object], piece: Piece, start_row: int, notices: Notices) -> Iterator[str | None]:
    """Each of `rows` (from row `start_row` of `piece`) as its text, or None for a row that is empty
    or not text (skipped with a warning, said once per `notices` and then counted, but it keeps its
    row number)."""
    for row, text in enumerate(rows, start_row):
        if isinstance(text, str) and text.strip():
            yield text
        else:
            notices(
                "data: skipped empty or non-text documents",
                "data: skipping empty or non-text document (piece %d, row %d)",
                piece.index,
                row,
            )
            yield None
