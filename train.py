"""Train the paper's GPT: config -> data -> model -> optimizers -> loop (step, eval, log, checkpoint).

    python train.py --config configs/tiny.yaml [section.key=value ...]

Reads top to bottom. Everything that is not the loop itself lives in models/, data/, orscale/ and
launch/.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from data import PackedLoader, build_val_set, load_tokenizer
from launch.checkpoint import save_checkpoint
from launch.config import Config, ConfigError, UserError, load_config, to_dict
from launch.runlog import RunDir, git_commit, setup_logging
from models import GPT, GPTConfig, get_preset
from orscale import build_optimizers, check_optim_config, collect_diagnostics
from orscale.schedule import lr_at, set_lr

log = logging.getLogger("orscale")


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="YAML config file (e.g. configs/tiny.yaml)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.name=orscale_lm")
    return parser.parse_args(argv)


def pick_device_and_dtype(cfg: Config) -> tuple[torch.device, torch.dtype]:
    want = cfg.train.device
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device=cuda but no CUDA device is visible; use train.device=cpu")
    device = torch.device("cuda" if want == "cuda" or (want == "auto" and torch.cuda.is_available()) else "cpu")
    if cfg.train.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    else:
        dtype = torch.bfloat16 if cfg.train.dtype == "bf16" else torch.float32
    return device, dtype


def resolve_model_config(cfg: Config) -> GPTConfig:
    """The preset with any model.* overrides, checked against the data settings."""
    m = cfg.model
    try:
        gpt_cfg = get_preset(m.preset, n_layer=m.n_layer, d_model=m.d_model, n_head=m.n_head,
                             max_seq_len=m.max_seq_len, vocab_size=m.vocab_size)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if cfg.data.seq_len > gpt_cfg.max_seq_len:
        raise ConfigError(f"data.seq_len ({cfg.data.seq_len}) exceeds the model's context "
                          f"({gpt_cfg.max_seq_len}); lower data.seq_len or set model.max_seq_len")
    return gpt_cfg


@torch.no_grad()
def evaluate(model: GPT, val: torch.Tensor, batch_size: int, device: torch.device, autocast) -> float:
    """Mean cross-entropy over every target token of the fixed validation set."""
    model.eval()
    total, count = torch.zeros((), device=device, dtype=torch.float64), 0
    for start in range(0, len(val), batch_size):
        batch = val[start:start + batch_size].to(device)
        with autocast():
            loss = model.loss(batch[:, :-1], batch[:, 1:])
        n = batch[:, 1:].numel()
        total += loss.double() * n
        count += n
    model.train()
    return (total / count).item()


def train(cfg: Config) -> dict:
    torch.manual_seed(cfg.train.seed)
    device, dtype = pick_device_and_dtype(cfg)
    autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype != torch.float32 else contextlib.nullcontext
    if cfg.parallel.backend != "none":
        raise ConfigError(f"parallel.backend={cfg.parallel.backend} needs torchrun and lands with the "
                          "multi-GPU work; use parallel.backend=none")
    world_size = 1
    model_cfg = resolve_model_config(cfg)
    check_optim_config(cfg.optim)

    # ---- data: tokenizer, fixed validation set, training stream after it
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    val, val_docs = build_val_set(cfg.data, tokenizer)
    loader = PackedLoader(cfg.data, tokenizer, first_doc=val_docs)
    seqs_per_step = cfg.train.tokens_per_step // cfg.data.seq_len
    per_micro = cfg.train.micro_batch_size * world_size
    if seqs_per_step % per_micro:
        raise ConfigError(f"train.tokens_per_step/data.seq_len = {seqs_per_step} sequences is not a multiple of "
                          f"train.micro_batch_size x world size = {per_micro}")
    accum_steps = seqs_per_step // per_micro

    # ---- model and optimizers
    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise ConfigError(f"the tokenizer has {tokenizer.vocab_size} tokens but model.vocab_size is "
                          f"{model_cfg.vocab_size}; raise model.vocab_size")
    with torch.device(device):
        model = GPT(model_cfg)
    optimizers = build_optimizers(model, cfg.optim)

    # ---- run directory: refuse to clobber an earlier run's files
    run = RunDir(cfg.run.dir, active=True)
    ckpt_root = run.path / "checkpoints"
    if run.metrics_path.exists() and not cfg.run.overwrite:
        raise ConfigError(f"run.dir '{cfg.run.dir}' already holds a run (metrics.jsonl); choose another "
                          "run.dir or pass run.overwrite=true to append to it")
    run.open(cfg, extra={"params": model.num_params(), "accum_steps": accum_steps, "val_docs": val_docs,
                         "val_windows": len(val), "device": str(device), "dtype": str(dtype),
                         "tokenizer": tokenizer.describe(), "world_size": world_size})
    log.info("model: %.2fM parameters; %d micro-batches of %d x %d per step",
             model.num_params() / 1e6, accum_steps, cfg.train.micro_batch_size, cfg.data.seq_len)

    # ---- the loop
    tokens_per_step = seqs_per_step * cfg.data.seq_len
    progress = _progress(cfg)
    first_loss = last_loss = val_loss = math.nan
    t_last, tokens_since = time.perf_counter(), 0
    loss_sum, steps_in_window = torch.zeros((), device=device), 0
    for step in range(cfg.train.max_steps):
        lr = lr_at(step, cfg.optim.lr, cfg.optim.warmup_steps, cfg.train.max_steps, cfg.optim.min_lr_ratio)
        set_lr(optimizers, lr)
        for _ in range(accum_steps):
            batch = loader.next_batch(cfg.train.micro_batch_size).to(device, non_blocking=True)
            with autocast():
                loss = model.loss(batch[:, :-1], batch[:, 1:]) / accum_steps
            loss.backward()
            loss_sum += loss.detach()
        max_norm = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        tokens_since += tokens_per_step
        steps_in_window += 1
        done = step + 1

        if done % cfg.train.log_every == 0 or done == cfg.train.max_steps or step == 0:
            now = time.perf_counter()
            train_loss = loss_sum.item() / steps_in_window  # mean since the previous log line
            record = {"step": done, "tokens": done * tokens_per_step, "train_loss": train_loss, "lr": lr,
                      "grad_norm": grad_norm.item(), "tokens_per_s": tokens_since / (now - t_last)}
            record.update(collect_diagnostics(optimizers))
            run.write(record)
            first_loss = train_loss if step == 0 else first_loss
            last_loss = train_loss
            progress.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
            loss_sum.zero_()
            t_last, tokens_since, steps_in_window = time.perf_counter(), 0, 0
        if (cfg.train.eval_every and done % cfg.train.eval_every == 0) or done == cfg.train.max_steps:
            val_loss = evaluate(model, val, cfg.data.val_batch_size, device, autocast)
            run.write({"step": done, "tokens": done * tokens_per_step, "val_loss": val_loss})
            log.info("step %d: val_loss %.4f", done, val_loss)
            t_last = time.perf_counter()  # evaluation time is not training throughput
        if cfg.train.ckpt_every and done % cfg.train.ckpt_every == 0 and done != cfg.train.max_steps:
            _save(ckpt_root, done, model, optimizers, loader, cfg)
        progress.update(1)
    progress.close()
    _save(ckpt_root, cfg.train.max_steps, model, optimizers, loader, cfg)
    run.close()
    log.info("done: first train loss %.4f, last %.4f, final val loss %.4f", first_loss, last_loss, val_loss)
    return {"first_train_loss": first_loss, "last_train_loss": last_loss, "val_loss": val_loss}


def _progress(cfg: Config):
    from tqdm import tqdm

    return tqdm(total=cfg.train.max_steps, disable=not cfg.train.progress, dynamic_ncols=True, desc="train")


def _save(root: Path, step: int, model: GPT, optimizers, loader: PackedLoader, cfg: Config) -> None:
    state = {"step": step, "model": model.state_dict(), "optimizers": [o.state_dict() for o in optimizers],
             "loader": loader.state_dict(), "config": to_dict(cfg), "git_commit": git_commit()}
    path = save_checkpoint(root, step, state)
    log.info("checkpoint: %s", path)


def main(argv: Optional[list[str]] = None) -> int:
    setup_logging(rank=0)
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        train(cfg)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
