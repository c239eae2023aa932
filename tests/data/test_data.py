"""Tokenizers, the corpus by piece, packing, the validation set, the elastic per-shard loader state,
read-ahead, shuffling and pre-tokenised shards."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from data import (
    DataError,
    PackedLoader,
    TextDocuments,
    build_catalog,
    build_val_set,
    encode_documents,
    iter_documents,
    load_tokenizer,
    open_documents,
)
from data.sources.registry import source_of
from tests.conftest import CORPUS, GPT2_DIR, SP_MODEL, data_config


def write_jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def write_parquet(path, texts, rows_per_group: int):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": texts, "id": list(range(len(texts)))}), path, row_group_size=rows_per_group)
    return str(path)


def corpus_texts() -> list[str]:
    return [json.loads(line)["text"] for f in CORPUS for line in open(f)]


def loader_for(cfg, tok, rank=0, world=1, windows_per_step=8, docs=None):
    docs = docs or open_documents(cfg, tok)
    _, first = build_val_set(cfg, docs)
    return PackedLoader(cfg, docs, first, windows_per_step, rank=rank, world_size=world)


def test_gpt2_and_sentencepiece_tokenizers_load_locally():
    gpt2 = load_tokenizer(GPT2_DIR)
    assert gpt2.encode_batch(["Hello world"]) == [[15496, 995]]
    assert gpt2.eos_id == 50256 and gpt2.vocab_size == 50257
    sp = load_tokenizer(SP_MODEL)
    assert sp.encode_batch(["Hello world"]) == [[22557, 1526]]
    assert sp.eos_id == 2 and sp.vocab_size == 32000
    assert gpt2.fingerprint() == load_tokenizer(GPT2_DIR).fingerprint() != sp.fingerprint()


def test_missing_tokenizer_is_one_clear_error(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_tokenizer(str(tmp_path / "nope.json"))
    with pytest.raises(DataError, match="neither tokenizer.json nor tokenizer.model"):
        load_tokenizer(str(tmp_path))


def test_json_pieces_hold_every_line_once_whatever_the_piece_size(tmp_path):
    texts = [f"doc {i} " + "x" * (i * 37 % 300) for i in range(200)]
    path = write_jsonl(tmp_path / "c.jsonl", texts)
    for piece_bytes in (1024, 1500, 4096, 1 << 20):
        cfg = data_config(data_files=[path], piece_bytes=piece_bytes)
        assert [t for _, t in iter_documents(cfg)] == texts, piece_bytes


def test_packing_keeps_every_token_with_eos_between_documents(tmp_path, gpt2_tokenizer):
    texts = [f"document {i} " + "word " * (3 + 17 * i % 40) for i in range(30)]
    cfg = data_config(
        data_files=[write_jsonl(tmp_path / "c.jsonl", texts)],
        seq_len=16,
        logical_shards=1,
        val_tokens=16,
        encode_batch_docs=4,
        piece_bytes=1 << 20,
    )
    docs = open_documents(cfg, gpt2_tokenizer)
    _, (piece, row) = build_val_set(cfg, docs)
    assert piece == 0 and row > 0  # one piece: training starts inside it, right after the validation docs
    loader = PackedLoader(cfg, docs, (piece, row), windows_per_step=1)
    windows = [loader.next_step()[0] for _ in range(40)]
    assert all(w.shape == (17,) for w in windows)
    got = np.concatenate([windows[0].numpy()] + [w[1:].numpy() for w in windows[1:]])  # undo the overlap
    expected = np.concatenate(encode_documents(gpt2_tokenizer, texts[row:] + texts[row:]))  # epoch 2 skips val too
    assert np.array_equal(got, expected[: len(got)])
    assert (got == gpt2_tokenizer.eos_id).sum() == (expected[: len(got)] == gpt2_tokenizer.eos_id).sum() > 0


def test_validation_set_is_fixed_sized_and_disjoint_from_training(gpt2_tokenizer):
    cfg = data_config(seq_len=64, val_tokens=2048)
    docs = open_documents(cfg, gpt2_tokenizer)
    val_a, end_a = build_val_set(cfg, docs)
    val_b, end_b = build_val_set(cfg, open_documents(cfg, gpt2_tokenizer))
    assert torch.equal(val_a, val_b) and end_a == end_b
    assert val_a.shape == (2048 // 64, 65) and val_a[:, 1:].numel() == 2048
    first_train = next(d for d in docs.read(end_a[0], end_a[1]) if d is not None)
    val_tokens = set(map(tuple, val_a.numpy().tolist()))
    window = PackedLoader(cfg, docs, end_a, 4).next_step()[0].numpy()
    assert np.array_equal(window[: min(65, len(first_train))], first_train[:65])  # shard 0 starts there
    assert tuple(window.tolist()) not in val_tokens


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_at_any_step_continues_exactly(gpt2_tokenizer, shuffle):
    cfg = data_config(shuffle=shuffle, shuffle_buffer=8)
    a = loader_for(cfg, gpt2_tokenizer)
    steps = [a.next_step() for _ in range(14)]
    for k in (0, 3, 9):  # several positions, some after a shard wrapped around
        b = loader_for(cfg, gpt2_tokenizer)
        for _ in range(k):
            b.next_step()
        state = b.state_dict()
        c = loader_for(cfg, gpt2_tokenizer)
        c.load_rank_states([state])
        assert all(torch.equal(steps[j], c.next_step()) for j in range(k, 14)), (shuffle, k)


def test_shuffle_changes_the_order_not_the_data(gpt2_tokenizer):
    plain = loader_for(data_config(), gpt2_tokenizer)
    mixed = loader_for(data_config(shuffle=True, shuffle_buffer=4), gpt2_tokenizer)
    other = loader_for(data_config(shuffle=True, shuffle_buffer=4, seed=7), gpt2_tokenizer)
    a, b, c = (torch.cat([x.next_step() for _ in range(3)]) for x in (plain, mixed, other))
    assert not torch.equal(a, b) and not torch.equal(b, c)
    assert int((a == 50256).sum()) > 0


def test_a_step_has_the_same_windows_on_one_two_and_four_ranks_and_after_a_two_to_one_resume(gpt2_tokenizer):
    cfg = data_config(shuffle=True, shuffle_buffer=4)
    one = loader_for(cfg, gpt2_tokenizer)
    reference = [{tuple(r) for r in one.next_step().tolist()} for _ in range(8)]
    for world in (2, 4):
        ranks = [loader_for(cfg, gpt2_tokenizer, r, world) for r in range(world)]
        for step in range(8):
            parts = [ld.next_step() for ld in ranks]
            assert all(len(p) == 8 // world for p in parts)
            assert {tuple(r) for p in parts for r in p.tolist()} == reference[step], (world, step)
    two = [loader_for(cfg, gpt2_tokenizer, r, 2) for r in range(2)]
    for _ in range(3):
        for ld in two:
            ld.next_step()
    resumed = loader_for(cfg, gpt2_tokenizer)
    resumed.load_rank_states([ld.state_dict() for ld in two])
    for step in range(3, 8):
        assert {tuple(r) for r in resumed.next_step().tolist()} == reference[step], step


def test_each_rank_opens_only_its_own_pieces(gpt2_tokenizer):
    cfg = data_config()
    opened: dict[int, set[int]] = {}
    for rank in range(2):
        docs = open_documents(cfg, gpt2_tokenizer)
        _, first = build_val_set(cfg, docs)
        seen: set[int] = set()
        original = docs.read

        def read(piece, start_row=0, _seen=seen, _read=original):
            _seen.add(piece)
            return _read(piece, start_row)

        docs.read = read
        loader = PackedLoader(cfg, docs, first, 8, rank=rank, world_size=2)
        for _ in range(10):
            loader.next_step()
        loader.close()
        opened[rank] = seen
        assert all((p - first[0]) % cfg.logical_shards % 2 == rank for p in seen), (rank, seen)
    assert opened[0] and opened[1] and not opened[0] & opened[1]


def test_prefetch_depth_does_not_change_the_windows(gpt2_tokenizer):
    runs = []
    for depth in (0, 1, 4):
        loader = loader_for(data_config(prefetch_steps=depth, shuffle=True), gpt2_tokenizer)
        runs.append([loader.next_step() for _ in range(6)])
        runs[-1].append(loader.state_dict())
        loader.close()
    for other in runs[1:]:
        assert all(torch.equal(x, y) for x, y in zip(runs[0][:6], other[:6], strict=True))
        s0, s1 = runs[0][6]["shards"], other[6]["shards"]
        assert all(s0[s]["cursor"] == s1[s]["cursor"] and torch.equal(s0[s]["tokens"], s1[s]["tokens"]) for s in s0)


def test_resume_seeks_to_the_piece_instead_of_reading_from_the_start(gpt2_tokenizer):
    cfg = data_config(logical_shards=1, prefetch_steps=0)
    a = loader_for(cfg, gpt2_tokenizer, windows_per_step=4)
    for _ in range(150):
        a.next_step()
    saved = a.state_dict()["shards"][0]
    assert saved["cursor"] >= 4  # well into the corpus
    docs = open_documents(cfg, gpt2_tokenizer)
    b = loader_for(cfg, gpt2_tokenizer, windows_per_step=4, docs=docs)
    reads, original = [], docs.read
    docs.read = lambda piece, start_row=0: reads.append((piece, start_row)) or original(piece, start_row)
    b.load_rank_states([a.state_dict()])
    assert all(torch.equal(b.next_step(), a.next_step()) for _ in range(40))
    first_piece = b.shards[0].pieces[saved["cursor"]]
    assert reads and reads[0] == (first_piece, saved["row"])  # straight to the piece and row
    assert all(piece >= first_piece for piece, _ in reads)  # nothing before it is read again


def test_parquet_row_groups_are_pieces_and_read_like_json(tmp_path, gpt2_tokenizer):
    texts = corpus_texts()[:120]
    pq_files = [write_parquet(tmp_path / f"part{i}.parquet", texts[i * 60 : (i + 1) * 60], 7) for i in range(2)]
    js = write_jsonl(tmp_path / "all.jsonl", texts)
    pcfg = data_config(source="parquet", data_files=pq_files)
    assert len(build_catalog(pcfg)) == 2 * 9  # ceil(60 / 7) row groups per file
    assert [t for _, t in iter_documents(pcfg)] == texts == [t for _, t in iter_documents(data_config(data_files=[js]))]
    a = loader_for(pcfg, gpt2_tokenizer)
    for _ in range(5):
        a.next_step()
    b = loader_for(pcfg, gpt2_tokenizer)
    b.load_rank_states([a.state_dict()])
    assert all(torch.equal(a.next_step(), b.next_step()) for _ in range(4))


def test_token_shards_give_the_streaming_windows(tmp_path, gpt2_tokenizer):
    from data.prepare import prepare

    cfg = data_config(shuffle=True, shuffle_buffer=4)
    manifest = prepare(cfg, tmp_path / "tok", workers=1, progress=False)
    assert manifest["dtype"] == "uint16" and manifest["documents"] == 450
    tcfg = data_config(source="tokens", data_files=[str(tmp_path / "tok")], shuffle=True, shuffle_buffer=4)
    streamed, sharded = loader_for(cfg, gpt2_tokenizer), loader_for(tcfg, gpt2_tokenizer)
    v1, _ = build_val_set(cfg, open_documents(cfg, gpt2_tokenizer))
    v2, _ = build_val_set(tcfg, open_documents(tcfg, gpt2_tokenizer))
    assert torch.equal(v1, v2)
    for _ in range(12):
        assert torch.equal(streamed.next_step(), sharded.next_step())
    again = prepare(cfg, tmp_path / "tok", workers=1, progress=False)  # resumable: nothing to redo
    assert again == manifest


def test_token_shard_errors_are_one_clear_line(tmp_path, gpt2_tokenizer):
    from data.prepare import prepare

    cfg = data_config()
    out = tmp_path / "tok"
    prepare(cfg, out, workers=1, progress=False)
    tcfg = data_config(source="tokens", data_files=[str(out)])

    def error(config=tcfg, tok=gpt2_tokenizer) -> str:
        with pytest.raises(DataError) as err:
            open_documents(config, tok)
        assert "\n" not in str(err.value)
        return str(err.value)

    assert "another tokenizer" in error(tok=load_tokenizer(SP_MODEL))
    tokens = out / "00001.tokens"
    data = tokens.read_bytes()
    tokens.write_bytes(data[:-10])
    assert "truncated" in error()
    tokens.unlink()
    assert "is missing" in error()
    tokens.write_bytes(data)
    (out / "manifest.json").write_text("{not json")
    assert "not valid" in error()
    (out / "manifest.json").unlink()
    assert "data.prepare" in error()


def test_compressed_json_lines_are_one_piece_per_file_and_read_like_plain(tmp_path, gpt2_tokenizer):
    import bz2
    import gzip
    import lzma

    texts = corpus_texts()[:160]
    plain = [write_jsonl(tmp_path / f"part{i}.jsonl", texts[i * 40 : (i + 1) * 40]) for i in range(4)]
    packed = []
    for path, opener in zip(plain, (gzip.open, bz2.open, lzma.open, gzip.open), strict=True):
        suffix = {gzip.open: ".gz", bz2.open: ".bz2", lzma.open: ".xz"}[opener]
        with opener(path + suffix, "wb") as fh:
            fh.write(open(path, "rb").read())
        packed.append(path + suffix)
    ccfg = data_config(source="auto", data_files=packed)
    assert len(build_catalog(ccfg)) == 4  # a compressed stream cannot be entered mid-way: a file is a piece
    assert [t for _, t in iter_documents(ccfg)] == texts
    # Windows and an exact resume inside a file (the piece is decompressed from its start).
    a = loader_for(ccfg, gpt2_tokenizer)
    for _ in range(3):
        a.next_step()
    b = loader_for(ccfg, gpt2_tokenizer)
    b.load_rank_states([a.state_dict()])
    assert all(torch.equal(a.next_step(), b.next_step()) for _ in range(3))
    (tmp_path / "x.parquet.gz").write_bytes(b"")
    with pytest.raises(DataError, match="compressed parquet") as err:
        build_catalog(data_config(source="auto", data_files=[str(tmp_path / "x.parquet.gz")]))
    assert "\n" not in str(err.value)


HUB_README = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/*/*
- config_name: sample-10BT
  data_files:
  - split: train
    path: sample/10BT/*
---
"""


