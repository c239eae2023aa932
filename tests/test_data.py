"""Tokenizers, the document stream, packing, the validation set and the loader state."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from data import DataError, PackedLoader, build_val_set, encode_documents, iter_documents, load_tokenizer
from tests.conftest import GPT2_DIR, SP_MODEL, data_config


def write_jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def test_gpt2_and_sentencepiece_tokenizers_load_locally():
    gpt2 = load_tokenizer(GPT2_DIR)
    assert gpt2.encode_batch(["Hello world"]) == [[15496, 995]]
    assert gpt2.eos_id == 50256 and gpt2.vocab_size == 50257
    sp = load_tokenizer(SP_MODEL)
    assert sp.encode_batch(["Hello world"]) == [[22557, 1526]]
    assert sp.eos_id == 2 and sp.vocab_size == 32000


def test_missing_tokenizer_is_one_clear_error(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_tokenizer(str(tmp_path / "nope.json"))
    with pytest.raises(DataError, match="neither tokenizer.json nor tokenizer.model"):
        load_tokenizer(str(tmp_path))


def _reconstruct(windows: list[torch.Tensor]) -> np.ndarray:
    """Consecutive windows of one shard overlap by one token; undo that."""
    parts = [windows[0].numpy()] + [w[1:].numpy() for w in windows[1:]]
    return np.concatenate(parts)


def test_packing_keeps_every_token_with_eos_between_documents(tmp_path, gpt2_tokenizer):
    texts = [f"document {i} " + "word " * (3 + 17 * i % 40) for i in range(30)]
    cfg = data_config(data_files=[write_jsonl(tmp_path / "c.jsonl", texts)], seq_len=16, logical_shards=1,
                      val_tokens=16, encode_batch_docs=4)
    val, used = build_val_set(cfg, gpt2_tokenizer)
    loader = PackedLoader(cfg, gpt2_tokenizer, first_doc=used)
    n_windows = 40
    windows = [loader.next_batch(1)[0] for _ in range(n_windows)]
    assert all(w.shape == (17,) for w in windows)
    got = _reconstruct(windows)
    expected = np.concatenate(encode_documents(gpt2_tokenizer, texts[used:] + texts[used:]))
    assert np.array_equal(got, expected[: len(got)])
    # Every document is followed by exactly one EOS, and no document contains one.
    assert (got == gpt2_tokenizer.eos_id).sum() == (expected[: len(got)] == gpt2_tokenizer.eos_id).sum() > 0


def test_validation_set_is_fixed_sized_and_disjoint_from_training(gpt2_tokenizer):
    cfg = data_config(seq_len=64, val_tokens=2048)
    val_a, used_a = build_val_set(cfg, gpt2_tokenizer)
    val_b, used_b = build_val_set(cfg, gpt2_tokenizer)
    assert torch.equal(val_a, val_b) and used_a == used_b
    assert val_a.shape == (2048 // 64, 65)
    assert val_a[:, 1:].numel() == 2048  # the configured token count, exactly
    loader = PackedLoader(cfg, gpt2_tokenizer, first_doc=used_a)
    first_train_doc = next(iter_documents(cfg, used_a))[0]
    assert first_train_doc >= used_a
    # Training draws only from documents at index >= used: check the first window's tokens.
    window = loader.next_batch(1)[0].numpy()
    train_doc_ids = encode_documents(gpt2_tokenizer, [next(iter_documents(cfg, used_a))[1]])[0]
    assert np.array_equal(window[: min(65, len(train_doc_ids))], train_doc_ids[:65])


def test_loader_resume_continues_exactly(gpt2_tokenizer):
    cfg = data_config()
    _, used = build_val_set(cfg, gpt2_tokenizer)
    a = PackedLoader(cfg, gpt2_tokenizer, used)
    for _ in range(7):
        a.next_batch(3)
    state = a.state_dict()
    expected = [a.next_batch(3) for _ in range(5)]
    b = PackedLoader(cfg, gpt2_tokenizer, used)
    b.load_state_dict(state)
    assert all(torch.equal(x, b.next_batch(3)) for x in expected)


def test_loader_state_saved_on_two_ranks_resumes_on_one_with_each_window_once(gpt2_tokenizer):
    cfg = data_config(logical_shards=4)
    _, used = build_val_set(cfg, gpt2_tokenizer)
    reference = PackedLoader(cfg, gpt2_tokenizer, used)
    ranks = [PackedLoader(cfg, gpt2_tokenizer, used, rank=r, world_size=2) for r in range(2)]
    seen = [ranks[r].next_batch(2) for _ in range(5) for r in range(2)]
    merged = {"turn": 0, "shards": {**ranks[0].state_dict()["shards"], **ranks[1].state_dict()["shards"]}}
    resumed = PackedLoader(cfg, gpt2_tokenizer, used)
    resumed.load_state_dict(merged)
    after = [resumed.next_batch(4) for _ in range(5)]
    # Per logical shard, the windows of part 1 then part 2 equal the uninterrupted shard stream.
    total = 20 + 20
    ref = [reference.next_batch(1)[0] for _ in range(total + 8)]
    ref_rows = {tuple(r.tolist()) for r in ref}
    got_rows = [tuple(r.tolist()) for b in seen + after for r in b]
    assert len(got_rows) == len(set(got_rows)) == total, "a window was repeated"
    assert set(got_rows) <= ref_rows, "a window was invented or a token skipped"


def test_bad_corpora_give_one_clear_error(tmp_path, gpt2_tokenizer):
    with pytest.raises(DataError, match="not found"):
        list(iter_documents(data_config(data_files=[str(tmp_path / "missing.jsonl")])))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError):
        build_val_set(data_config(data_files=[str(empty)]), gpt2_tokenizer)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "fine"}\n{"text": "bad \xff\xfe bytes"}\n')
    with pytest.raises(DataError, match="could not be decoded"):
        list(iter_documents(data_config(data_files=[str(bad)])))
    other = write_jsonl(tmp_path / "other.jsonl", ["a", "b"])
    with pytest.raises(DataError, match="no field 'body'"):
        list(iter_documents(data_config(data_files=[other], text_field="body")))


def test_empty_documents_are_skipped_but_keep_their_index(tmp_path, caplog):
    path = write_jsonl(tmp_path / "c.jsonl", ["one", "", "   ", "four"])
    docs = list(iter_documents(data_config(data_files=[path])))
    assert docs == [(0, "one"), (3, "four")]
    assert "skipping empty" in caplog.text


def test_lone_surrogates_are_skipped_one_document_at_a_time(gpt2_tokenizer, caplog):
    out = encode_documents(gpt2_tokenizer, ["good", "bad \ud800 text", "also good"])
    assert out[1] is None and out[0] is not None and out[2] is not None
    assert "skipping a document" in caplog.text


def test_too_few_training_documents_for_the_shards(tmp_path, gpt2_tokenizer):
    path = write_jsonl(tmp_path / "c.jsonl", ["word " * 200, "x y z", "a b c"])
    cfg = data_config(data_files=[path], seq_len=16, val_tokens=16, logical_shards=4)
    _, used = build_val_set(cfg, gpt2_tokenizer)
    with pytest.raises(DataError, match="fewer than data.logical_shards"):
        PackedLoader(cfg, gpt2_tokenizer, used).next_batch(8)
