"""Plain text files (`data.source=text`, `data.data_files=[a directory, a file or a glob]`): UTF-8
`.txt` files whose documents are separated by blank lines (docs/data.md, "Plain text files").

A directory gives every `*.txt` file under it, at any depth, in path order; a file or a glob
(`corpus/**/*.txt`) gives the files it names. A document is a run of non-blank lines (a line of only
whitespace is blank), without the newline that ends its last line; a file with no blank line is one
document. Each file is cut into pieces of `data.piece_bytes` bytes, and a piece holds the documents
whose first line starts in its byte range, as JSON Lines pieces hold their lines (data/stream.py).
"""

from __future__ import annotations

import glob
from collections.abc import Iterator
from typing import BinaryIO

from data.data_config import DataConfig
from data.data_errors import DataError, first_line
from data.paths import resolve_path
from data.sources.base import Source
from data.stream import Catalog, Piece, compression, describe_file

_SCAN_BYTES = 1 << 16  # how far back a piece looks at a time for the start of the line it begins in


def text_files(cfg: DataConfig) -> list[str]:
    """The files `data.data_files` names, in order; a one-line error for one that names none."""
    files: list[str] = []
    for spec in cfg.data_files:
        path = resolve_path(spec)
        if path.is_dir():
            matches = sorted(str(p) for p in path.rglob("*.txt") if p.is_file())
        else:
            matches = sorted(p for p in glob.glob(str(path), recursive=True) if not resolve_path(p).is_dir())
        if not matches:
            raise DataError(
                f"data file '{spec}' names no text files (data.source=text reads a directory of .txt files, "
                "a file, or a glob such as 'corpus/*.txt'); check data.data_files"
            )
        for match in matches:
            if compression(match):
                raise DataError(f"data file '{match}' is compressed: data.source=text reads plain UTF-8; decompress it")
        files += matches
    return files


def _line_start(fh: BinaryIO, pos: int) -> int:
    """The offset where the line that holds byte `pos` begins."""
    end = pos
    while end > 0:
        lo = max(0, end - _SCAN_BYTES)
        fh.seek(lo)
        cut = fh.read(end - lo).rfind(b"\n")
        if cut >= 0:
            return lo + cut + 1
        end = lo
    return 0


def _decode(lines: list[bytes], piece: Piece, at: int) -> str:
    try:
        return b"".join(lines).decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as err:
        raise DataError(
            f"data file '{piece.path}' is not UTF-8 in the document at byte {at}: {first_line(err)}; "
            "convert the file to UTF-8"
        ) from None


def _documents(piece: Piece) -> Iterator[str]:
    """The documents whose first line starts in `piece`'s byte range [start, end)."""
    with open(piece.path, "rb") as fh:
        after_blank = True  # a document begins at a non-blank line that follows a blank one, or the file's start
        if piece.start > 0:
            fh.seek(_line_start(fh, piece.start - 1))
            after_blank = not fh.readline().strip()  # the line that holds the byte before this piece
        lines: list[bytes] = []
        first = 0
        while True:
            at, line = fh.tell(), fh.readline()
            if line.strip():
                if not lines and after_blank:
                    if at >= piece.end:
                        return  # the next document is the next piece's
                    first = at
                if lines or after_blank:  # else: the rest of a document that began before this piece
                    lines.append(line)
                after_blank = False
                continue
            if lines:
                yield _decode(lines, piece, first)
                lines = []
            if not line:
                return
            after_blank = True


class TextFiles(Source):
    names = ("text",)
    kinds = ("text",)
    document_keys = ("data.data_files",)  # a document is a run of lines: no field to name

    def check(self, cfg: DataConfig) -> None:
        if not cfg.data_files:
            raise DataError(
                "data.source=text needs data.data_files: a directory of .txt files, a file, or a glob "
                "such as ['corpus/*.txt']"
            )

    def catalog(self, cfg: DataConfig) -> Catalog:
        return Catalog([describe_file(p, "text", cfg.piece_bytes) for p in text_files(cfg)], cfg.piece_bytes)

    def read_rows(self, piece: Piece, cfg: DataConfig, start_row: int) -> Iterator[object]:
        documents = _documents(piece)
        for _ in range(start_row):
            if next(documents, None) is None:
                return
        yield from documents