def test_a_hub_dataset_is_resolved_by_datasets_and_read_by_row_group(tmp_path, gpt2_tokenizer):
    """The hub path (`data.source=<dataset>`, `data.hub.subset=<config>`) offline: a local directory laid
    out like HuggingFaceFW/fineweb-edu (README configs, sample/10BT/*.parquet) goes through the same
    `datasets` resolution; the subset picks its files, each row group is a piece."""
    texts = corpus_texts()[:150]
    (tmp_path / "README.md").write_text(HUB_README)
    (tmp_path / "sample" / "10BT").mkdir(parents=True)
    (tmp_path / "data" / "CC-MAIN-2024-10").mkdir(parents=True)
    for i in range(3):
        write_parquet(tmp_path / "sample" / "10BT" / f"{i:03d}_00000.parquet", texts[i * 50 : (i + 1) * 50], 16)
    write_parquet(tmp_path / "data" / "CC-MAIN-2024-10" / "000_00000.parquet", ["not this config"] * 20, 16)
    cfg = data_config(source=str(tmp_path), subset="sample-10BT", data_files=[])
    catalog = build_catalog(cfg)
    assert len(catalog) == 3 * 4 and all("/sample/10BT/" in f.path for f in catalog.files)
    assert [t for _, t in iter_documents(cfg)] == texts
    loader = loader_for(cfg, gpt2_tokenizer)
    assert loader.next_step().shape == (8, 65)
    with pytest.raises(DataError, match="could not be opened") as err:
        build_catalog(data_config(source="HuggingFaceFW/fineweb-edu", subset="sample-10BT", data_files=[]))
    assert "\n" not in str(err.value) and "offline" in str(err.value)


