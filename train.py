"""Train the paper's GPT: config -> data -> model -> parallelise -> optimizers -> loop.

    python train.py --config configs/tiny.yaml [section.key=value ...]
    torchrun --nproc_per_node=N train.py --config configs/125m.yaml parallel.backend=fsdp

Reads top to bottom. Everything that is not the loop itself lives in models/, data/, orscale/ and
launch/.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import math
import os
import signal
import sys
import time
from typing import Optional

import torch

from data import PackedLoader, build_val_set, load_tokenizer
from launch import checkpoint as ckpt
from launch.config import Config, ConfigError, UserError, load_config, to_dict
from launch.distributed import DistEnv, all_reduce_sum, barrier, init_distributed, shutdown
from launch.parallelize import build_model, no_sync, wrap_for_training
from launch.resume import check_resume_compatible, find_resume_point, prepare_run_dir
from launch.runlog import RunDir, git_commit, setup_logging
from launch.zero import ZeroEngine, check_checkpoint_world_size, check_zero_config
from models import GPTConfig, get_preset
from orscale import build_optimizers, check_optim_config, collect_diagnostics
from orscale.schedule import lr_at, set_lr

log = logging.getLogger("orscale")


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="YAML config file (e.g. configs/tiny.yaml)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.name=orscale_lm")
    # The DeepSpeed launcher passes --local_rank; LOCAL_RANK in the environment says the same.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


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


def compute_dtype(cfg: Config, device: torch.device) -> torch.dtype:
    if cfg.train.dtype == "auto":
        cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if cuda_bf16 else torch.float32
    return torch.bfloat16 if cfg.train.dtype == "bf16" else torch.float32


@torch.no_grad()
def evaluate(model: torch.nn.Module, val: torch.Tensor, batch_size: int, env: DistEnv, autocast) -> float:
    """Mean cross-entropy over every target token of the fixed validation set, split over ranks.

    Every rank runs the same number of forward passes (FSDP all-gathers inside forward), padding
    its share with zero-weight repeats, so the result does not depend on the world size.
    """
    model.eval()
    mine = val[env.rank::env.world_size]
    per_rank = math.ceil(len(val) / env.world_size)
    total = torch.zeros(2, device=env.device, dtype=torch.float64)  # [sum of losses, tokens]
    for start in range(0, per_rank, batch_size):
        batch = mine[start:start + batch_size]
        weight = len(batch)
        if weight == 0:
            batch = val[:1]
        batch = batch.to(env.device)
        with autocast():
            loss = model(batch[:, :-1], batch[:, 1:])
        n = weight * (batch.shape[1] - 1)
        total += torch.stack([loss.double() * n, torch.tensor(n, device=env.device, dtype=torch.float64)])
    all_reduce_sum(total)
    model.train()
    return (total[0] / total[1]).item()


class StopFlag:
    """SIGTERM/SIGINT (preemption) set a flag; the loop saves a checkpoint and exits 0."""

    def __init__(self) -> None:
        self.raised = False
        self._previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame) -> None:
        self.raised = True

    def restore(self) -> None:
        """Give the signals back to whoever had them (matters when train() is called as a library)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def agreed(self, env: DistEnv) -> bool:
        """All ranks stop at the same step if any rank was signalled (one tiny all-reduce)."""
        if env.world_size == 1:
            return self.raised
        flag = torch.tensor([float(self.raised)], device=env.device)
        return all_reduce_sum(flag).item() > 0


