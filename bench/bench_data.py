"""Data stream throughput: stream -> tokenise -> pack, against raw `tokenizers.encode_batch`.

    python bench/bench_data.py [--repeat 4]

Prints tokens/s for both on the same documents (the bundled corpus, repeated) and their ratio
(target >= 0.8). Prints only; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from data import PackedLoader, iter_documents, load_tokenizer  # noqa: E402
from data import DataConfig  # noqa: E402

CORPUS = ["assets/corpus/fineweb_edu_sample10BT_first150.jsonl", "assets/corpus/fineweb_sample10BT_first300.jsonl"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=4, help="copies of the corpus in the benchmark file")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-docs", type=int, default=256)
    args = parser.parse_args()

    texts = [json.loads(line)["text"] for f in CORPUS for line in (ROOT / f).read_text().splitlines()]
    texts = texts * args.repeat
    tmp = Path(tempfile.mkdtemp()) / "corpus.jsonl"
    tmp.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cfg = DataConfig(source="json", data_files=[str(tmp)], seq_len=args.seq_len, logical_shards=1,
                     encode_batch_docs=args.batch_docs, tokenizer="assets/tokenizers/gpt2")
    tok = load_tokenizer(cfg.tokenizer)

    # Raw tokenizer on in-memory text, same batch size.
    t0 = time.perf_counter()
    raw_tokens = sum(len(ids) for i in range(0, len(texts), args.batch_docs)
                     for ids in tok.encode_batch(texts[i:i + args.batch_docs]))
    raw_s = time.perf_counter() - t0

    # Full pipeline: datasets streaming from the jsonl file, tokenise, pack into windows.
    # Untimed: the one-time `import datasets` and builder set-up; every token below is timed.
    next(iter_documents(cfg))
    loader = PackedLoader(cfg, tok, first_doc=0)
    windows = int(0.9 * raw_tokens) // args.seq_len  # stays inside one epoch (read-ahead included)
    t0 = time.perf_counter()
    for _ in range(windows):
        loader.next_batch(1)
    pipe_s = time.perf_counter() - t0
    pipe_tokens = windows * args.seq_len

    raw_tps, pipe_tps = raw_tokens / raw_s, pipe_tokens / pipe_s
    print(f"documents: {len(texts)}, tokens: {raw_tokens}")
    print(f"raw encode_batch:         {raw_tps:,.0f} tokens/s")
    print(f"stream->tokenise->pack:   {pipe_tps:,.0f} tokens/s")
    print(f"ratio (target >= 0.8):    {pipe_tps / raw_tps:.3f}")


if __name__ == "__main__":
    main()
