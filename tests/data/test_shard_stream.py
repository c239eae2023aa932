"""One logical shard's stream at its edges: a resume that sits exactly at the end of a row group
reads no byte of that group, and the lines that say a shard repeats its data count its passes the
same way everywhere."""

from __future__ import annotations

import io
import logging
import re

import numpy as np

from data import PackedLoader, open_documents
from data.shard_stream import ShardStream
from tests.conftest import data_config
from tests.data.test_data import write_parquet

WIDTH = 9  # seq_len 8, +1


def test_a_resume_at_the_end_of_a_row_group_reads_none_of_that_group(tmp_path, gpt2_tokenizer, monkeypatch):
    import pyarrow.parquet as pq

    import data.stream

    texts = [f"document {i} " + "word " * 15 for i in range(8)]  # ~20 tokens each: several windows per row
    path = write_parquet(tmp_path / "c.parquet", texts, rows_per_group=2)
    docs = open_documents(data_config(source="parquet", data_files=[path]), gpt2_tokenizer)
    stream = ShardStream(0, [0, 1, 2, 3], docs, (0, 0), False, 0, 0)
    while (snap := stream.snapshot())["cursor"] != 1 or snap["row"] != 2:  # row 2 of 2 of row group 1
        stream.next_window(WIDTH)
    expected = [stream.next_window(WIDTH) for _ in range(12)]

    starts: list[int] = []  # where each read pyarrow makes begins: a row group's read starts inside its column chunk

    class Recording(io.FileIO):
        def read(self, size: int = -1) -> bytes:
            starts.append(self.tell())
            return super().read(size)

    monkeypatch.setattr(data.stream, "_open", lambda p, mode="rb": Recording(p, mode))
    resumed = ShardStream(0, [0, 1, 2, 3], docs, (0, 0), False, 0, 0)
    resumed.load(ShardStream.to_saved(snap))
    got = [resumed.next_window(WIDTH) for _ in range(12)]
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))

    def chunk(group: int) -> range:
        col = pq.ParquetFile(path).metadata.row_group(group).column(0)
        first = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
        return range(first, first + col.total_compressed_size)

    assert any(s in chunk(2) for s in starts)  # the next group was read, so the reads are seen
    assert not any(s in chunk(1) for s in starts), "a resume read the row group it had finished"


class Pieces:
    """Documents held in memory: piece p is `rows[p]` (token arrays)."""

    def __init__(self, rows: list[list[np.ndarray]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def read(self, piece: int, start_row: int = 0):
        yield from self.rows[piece][start_row:]

    def describe(self) -> dict:
        return {"source": "memory"}


PASS_LINE = re.compile(
    r"data: logical shard (\d+) begins pass (\d+) over its documents \(the run sees training data again\); "
    r"this rank's logical shards past their first pass: (\d+) of (\d+), fewest passes: (\d+)$"
)


def test_the_lines_that_say_shards_repeat_their_data_count_passes_consistently(caplog):
    # 4 shards of 2 pieces each, of different lengths, so that they wrap around at different steps.
    rows = [[np.arange(5 + 3 * p + r, dtype=np.int64) for r in range(2 + p % 3)] for p in range(8)]
    cfg = data_config(seq_len=8, logical_shards=4, prefetch_steps=0, val_tokens=8)
    loader = PackedLoader(cfg, Pieces(rows), (0, 0), windows_per_step=4)
    seen: list[tuple[str, dict[int, int]]] = []  # each line, with every shard's passes when it was said

    class Witness(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append((record.getMessage(), {s: sh.epoch + 1 for s, sh in loader.shards.items()}))

    logger = logging.getLogger("orscale.data")
    logger.addHandler(witness := Witness(logging.INFO))
    try:
        with caplog.at_level(logging.INFO, logger="orscale.data"):
            for _ in range(60):
                loader.next_step()
            again = PackedLoader(cfg, Pieces(rows), (0, 0), windows_per_step=4)  # a resume: no line said twice
            again.load_rank_states([loader.state_dict()])
            loader = again
            for _ in range(20):
                again.next_step()
    finally:
        logger.removeHandler(witness)
    lines = [(PASS_LINE.match(m), passes) for m, passes in seen if "pass" in m or "wrap" in m or "epoch" in m]
    assert lines and all(match for match, _ in lines), [m for m, _ in seen]
    for match, passes in lines:
        shard, began, past, of, fewest = map(int, match.groups())
        assert passes[shard] == began  # the shard named is in the pass the line names
        assert (past, of, fewest) == (sum(p > 1 for p in passes.values()), len(passes), min(passes.values()))
    assert [int(m.group(2)) for m, _ in lines] == list(range(2, 2 + len(lines)))  # one line per new pass, from 2
    assert max(sh.epoch for sh in loader.shards.values()) + 1 == int(lines[-1][0].group(2)) > 3
