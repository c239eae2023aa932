"""`data.source=text`: plain .txt files, documents separated by blank lines, cut into byte pieces
that each hold the documents starting in them; a short training run on a directory of them."""

from __future__ import annotations

import json

import pytest
import torch

from data import DataError, build_catalog, build_val_set, iter_documents, open_documents
from launch.loop import main as train_main
from tests.conftest import data_config
from tests.data.test_data import corpus_texts, loader_for
from tests.helpers import TINY
from tests.launch.test_train import FAST


def write_texts(directory, n_files: int, docs_per_file: int) -> list[str]:
    """Files of the bundled corpus's documents, each on one line or folded over several, separated
    by one or more blank lines (some holding spaces); returns the documents in order."""
    directory.mkdir(parents=True, exist_ok=True)
    texts, docs = corpus_texts(), []
    for k in range(n_files):
        parts = []
        for i in range(docs_per_file):
            words = texts[k * docs_per_file + i].split()
            doc = " ".join(words) if i % 3 else "\n".join(" ".join(words[j : j + 12]) for j in range(0, len(words), 12))
            docs.append(doc)
            parts.append(doc + ["\n\n", "\n\n\n", "\n   \n\t\n"][i % 3])
        (directory / f"part{k:02d}.txt").write_text("".join(parts))
    return docs


def test_each_document_is_read_once_whatever_the_piece_size(tmp_path, gpt2_tokenizer):
    docs = write_texts(tmp_path / "corpus", 3, 20)
    (tmp_path / "corpus" / "notes.md").write_text("not a .txt file: not read")
    for piece_bytes in (1024, 3000, 1 << 20):
        cfg = data_config(source="text", data_files=[str(tmp_path / "corpus")], piece_bytes=piece_bytes)
        assert [t for _, t in iter_documents(cfg)] == docs, piece_bytes
    cfg = data_config(source="text", data_files=[str(tmp_path / "corpus" / "part0*.txt")], piece_bytes=1024)
    assert len(build_catalog(cfg)) > 3 * 4 and [t for _, t in iter_documents(cfg)] == docs
    # The loader's windows resume exactly inside a piece, as for any source.
    a = loader_for(cfg, gpt2_tokenizer)
    for _ in range(3):
        a.next_step()
    b = loader_for(cfg, gpt2_tokenizer)
    b.load_rank_states([a.state_dict()])
    assert all(torch.equal(a.next_step(), b.next_step()) for _ in range(3))


def test_a_file_without_blank_lines_is_one_document_and_bad_input_is_one_line(tmp_path):
    (tmp_path / "one.txt").write_text("first line\nsecond line\n")
    assert [t for _, t in iter_documents(data_config(source="text", data_files=[str(tmp_path / "one.txt")]))] == [
        "first line\nsecond line"
    ]
    (tmp_path / "empty").mkdir()
    for spec in (tmp_path / "empty", tmp_path / "empty" / "*.txt"):
        with pytest.raises(DataError, match="names no text files") as err:
            build_catalog(data_config(source="text", data_files=[str(spec)]))
        assert "\n" not in str(err.value)
    with pytest.raises(DataError, match="data.source=text needs data.data_files"):
        data_config(source="text", data_files=[])
    (tmp_path / "bad.txt").write_bytes(b"fine\n\nbad \xff\xfe bytes\n")
    with pytest.raises(DataError, match="is not UTF-8 in the document at byte 6"):
        list(iter_documents(data_config(source="text", data_files=[str(tmp_path / "bad.txt")])))


def test_a_text_corpus_without_documents_names_its_own_setting(tmp_path, gpt2_tokenizer):
    """Files of blank lines only: the one line names what chooses a text corpus's documents (its files;
    a .txt file has no text field) and says what was read in words, not as a dict."""
    (tmp_path / "blank.txt").write_text("\n\n   \n")
    cfg = data_config(source="text", data_files=[str(tmp_path)], piece_bytes=4096)
    with pytest.raises(DataError) as err:
        build_val_set(cfg, open_documents(cfg, gpt2_tokenizer))
    assert str(err.value) == (
        "the corpus has no documents (source=text, files=1, pieces=1, piece_bytes=4096); check data.data_files"
    )


@pytest.mark.slow
def test_the_tiny_config_trains_on_a_directory_of_text_files(tmp_path, capsys):
    write_texts(tmp_path / "corpus", 6, 40)
    run = tmp_path / "run"
    text = ["data.source=text", f"data.data_files=[{tmp_path / 'corpus'}]", "data.piece_bytes=8192"]
    assert train_main(["--config", TINY, *FAST, *text, f"run.dir={run}", "train.max_steps=4"]) == 0
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "train_loss" in r][-1] == 4
    assert '"source": "text"' in (run / "run.log").read_text()
    empty = tmp_path / "none"
    empty.mkdir()
    capsys.readouterr()
    bad = ["data.source=text", f"data.data_files=[{empty}/*.txt]"]
    assert train_main(["--config", TINY, *FAST, *bad, f"run.dir={tmp_path / 'bad'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: data file") and "names no text files" in err[0]