def test_bad_corpora_give_one_clear_error(tmp_path, gpt2_tokenizer):
    with pytest.raises(DataError, match="not found"):
        list(iter_documents(data_config(data_files=[str(tmp_path / "missing.jsonl")])))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError):
        build_val_set(
            data_config(data_files=[str(empty)]), open_documents(data_config(data_files=[str(empty)]), gpt2_tokenizer)
        )
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "fine"}\n{"text": "bad \xff\xfe bytes"}\n')
    with pytest.raises(DataError, match="could not be decoded"):
        list(iter_documents(data_config(data_files=[str(bad)])))
    other = write_jsonl(tmp_path / "other.jsonl", ["a", "b"])
    with pytest.raises(DataError, match="no field 'body'"):
        list(iter_documents(data_config(data_files=[other], text_field="body")))
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1 this is not parquet PAR1")
    with pytest.raises(DataError, match="not a readable parquet file") as err:
        build_catalog(data_config(source="parquet", data_files=[str(corrupt)]))
    assert "\n" not in str(err.value)


def test_empty_documents_are_skipped_but_keep_their_index(tmp_path, caplog):
    path = write_jsonl(tmp_path / "c.jsonl", ["one", "", "   ", "four"])
    docs = list(iter_documents(data_config(data_files=[path])))
    assert docs == [(0, "one"), (3, "four")]
    assert "skipping empty" in caplog.text


