"""Export a trained GPT as a Hugging Face `transformers` model directory (ArceeForCausalLM).

Arcee is the stock transformers architecture that matches the paper's GPT exactly: pre-norm
Llama-style decoder, RMSNorm, rotate-half RoPE, non-gated ReLU² MLP, no biases. So the exported
directory loads with `AutoModelForCausalLM` / `AutoTokenizer` offline, without remote code.

    python -m models.export --checkpoint runs/tiny/checkpoints/step_00000150 --out exports/tiny-hf

The core (`export_hf`) takes a plain state dict + GPTConfig; reading a checkpoint is confined to
`load_gpt_from_checkpoint`, so a checkpoint-format change touches one function.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from data.errors import resolve_path
from launch.config import UserError
from models.gpt import GPT, GPTConfig

class ExportError(UserError):
    """A user error in an export (bad checkpoint, occupied output, unsupported tokenizer): one line."""


def _require_transformers_5() -> None:
    import transformers

    # 5.x moved the RoPE base into `rope_parameters` (4.x: `rope_theta`); only 5.x is tested here.
    if int(transformers.__version__.split(".")[0]) < 5:
        raise ExportError(f"HF export needs transformers>=5 (found {transformers.__version__}); pip install -U transformers")


def to_arcee_config(cfg: GPTConfig, eos_id: int, bos_id: int, dtype: torch.dtype = torch.float32):
    """The ArceeConfig that computes exactly what `models.gpt.GPT` computes."""
    _require_transformers_5()
    from transformers import ArceeConfig

    return ArceeConfig(
        vocab_size=cfg.vocab_size,  # padded (50304): ids past the tokenizer's 50257 are never produced
        hidden_size=cfg.d_model,
        intermediate_size=4 * cfg.d_model,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_head,  # plain multi-head attention, no GQA
        head_dim=cfg.head_dim,
        hidden_act="relu2",
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(cfg.rope_base)},  # 5.x home of rope_theta
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        initializer_range=cfg.init_std,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        dtype=dtype,
    )


def to_arcee_state_dict(state_dict: Mapping[str, torch.Tensor], cfg: GPTConfig,
                        dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Our parameter names -> Arcee's, splitting the fused qkv. Every shape is checked so a state
    dict that does not fit `cfg` fails with a message naming the tensor, not deep inside torch."""
    sd, d = dict(state_dict), cfg.d_model

    def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in sd:
            raise ExportError(f"the state dict has no '{name}' (is it a GPT state dict for {cfg}?)")
        t = sd.pop(name)
        if tuple(t.shape) != shape:
            raise ExportError(f"'{name}' has shape {tuple(t.shape)}, expected {shape} for {cfg}")
        return t.detach().to("cpu", dtype)

    out = {"model.embed_tokens.weight": take("tok_emb.weight", (cfg.vocab_size, d))}
    for i in range(cfg.n_layer):
        src, dst = f"blocks.{i}.", f"model.layers.{i}."
        # qkv rows are [q; k; v], each d x d with heads contiguous: exactly q/k/v_proj's layout.
        # clone(): slices share storage, which safetensors refuses to write.
        q, k, v = (t.clone() for t in take(src + "attn.qkv.weight", (3 * d, d)).split(d))
        out.update({
            dst + "self_attn.q_proj.weight": q,
            dst + "self_attn.k_proj.weight": k,
            dst + "self_attn.v_proj.weight": v,
            dst + "self_attn.o_proj.weight": take(src + "attn.out.weight", (d, d)),
            dst + "mlp.up_proj.weight": take(src + "mlp.up.weight", (4 * d, d)),
            dst + "mlp.down_proj.weight": take(src + "mlp.down.weight", (d, 4 * d)),
            dst + "input_layernorm.weight": take(src + "attn_norm.weight", (d,)),
            dst + "post_attention_layernorm.weight": take(src + "mlp_norm.weight", (d,)),
        })
    out["model.norm.weight"] = take("final_norm.weight", (d,))
    leftover = sorted(k for k in sd if k not in ("rope_cos", "rope_sin"))  # derived buffers, not weights
    if leftover:
        raise ExportError(f"unexpected tensors in the state dict: {', '.join(leftover[:5])}"
                          f"{' ...' if len(leftover) > 5 else ''} (n_layer={cfg.n_layer}?)")
    return out


def _hf_tokenizer(tokenizer_path: str, max_len: int):
    """A `PreTrainedTokenizerFast` whose eos (also bos/unk, GPT-2 style) is the end-of-document
    token the packer inserted during training, so generation stops where documents ended."""
    from data import load_tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = load_tokenizer(tokenizer_path)  # same file and same EOS choice as training
    if tok.kind != "tokenizers":
        # transformers' SentencePiece conversion needs protobuf and (5.24, Mistral v1 model) does not
        # reproduce sentencepiece's ids on leading whitespace: refuse rather than ship a mismatch.
        raise ExportError(f"tokenizer '{tokenizer_path}' is {tok.kind}; HF export supports tokenizer.json "
                          "tokenizers only (SentencePiece export is not supported yet)")
    eos = tok.backend.id_to_token(tok.eos_id)
    return PreTrainedTokenizerFast(tokenizer_object=tok.backend, eos_token=eos, bos_token=eos, unk_token=eos,
                                   model_max_length=max_len), tok


