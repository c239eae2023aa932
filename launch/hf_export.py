"""A trained GPT as a Hugging Face `transformers` model directory (ArceeForCausalLM): `export_hf`, and
`run`, what `python -m launch.export` (launch/export.py) does once its arguments are read.

The name mapping itself is `models/hf_mapping.py`, the checkpoint reading `launch.checkpoint.load_gpt`;
this module adds the tokenizer and an atomic write.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch

from data import load_tokenizer
from data.paths import resolve_path
from launch.checkpoint import load_gpt
from launch.errors import USER_ERRORS
from models.gpt import GPTConfig
from models.hf_mapping import ExportError, arcee_model

__all__ = ["export_hf", "run"]


def _hf_tokenizer(tokenizer_path: str, max_len: int):
    """A `PreTrainedTokenizerFast` whose eos (also bos/unk, GPT-2 style) is the end-of-document
    token the packer inserted during training, so generation stops where documents ended."""
    from transformers import PreTrainedTokenizerFast

    tok = load_tokenizer(tokenizer_path)  # same file and same EOS choice as training
    if tok.kind != "tokenizers":
        # transformers' SentencePiece conversion needs protobuf and (5.24, Mistral v1 model) does not
        # reproduce sentencepiece's ids on leading whitespace: refuse rather than ship a mismatch.
        raise ExportError(
            f"tokenizer '{tokenizer_path}' is {tok.kind}; HF export supports tokenizer.json "
            "tokenizers only (SentencePiece export is not supported yet)"
        )
    eos = tok.backend.id_to_token(tok.eos_id)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok.backend, eos_token=eos, bos_token=eos, unk_token=eos, model_max_length=max_len
    ), tok


def _check_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"output '{out}' exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"output directory '{out}' is not empty; pass --overwrite to replace it")


def export_hf(
    state_dict: Mapping[str, torch.Tensor],
    cfg: GPTConfig,
    tokenizer_path: str,
    out_dir: str | Path,
    overwrite: bool = False,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write an HF model directory (config.json, generation_config.json, model.safetensors,
    tokenizer files). Written beside `out_dir` and renamed into place when complete, so a failed
    export never leaves a half-written directory, and an existing one is replaced only with
    `overwrite`. `dtype`: None keeps the weights' dtype (the embedding's)."""
    out = Path(out_dir)
    _check_out_dir(out, overwrite)
    hf_tok, tok = _hf_tokenizer(tokenizer_path, cfg.max_seq_len)
    if tok.vocab_size > cfg.vocab_size:
        raise ExportError(f"the tokenizer has {tok.vocab_size} tokens but the model only {cfg.vocab_size}")
    if dtype is None:
        emb = state_dict.get("tok_emb.weight")
        dtype = emb.dtype if emb is not None else torch.float32
    model = arcee_model(state_dict, cfg, eos_id=tok.eos_id, bos_id=tok.eos_id, dtype=dtype)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with _no_deepspeed_probe():
            model.save_pretrained(tmp, safe_serialization=True)
        hf_tok.save_pretrained(tmp)
        # 5.x writes "TokenizersBackend", a name 4.x readers lack; the classic name loads in both.
        tc = tmp / "tokenizer_config.json"
        config = {**json.loads(tc.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"}
        tc.write_text(json.dumps(config, indent=2))
        # safetensors writes the weights through a temporary file (0600) renamed into place: give them
        # the mode the umask gave the files written plainly (config.json), as every other file has.
        mode = stat.S_IMODE((tmp / "config.json").stat().st_mode)
        for path in tmp.iterdir():
            path.chmod(mode)
        _publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


@contextmanager
def _no_deepspeed_probe() -> Iterator[None]:
    """save_pretrained unwraps the model through accelerate, which imports DeepSpeed when it is installed
    to test for its engine wrapper: ours is a plain module, and the import costs ~1 s and, without a
    GPU, DeepSpeed's "Setting accelerator to CPU" warning."""
    try:
        from accelerate.utils import other
    except ImportError:  # no accelerate: transformers unwraps by itself, without DeepSpeed
        yield
        return
    probe = other.is_deepspeed_available
    other.is_deepspeed_available = lambda: False
    try:
        yield
    finally:
        other.is_deepspeed_available = probe


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished export into place; an existing non-empty one is moved aside first and
    deleted only after the new one is in place."""
    if out.is_dir() and any(out.iterdir()):
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old)
    else:
        os.replace(tmp, out)  # replaces an empty directory atomically


def run(args: argparse.Namespace) -> int:
    """`python -m launch.export` with its arguments read (launch.export.parse_args): 0, or 2 after
    printing a user error's one line."""
    try:
        _check_out_dir(Path(args.out), args.overwrite)  # before the (possibly long) checkpoint read
        state_dict, cfg, tokenizer, _ = load_gpt(args.checkpoint)
        dtype = getattr(torch, args.dtype) if args.dtype else None
        out = export_hf(state_dict, cfg, str(resolve_path(tokenizer)), args.out, overwrite=args.overwrite, dtype=dtype)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"exported {cfg} to {out}")
    return 0
