"""The training loop: `train(cfg)` sets the run up (`launch.run.setup`), then runs the same loop for
every backend — step, log, evaluate, checkpoint — and `main(argv)` is the command line
(`python train.py --config ... [section.key=value ...]`)."""

from __future__ import annotations

import argparse
import logging
import math
import os

import torch

from data import DataError
from launch.config import Config, load_config
from launch.engine import Engine
from launch.errors import USER_ERRORS
from launch.run.downstream import eval_metrics, score_tasks, summary_line
from launch.run.progress import Progress
from launch.run.setup import Run, RunComplete, setup_run
from launch.runtime.console import report_user_error, setup_logging
from launch.runtime.preemption import StopFlag
from launch.runtime.process_group import DistEnv, all_reduce_sum, shutdown
from orscale.schedule import lr_at

log = logging.getLogger("orscale")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="train.py", description="Train the paper's GPT.")
    parser.add_argument("--config", default=None, help="YAML config file (e.g. configs/tiny.yaml)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.name=orscale_lm")
    # The DeepSpeed launcher passes --local_rank; LOCAL_RANK in the environment says the same.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


@torch.no_grad()
def evaluate(engine: Engine, val: torch.Tensor, batch_size: int, env: DistEnv) -> float:
    """Mean cross-entropy over every target token of the fixed validation set, split over ranks.

    Every rank runs the same number of forward passes (a sharded model gathers weights inside
    forward), padding its share with repeats of weight 0, so the result does not depend on the
    world size.
    """
    engine.module.eval()
    mine = val[env.rank :: env.world_size]
    per_rank = math.ceil(len(val) / env.world_size)
    total = torch.tensor([0.0, 0.0], device=env.device, dtype=torch.float64)  # [sum of losses, tokens]
    for start in range(0, per_rank, batch_size):
        batch = mine[start : start + batch_size]
        weight = len(batch)
        batch = (batch if weight else val[:1]).to(env.device)
        with engine.autocast():
            loss = engine.module(batch[:, :-1], batch[:, 1:])
        n = weight * (batch.shape[1] - 1)
        total += torch.stack([loss.double() * n, torch.tensor(n, device=env.device, dtype=torch.float64)])
    all_reduce_sum(total)
    engine.module.train()
    return (total[0] / total[1]).item()


def train(cfg: Config) -> dict:
    try:
        run = setup_run(cfg)
    except RunComplete as done:
        log.info("%s: nothing to do (raise train.max_steps to train further)", done)
        return {"step": done.step, "complete": True}
    try:
        return _loop(run)
    finally:
        run.close()


def _loop(run: Run) -> dict:
    cfg, engine, loader, state, meter, env, t = (
        run.cfg,
        run.engine,
        run.loader,
        run.state,
        run.meter,
        run.env,
        run.cfg.train,
    )
    stop = StopFlag(env)
    progress = Progress(t.max_steps, state.step, enabled=env.is_main, bar=t.progress)
    last_loss, last_val = math.nan, (math.nan, None)
    while state.step < t.max_steps:
        lr = lr_at(state.step, cfg.optim.lr, cfg.optim.warmup_steps, t.max_steps, cfg.optim.min_lr_ratio)
        try:
            windows = loader.next_step()  # this rank's share of the step, read ahead in the background
        except DataError:  # e.g. a Hub read that failed after its retries, with no step read before it
            if env.world_size == 1 and state.step > run.start_step:
                run.save()  # one process has no one to agree with: keep what it trained, then say why
            raise
        run.audit.record(state.step + 1, windows)
        for micro, batch in enumerate(windows.split(t.micro_batch_size)):
            batch = batch.to(env.device, non_blocking=True)
            meter.add_micro_batch(engine.forward_backward(batch, last_micro_batch=micro == run.accum_steps - 1))
        grad_norm = engine.step(lr)
        state.step += 1
        state.tokens += run.tokens_per_step
        meter.end_step(state.step, grad_norm, run.tokens_per_step, loader.take_wait_s())

        # Step 1 of a fresh run, not the first of a resumed one: a resume writes the records the
        # uninterrupted run writes (its first record averages the window the checkpoint holds).
        if state.step % t.log_every == 0 or state.step in (t.max_steps, 1):
            record = {
                "step": state.step,
                "tokens": state.tokens,
                "lr": lr,
                "adamw_lr": lr * cfg.optim.adamw_lr_scale,  # the AdamW group's (embedding, head, norms)
                "grad_norm": float(grad_norm),
                **meter.read(state.tokens),
                # Hub requests retried since the previous line, on every rank (data/hub_http.py)
                "data_retries": int(all_reduce_sum(torch.tensor(float(loader.take_read_retries()), device=env.device))),
                **engine.diagnostics(),
            }
            run.run_dir.write(record)
            run.check_finite()  # the loss was just read: this costs one tiny all-reduce more
            last_loss = record["train_loss"]
            progress.logged(record)
        if (t.eval_every and state.step % t.eval_every == 0) or state.step == t.max_steps:
            last_val = (evaluate(engine, run.val, cfg.data.val_batch_size, env), state.step)
            run.run_dir.write(
                {
                    "step": state.step,
                    "tokens": state.tokens,
                    "val_loss": last_val[0],
                    "val_tokens": run.val[:, 1:].numel(),
                }
            )
            log.info("step %d: val_loss %.4f", state.step, last_val[0])
            if cfg.eval.tasks:  # downstream tasks at the same steps, on the windows the model trained on
                scores = score_tasks(engine.module, engine.autocast, run.tokenizer, cfg.eval, env, cfg.data.seq_len)
                run.run_dir.write({"step": state.step, "tokens": state.tokens, **eval_metrics(scores)})
                for summary in scores.values():
                    log.info("step %d: eval %s", state.step, summary_line(summary))
            meter.restart_clock()  # evaluation time is not training throughput
        progress.update(state.step)
        if loader.failure is not None:  # the reader failed on a later step: every rank stops here and saves
            stop.raised = True
        if stop.agreed():
            log.warning("stop signal: saving a checkpoint at step %d and exiting", state.step)
            run.save()
            break
        if state.step == t.max_steps or (t.ckpt_every and state.step % t.ckpt_every == 0):
            run.save()
            meter.restart_clock()
    stop.restore()
    progress.close()
    if loader.failure is not None and state.step < t.max_steps:
        raise loader.failure  # after the save: its one line names the file, row group and last status
    val = f"{last_val[0]:.4f} (step {last_val[1]})" if last_val[1] is not None else "not evaluated in this launch"
    log.info(
        "%s at step %d: last train loss %.4f, last val loss %s",
        "stopped by a signal" if stop.raised else "done",
        state.step,
        last_loss,
        val,
    )
    return {"step": state.step, "last_train_loss": last_loss, "val_loss": last_val[0]}


def main(argv: list[str] | None = None) -> int:
    setup_logging(rank=0)
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        train(cfg)
    except USER_ERRORS as err:
        report_user_error(err, int(os.environ.get("RANK", "0")))
        shutdown(clean=False)
        return 2
    except BaseException:
        shutdown(clean=False)
        raise
    shutdown()
    return 0