def _check_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"output '{out}' exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"output directory '{out}' is not empty; pass --overwrite to replace it")


def export_hf(state_dict: Mapping[str, torch.Tensor], cfg: GPTConfig, tokenizer_path: str, out_dir: str | Path,
              overwrite: bool = False, dtype: Optional[torch.dtype] = None) -> Path:
    """Write an HF model directory (config.json, generation_config.json, model.safetensors,
    tokenizer files). Written beside `out_dir` and renamed into place when complete, so a failed
    export never leaves a half-written directory, and an existing one is replaced only with
    `overwrite`. `dtype`: None keeps the weights' dtype (the embedding's)."""
    out = Path(out_dir)
    _check_out_dir(out, overwrite)
    _require_transformers_5()
    from transformers import ArceeForCausalLM

    hf_tok, tok = _hf_tokenizer(tokenizer_path, cfg.max_seq_len)
    if tok.vocab_size > cfg.vocab_size:
        raise ExportError(f"the tokenizer has {tok.vocab_size} tokens but the model only {cfg.vocab_size}")
    if dtype is None:
        emb = state_dict.get("tok_emb.weight")
        dtype = emb.dtype if emb is not None else torch.float32
    weights = to_arcee_state_dict(state_dict, cfg, dtype)
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"]  # tied; strict load expects the key

    # Built on meta: nothing is randomly initialised (1.1B would take a while), `assign` adopts our
    # tensors, and strict=True proves the name mapping covers every parameter exactly once.
    with torch.device("meta"):
        model = ArceeForCausalLM(to_arcee_config(cfg, eos_id=tok.eos_id, bos_id=tok.eos_id, dtype=dtype))
    try:
        model.load_state_dict(weights, strict=True, assign=True)
    except RuntimeError as err:  # cannot happen if to_arcee_state_dict is right; keep it one line
        raise ExportError(f"weights do not fit ArceeForCausalLM: {' '.join(str(err).split())[:300]}") from None
    model.tie_weights()  # assign=True gave lm_head its own Parameter; re-tie so it is saved once

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        hf_tok.save_pretrained(tmp)
        # 5.x writes "TokenizersBackend", a name 4.x readers lack; the classic name loads in both.
        tc = tmp / "tokenizer_config.json"
        tc.write_text(json.dumps({**json.loads(tc.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))
        _publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


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


# ---- checkpoint reading: the only part that knows the checkpoint format -------------------------

def _gpt_config(recorded: Any) -> GPTConfig:
    """The GPTConfig the trainer recorded in meta.json (its fields as a dict)."""
    if not isinstance(recorded, dict):
        raise ExportError("the checkpoint's meta.json records no model config")
    names = {f.name for f in fields(GPTConfig)}
    return GPTConfig(**{k: v for k, v in recorded.items() if k in names})


def load_gpt_from_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], GPTConfig, str]:
    """(state dict, GPTConfig, tokenizer path) from a checkpoint step directory, a checkpoints root
    (its `latest` file names the step) or a run directory, as `launch.checkpoint` writes them."""
    path = Path(path)
    for root in (path, path / "checkpoints"):
        if (root / "latest").is_file():
            path = root / (root / "latest").read_text().strip()
            break
    from launch.checkpoint import _complete, load_model_weights, read_meta

    if _complete(path):
        meta = read_meta(path)
        cfg = _gpt_config(meta.get("model"))
        with torch.device("meta"):  # shapes only: the checkpoint supplies every value
            model = GPT(cfg)
        model.to_empty(device="cpu")
        with warnings.catch_warnings():  # "assuming ... a single process": exactly what we want
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            load_model_weights(path, model)
        state_dict = dict(model.state_dict())
    else:
        raise ExportError(f"no checkpoint at '{path}' (expected a complete step directory, a checkpoints "
                          "root with a `latest` file, or a run directory)")
    try:
        tokenizer = meta["config"]["data"]["tokenizer"]
    except (KeyError, TypeError):
        raise ExportError(f"checkpoint '{path}' records no data.tokenizer in its config") from None
    return state_dict, cfg, str(resolve_path(tokenizer))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="step directory, checkpoints root or run directory")
    parser.add_argument("--out", required=True, help="output directory (must be empty or absent)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default: as stored")
    args = parser.parse_args(argv)
    try:
        _check_out_dir(Path(args.out), args.overwrite)  # before the (possibly long) checkpoint read
        state_dict, cfg, tokenizer = load_gpt_from_checkpoint(args.checkpoint)
        out = export_hf(state_dict, cfg, tokenizer, args.out, overwrite=args.overwrite,
                        dtype=getattr(torch, args.dtype) if args.dtype else None)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"exported {cfg} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
