"""Tokenizer loading: a HF `tokenizers` tokenizer.json, a SentencePiece .model, or a hub name.

Both backends are wrapped behind one small interface (`encode_batch`, `eos_id`, `vocab_size`)
so the data pipeline never branches on the tokenizer kind.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from data.data_errors import DataError, first_line
from data.paths import resolve_path

# Tried in order when a tokenizer.json does not say which token ends a document.
_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>")


class TextTokenizer:
    """Batch encoder with a known end-of-document id."""

    def __init__(self, name: str, kind: str, backend, eos_id: int, vocab_size: int) -> None:
        self.name, self.kind, self.backend = name, kind, backend
        self.eos_id, self.vocab_size = eos_id, vocab_size

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids per text, no special tokens added (EOS is inserted by the packer)."""
        if self.kind == "sentencepiece":
            return self.backend.encode(texts)
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        return [e.ids for e in encode(texts, add_special_tokens=False)]

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind, "eos_id": self.eos_id, "vocab_size": self.vocab_size}

    def fingerprint(self) -> str:
        """A hash of the tokenizer itself (vocabulary, merges, normalisation) and its EOS choice:
        equal fingerprints encode every text to the same ids, whatever the file is called."""
        if self.kind == "sentencepiece":
            blob = self.backend.serialized_model_proto()
        else:
            blob = self.backend.to_str().encode()
        h = hashlib.sha256(blob)
        h.update(f"eos={self.eos_id};vocab={self.vocab_size}".encode())
        return h.hexdigest()[:16]


def _from_tokenizer_json(path: Path, name: str) -> TextTokenizer:
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust error is long; keep its first line
        raise DataError(f"tokenizer file '{path}' could not be read: {first_line(err)}") from None
    return _wrap_hf(tok, name)


def _wrap_hf(tok, name: str) -> TextTokenizer:
    for candidate in _EOS_CANDIDATES:
        eos = tok.token_to_id(candidate)
        if eos is not None:
            return TextTokenizer(name, "tokenizers", tok, eos, tok.get_vocab_size())
    raise DataError(f"tokenizer '{name}' has no end-of-text token (looked for {', '.join(_EOS_CANDIDATES)})")


def _from_sentencepiece(path: Path, name: str) -> TextTokenizer:
    import sentencepiece as spm

    try:
        sp = spm.SentencePieceProcessor(model_file=str(path))
    except Exception as err:
        raise DataError(f"SentencePiece model '{path}' could not be read: {first_line(err)}") from None
    if sp.eos_id() < 0:
        raise DataError(f"SentencePiece model '{path}' defines no EOS piece; retrain it with eos_id set")
    return TextTokenizer(name, "sentencepiece", sp, sp.eos_id(), sp.get_piece_size())


def load_tokenizer(spec: str) -> TextTokenizer:
    """`spec`: a directory holding tokenizer.json or tokenizer.model, one of those files, or a hub
    name (needs network; e.g. `gpt2`)."""
    path = resolve_path(spec)
    if path.is_dir():
        for fname, loader in (("tokenizer.json", _from_tokenizer_json), ("tokenizer.model", _from_sentencepiece)):
            if (path / fname).is_file():
                return loader(path / fname, spec)
        raise DataError(f"tokenizer directory '{spec}' holds neither tokenizer.json nor tokenizer.model")
    if path.is_file():
        if path.suffix == ".model":
            return _from_sentencepiece(path, spec)
        return _from_tokenizer_json(path, spec)
    looks_like_path = spec.startswith((".", "/", "~")) or spec.endswith((".json", ".model"))
    if looks_like_path:
        raise DataError(
            f"tokenizer '{spec}' not found (give a directory with tokenizer.json, a .model file, or a hub name)"
        )
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_pretrained(spec)
    except Exception as err:
        raise DataError(
            f"tokenizer '{spec}' is neither a local path nor loadable from the hub ({first_line(err)}); "
            "offline, point data.tokenizer at a local tokenizer.json"
        ) from None
    return _wrap_hf(tok, spec)
