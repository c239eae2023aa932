"""The training loop: `train(cfg)` sets the run up (`launch.run.setup`), then runs the same loop for
every backend — step, log, evaluate, checkpoint — and `main(argv)` is the command line
(`python train.py --config ... [section.key=value ...]`)."""

from __future__ import annotations

import argparse
import logging
import math
import os
from pathlib import Path

import torch

from data import DataError
from launch.checkpoint import latest_checkpoint, read_meta
from launch.config import Config, load_config
from launch.errors import USER_ERRORS
from launch.evaluation import eval_metrics, score_tasks, summary_line, validation_loss
from launch.run.progress import Progress
from launch.run.setup import Run, RunComplete, setup_run
from launch.runtime.console import report_failure, report_user_error, setup_logging
from launch.runtime.hangs import COMM_FAILURE_EXIT, CommFailure, comm_failure, set_comm_timeout
from launch.runtime.preemption import StopFlag
from launch.runtime.process_group import all_reduce_sum, shutdown
from launch.runtime.stall_watch import StallWatch
from orscale.schedule import scheduled_lr

log = logging.getLogger("orscale")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="train.py", description="Train the paper's GPT.")
    parser.add_argument("--config", default=None, help="YAML config file (e.g. configs/tiny.yaml)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.name=orscale_lm")
    # The DeepSpeed launcher passes --local_rank; LOCAL_RANK in the environment says the same.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def train(cfg: Config) -> dict:
    try:
        run = setup_run(cfg)
    except RunComplete as done:
        log.info("%s: nothing to do (raise train.max_steps to train further)", done)
        return {"step": done.step, "complete": True}
    except RuntimeError as err:
        raise _comm_failure(err, cfg, None) from err
    watch = StallWatch(cfg.train.stall_dump_s)
    try:
        return _loop(run, watch)
    except torch.OutOfMemoryError as err:  # a snapshot first (train.memory_snapshot), then one line
        raise run.tracing.out_of_memory(err, watch.step) from err
    except RuntimeError as err:
        raise _comm_failure(err, cfg, run, watch.step) from err
    finally:
        watch.close()
        run.close()


def _comm_failure(err: RuntimeError, cfg: Config, run: Run | None, step: int = 0) -> RuntimeError:
    """`err` as a one-line CommFailure when it is a collective that timed out or lost its peer
    (launch/runtime/hangs.py), naming the timeout, the step and the checkpoint a restart resumes
    from; any other error as it is."""
    p = cfg.parallel
    where, timeout = (
        ("during start-up", f"parallel.init_timeout_s={p.init_timeout_s:g}")
        if run is None
        else (f"in step {step}", f"parallel.comm_timeout_s={p.comm_timeout_s:g}")
    )
    try:
        good = latest_checkpoint(Path(cfg.run.dir) / "checkpoints")
        back = f"the newest checkpoint is step {read_meta(good)['step']}" if good else "there is no checkpoint yet"
    except (OSError, ValueError, KeyError):
        back = "the newest intact checkpoint is the one a restart takes"
    resume = f"{back}; the same command resumes (torchrun --max-restarts and a Slurm requeue do so by themselves)"
    rank = run.env.rank if run is not None else int(os.environ.get("RANK", "0"))
    return comm_failure(err, rank, where, timeout, resume) or err


def _loop(run: Run, watch: StallWatch) -> dict:
    cfg, engine, loader, state, meter, env = run.cfg, run.engine, run.loader, run.state, run.meter, run.env
    t = cfg.train
    set_comm_timeout(cfg.parallel.comm_timeout_s)  # start-up is over: from here a silent peer ends the run
    stop = StopFlag(env)
    progress = Progress(t.max_steps, state.step, enabled=env.is_main, bar=t.progress)
    last_loss = math.nan
    last_val: tuple[float, int | None] = (math.nan, None)  # (loss, step) of this launch's last validation
    while state.step < t.max_steps:
        watch.beat(state.step + 1)  # its reads, evaluation and checkpoint included (train.stall_dump_s)
        lr = scheduled_lr(cfg.optim, state.step, t.max_steps)
        failure: Exception | None = None
        try:
            windows = loader.next_step()  # this rank's share of the step, read ahead in the background
        except Exception as err:  # e.g. a Hub read that failed after its retries, with no step read before it
            failure = err
        # Every rank learns of a failed read here, before the step's collectives (where the others
        # would wait for the failed rank until parallel.comm_timeout_s): all keep what they trained, then say why.
        if (failed := stop.agree_on_read(failure)) is not None:
            if state.step > run.start_step:
                run.save(wait=True)
            if failure is not None:
                raise failure
            raise DataError(f"rank {failed[0]} could not read step {state.step + 1}: {failed[1]}")
        run.audit.record(state.step + 1, windows)
        for micro, batch in enumerate(windows.split(t.micro_batch_size)):
            batch = batch.to(env.device, non_blocking=True)
            meter.add_micro_batch(engine.forward_backward(batch, last_micro_batch=micro == run.accum_steps - 1))
        grad_norm = engine.step(lr)
        state.step += 1
        state.tokens += t.tokens_per_step
        meter.end_step(state.step, grad_norm, t.tokens_per_step, loader.take_wait_s())
        run.tracing.step(state.step)  # train.profile / train.memory_snapshot windows; nothing when off

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
            with meter.paused():  # evaluation time is not training throughput
                last_val = (validation_loss(engine, run.val, cfg.data.val_batch_size, env), state.step)
                measured = {"val_loss": last_val[0], "val_tokens": run.val[:, 1:].numel()}
                run.run_dir.write({"step": state.step, "tokens": state.tokens, **measured})
                log.info("step %d: val_loss %.4f", state.step, last_val[0])
                if cfg.eval.tasks:  # downstream tasks at the same steps, on the windows the model trained on
                    compiled = cfg.parallel.compile != "none"  # a few padded shapes, not a graph per length
                    scores = score_tasks(
                        engine.module, engine.autocast, run.tokenizer, cfg.eval, env, cfg.data.seq_len, compiled
                    )
                    run.run_dir.write({"step": state.step, "tokens": state.tokens, **eval_metrics(scores)})
                    for summary in scores.values():
                        log.info("step %d: eval %s", state.step, summary_line(summary))
        progress.update(state.step)
        if loader.failure is not None:  # the reader failed on a later step: every rank stops here and saves
            stop.raised = True
        if stop.agreed():
            log.warning("stop signal: saving a checkpoint at step %d and exiting", state.step)
            run.save(wait=True)  # after the write in flight (run.async_save), and before the exit
            break
        if state.step == t.max_steps or (t.ckpt_every and state.step % t.ckpt_every == 0) or state.step in t.ckpt_at:
            with meter.paused():
                run.save()
    stop.restore()
    progress.close()
    if loader.failure is not None and state.step < t.max_steps:
        raise loader.failure  # after the save: its one line names the file, row group and last status
    val = f"{last_val[0]:.4f} (step {last_val[1]})" if last_val[1] is not None else "not evaluated in this launch"
    how = "stopped by a signal" if stop.raised else "done"
    log.info("%s at step %d: last train loss %.4f, last val loss %s", how, state.step, last_loss, val)
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
    except CommFailure as err:  # said by every rank that saw it: the rank that stalled may be rank 0
        report_failure(err)
        shutdown(clean=False)
        return COMM_FAILURE_EXIT
    except BaseException:
        shutdown(clean=False)
        raise
    shutdown()
    return 0