def test_lone_surrogates_are_skipped_one_document_at_a_time(gpt2_tokenizer, caplog):
    out = encode_documents(gpt2_tokenizer, ["good", "bad \ud800 text", "also good"])
    assert out[1] is None and out[0] is not None and out[2] is not None
    assert "skipping a document" in caplog.text


def test_too_few_pieces_for_the_shards(tmp_path, gpt2_tokenizer):
    path = write_jsonl(tmp_path / "c.jsonl", ["word " * 200, "x y z", "a b c"])
    cfg = data_config(data_files=[path], seq_len=16, val_tokens=16, logical_shards=4)
    docs = TextDocuments(cfg, gpt2_tokenizer, source_of(cfg))
    _, first = build_val_set(cfg, docs)
    with pytest.raises(DataError, match="fewer than data.logical_shards"):
        PackedLoader(cfg, docs, first, 8)


def test_a_resume_over_a_corpus_that_changed_since_is_refused_in_one_line(tmp_path, gpt2_tokenizer):
    """A checkpoint's shard positions address pieces by index: over a corpus with other pieces (a
    hub dataset's new revision, a file added) they would point elsewhere, silently."""
    a = loader_for(data_config(), gpt2_tokenizer)
    a.next_step()
    more = write_jsonl(tmp_path / "more.jsonl", corpus_texts()[:40])
    b = loader_for(data_config(data_files=[*CORPUS, more]), gpt2_tokenizer)
    with pytest.raises(DataError, match="data changed since") as err:
        b.load_rank_states([a.state_dict()])
    assert "\n" not in str(err.value) and "data.hub.revision" in str(err.value) and "source=json" in str(err.value)
    c = loader_for(data_config(), gpt2_tokenizer)
    c.load_rank_states([a.state_dict()])  # the same corpus resumes
    old = {k: v for k, v in a.state_dict().items() if k != "pieces"}  # a checkpoint from before the check
    c.load_rank_states([old])


def test_the_prepare_tool_reads_a_source_s_own_keys_and_names_a_moved_one() -> None:
    """`python -m data.prepare` reads the data section as a run does: `data.hub.subset=...` sets the
    Hub source's section; a key that lives in a source's section now is named there in one line."""
    from data.prepare import _data_config
    from data.sources.hub import HubOptions

    cfg = _data_config(None, ["data.source=HuggingFaceFW/fineweb-edu", "data.hub.subset=sample-10BT"])
    assert cfg.own(HubOptions).subset == "sample-10BT" and cfg.source == "HuggingFaceFW/fineweb-edu"
    with pytest.raises(DataError, match=r"^the data section has no key 'subset'; write data.hub.subset$"):
        _data_config(None, ["data.subset=sample-10BT"])
    with pytest.raises(DataError, match=r"^data.hub takes a mapping of .*retries.*; got \{'retires': 3\}$"):
        _data_config(None, ["data.hub.retires=3"])