def train(cfg: Config) -> dict:
    # ---- cheap checks first: nothing is read or written before the config is known to be sound
    model_cfg = resolve_model_config(cfg)
    check_optim_config(cfg.optim)
    use_zero = cfg.parallel.backend in ("zero1", "zero2")
    if use_zero:
        check_zero_config(cfg)
    env = init_distributed(cfg)
    setup_logging(env.rank)
    dtype = compute_dtype(cfg, env.device)
    autocast = ((lambda: torch.autocast(env.device.type, dtype=dtype)) if dtype != torch.float32
                else contextlib.nullcontext)

    # ---- data: tokenizer, fixed validation set, this rank's logical shards of the stream after it
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise ConfigError(f"the tokenizer has {tokenizer.vocab_size} tokens but model.vocab_size is "
                          f"{model_cfg.vocab_size}; raise model.vocab_size")
    val, val_docs = build_val_set(cfg.data, tokenizer)
    loader = PackedLoader(cfg.data, tokenizer, first_doc=val_docs, rank=env.rank, world_size=env.world_size)
    seqs_per_step = cfg.train.tokens_per_step // cfg.data.seq_len
    per_micro = cfg.train.micro_batch_size * env.world_size
    if seqs_per_step % per_micro:
        raise ConfigError(f"train.tokens_per_step/data.seq_len = {seqs_per_step} sequences is not a multiple of "
                          f"train.micro_batch_size x world size = {per_micro}")
    accum_steps = seqs_per_step // per_micro

    # ---- run directory and resume point: refuse to clobber an earlier run
    run = RunDir(cfg.run.dir, active=env.is_main)
    resume_from = find_resume_point(cfg, run)
    meta = {"config": to_dict(cfg), "git_commit": git_commit(), "tokenizer": tokenizer.describe(),
            "model": dataclasses.asdict(model_cfg)}
    if resume_from is not None:
        check_resume_compatible(ckpt.read_meta(resume_from), meta)
        if use_zero:
            check_checkpoint_world_size(resume_from / "zero", env.world_size)
    barrier()  # every rank has looked at the run dir before rank 0 starts writing to it

    # ---- model, parallelism, optimizers
    model = build_model(model_cfg, cfg, env)
    # DeepSpeed owns the optimizer step under ZeRO (its engine holds the partitioned state).
    zero = ZeroEngine(model, cfg, env, accum_steps) if use_zero else None
    module = zero.module if zero else wrap_for_training(model, cfg, env)
    optimizers = [] if zero else build_optimizers(model, cfg.optim, backend=cfg.parallel.backend,
                                                  mode=cfg.parallel.muon_mode)
    start_step = 0
    if resume_from is not None:
        state = ckpt.load_checkpoint(resume_from, module, optimizers, env, zero=zero)
        loader.load_state_dict(state["loader"])
        if "rng" in state:
            torch.set_rng_state(state["rng"]["cpu"])
        start_step = state["step"]
    prepare_run_dir(cfg, run, start_step)
    run.open(cfg, extra={"params": model.num_params(), "accum_steps": accum_steps, "val_docs": val_docs,
                         "val_windows": len(val), "device": str(env.device), "dtype": str(dtype),
                         "world_size": env.world_size, "tokenizer": tokenizer.describe(),
                         "resumed_from": str(resume_from) if resume_from else None})
    log.info("model: %.2fM parameters; %d ranks x %d micro-batches of %d x %d per step; %s",
             model.num_params() / 1e6, env.world_size, accum_steps, cfg.train.micro_batch_size,
             cfg.data.seq_len, f"resuming at step {start_step}" if start_step else "fresh start")

    def save(step: int) -> None:
        path = ckpt.save_checkpoint(run.path / "checkpoints", step, module, optimizers, loader.state_dict(),
                                    {**meta, "tokens": step * tokens_per_step}, env, keep=cfg.run.keep_checkpoints,
                                    zero=zero)
        log.info("checkpoint: %s", path)

    # ---- the loop
    tokens_per_step = seqs_per_step * cfg.data.seq_len
    stop = StopFlag()
    audit = None
    if cfg.train.record_windows:
        run.path.mkdir(parents=True, exist_ok=True)
        audit = (run.path / f"windows_rank{env.rank}.txt").open("a")
    progress = _progress(cfg, env, start_step)
    last_loss = val_loss = math.nan
    t_last, tokens_since = time.perf_counter(), 0
    loss_sum, steps_in_window = torch.zeros((), device=env.device), 0
    step = start_step
    while step < cfg.train.max_steps:
        lr = lr_at(step, cfg.optim.lr, cfg.optim.warmup_steps, cfg.train.max_steps, cfg.optim.min_lr_ratio)
        set_lr(optimizers, lr)
        for micro in range(accum_steps):
            batch = loader.next_batch(cfg.train.micro_batch_size)
            if audit is not None:
                audit.writelines(f"{step + 1} {hash(tuple(row.tolist()))}\n" for row in batch)
                audit.flush()
            batch = batch.to(env.device, non_blocking=True)
            # ZeRO reduces on its own schedule; DDP/FSDP skip communication until the last micro-batch.
            sync = contextlib.nullcontext() if zero else no_sync(module, last_micro_batch=micro == accum_steps - 1)
            with sync, autocast():
                loss = module(batch[:, :-1], batch[:, 1:]) / accum_steps
                zero.backward(loss) if zero else loss.backward()
            loss_sum += loss.detach()
        if zero:
            grad_norm = zero.step(lr)  # clips the raw gradients itself, before orthogonalisation
        else:
            max_norm = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)
        step += 1
        tokens_since += tokens_per_step
        steps_in_window += 1

        if step % cfg.train.log_every == 0 or step == cfg.train.max_steps or step == start_step + 1:
            train_loss = all_reduce_sum(loss_sum).item() / env.world_size / steps_in_window
            now = time.perf_counter()
            record = {"step": step, "tokens": step * tokens_per_step, "train_loss": train_loss, "lr": lr,
                      "grad_norm": float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm),
                      "tokens_per_s": tokens_since / (now - t_last)}
            record.update(zero.diagnostics() if zero else collect_diagnostics(optimizers))
            run.write(record)
            last_loss = train_loss
            progress.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
            loss_sum.zero_()
            t_last, tokens_since, steps_in_window = time.perf_counter(), 0, 0
        if (cfg.train.eval_every and step % cfg.train.eval_every == 0) or step == cfg.train.max_steps:
            val_loss = evaluate(module, val, cfg.data.val_batch_size, env, autocast)
            run.write({"step": step, "tokens": step * tokens_per_step, "val_loss": val_loss})
            log.info("step %d: val_loss %.4f", step, val_loss)
            t_last = time.perf_counter()  # evaluation time is not training throughput
        progress.update(1)
        if stop.agreed(env):
            log.warning("stop signal: saving a checkpoint at step %d and exiting", step)
            save(step)
            break
        if step == cfg.train.max_steps or (cfg.train.ckpt_every and step % cfg.train.ckpt_every == 0):
            save(step)
    stop.restore()
    progress.close()
    run.close()
    if audit is not None:
        audit.close()
    log.info("done at step %d: last train loss %.4f, last val loss %.4f", step, last_loss, val_loss)
    return {"step": step, "last_train_loss": last_loss, "val_loss": val_loss}


def _progress(cfg: Config, env: DistEnv, start: int):
    from tqdm import tqdm

    return tqdm(total=cfg.train.max_steps, initial=start, disable=not (cfg.train.progress and env.is_main),
                dynamic_ncols=True, desc="train")


def main(argv: Optional[list[str]] = None) -> int:
    setup_logging(rank=0)
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        train(cfg)
    except UserError as err:
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"error: {err}", file=sys.stderr)
        shutdown(clean=False)
        return 2
    except BaseException:
        shutdown(clean=False)
        raise
    shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
