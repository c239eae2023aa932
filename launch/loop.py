"""`train(plan)`: build a run's trainer (`launch.run.build`), then run its one loop for every backend —
step, the loop features' hooks, save (`launch.trainer`) — and `main(argv)`, the command line
(`python train.py --config ... [section.key=value ...]`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from launch.checkpoint import latest_checkpoint, read_meta
from launch.config import Config
from launch.errors import USER_ERRORS
from launch.plan import Plan, load_plan
from launch.run.build import RunComplete, build_trainer
from launch.runtime.console import report_failure, report_user_error, setup_logging
from launch.runtime.hangs import COMM_FAILURE_EXIT, CommFailure, comm_failure
from launch.runtime.process_group import shutdown
from launch.train_args import parse_args

log = logging.getLogger("orscale")


def train(plan: Plan) -> dict:
    """Build the run's components (launch/run/build.py), then train: the trainer's loop is step, the
    features' hooks (log, evaluate, stop), save (launch/trainer.py)."""
    cfg = plan.cfg
    try:
        trainer = build_trainer(plan)
    except RunComplete as done:
        log.info("%s: nothing to do (raise train.max_steps to train further)", done)
        return {"step": done.step, "complete": True}
    except RuntimeError as err:
        raise _comm_failure(err, cfg, None) from err
    try:
        return trainer.fit()
    except torch.OutOfMemoryError as err:  # a snapshot first (train.memory_snapshot), then one line
        raise trainer.out_of_memory(err) from err
    except RuntimeError as err:
        raise _comm_failure(err, cfg, trainer.env.rank, trainer.running) from err
    finally:
        trainer.close()


def _comm_failure(err: RuntimeError, cfg: Config, rank: int | None, step: int = 0) -> RuntimeError:
    """`err` as a one-line CommFailure when it is a collective that timed out or lost its peer
    (launch/runtime/hangs.py), naming the timeout, the step and the checkpoint a restart resumes
    from; any other error as it is. `rank` None: during start-up, before this rank knew its rank."""
    p = cfg.parallel
    where, timeout = (
        ("during start-up", f"parallel.init_timeout_s={p.init_timeout_s:g}")
        if rank is None
        else (f"in step {step}", f"parallel.comm_timeout_s={p.comm_timeout_s:g}")
    )
    try:
        good = latest_checkpoint(Path(cfg.run.dir) / "checkpoints")
        back = f"the newest checkpoint is step {read_meta(good)['step']}" if good else "there is no checkpoint yet"
    except (OSError, ValueError, KeyError):
        back = "the newest intact checkpoint is the one a restart takes"
    resume = f"{back}; the same command resumes (torchrun --max-restarts and a Slurm requeue do so by themselves)"
    rank = rank if rank is not None else int(os.environ.get("RANK", "0"))
    return comm_failure(err, rank, where, timeout, resume) or err


def main(argv: list[str] | None = None) -> int:
    setup_logging(rank=0)
    args = parse_args(argv)
    try:
        train(load_plan(args.config, args.overrides))
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
