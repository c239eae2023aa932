"""A `launch.trainer.Trainer` from the run's plan (launch/plan.py: every check already made, the same
line on every rank, before anything is read or written), built in the order a run needs: the process
group, the data (tokenizer, validation set, this rank's shards), the run directory (locked: one
writer) and where the run starts, then the engine, the checkpointer (a checkpoint restored), and the
loop features the plan has."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data import Documents, PackedLoader, TextTokenizer, build_val_set, load_tokenizer
from launch.checkpoint import Checkpointer, read_meta
from launch.config import Config, to_dict
from launch.engine.base import Engine
from launch.errors import ConfigError
from launch.plan import Plan
from launch.run.lock import RunLock
from launch.run.meter import StepMeter
from launch.run.provenance import git_commit
from launch.run.resume import check_resume_compatible, find_resume_point, prepare_run_dir
from launch.run.run_dir import RunDir
from launch.run.traces import check_memory_snapshot
from launch.run.train_state import TrainState
from launch.runtime.console import setup_logging
from launch.runtime.process_group import DistEnv, compute_dtype, init_distributed, rank0_decides, set_tf32
from launch.trainer import Trainer

log = logging.getLogger("orscale")


class RunComplete(Exception):
    """The run directory already holds this run's final checkpoint: there is nothing to do."""

    def __init__(self, step: int, path: Path) -> None:
        super().__init__(f"run already complete at step {step} ({path})")
        self.step, self.path = step, path


@dataclass
class Start:
    """What the launch set up before it read anything: the process group, TF32 as CUDA applied it
    (tf32 | ieee; None off CUDA)."""

    env: DistEnv
    tf32: str | None


def start_launch(plan: Plan) -> Start:
    """The process group, logging, what the plan has to say (once, not once per rank), and TF32."""
    cfg = plan.cfg
    env = init_distributed(plan.backend, cfg.train.device, cfg.parallel.init_timeout_s, cfg.run.dir)
    setup_logging(env.rank)
    check_memory_snapshot(cfg.train, env.device)
    for line in plan.warnings if env.is_main else []:
        log.warning(line)
    for note in plan.notes if env.is_main else []:  # what resolve changed, and keys read where they live now
        log.info(note)
    return Start(env, set_tf32(cfg.train.tf32, env.device))


def load_text(cfg: Config) -> TextTokenizer:
    """The tokenizer, checked against the model's vocabulary."""
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    vocab_size = cfg.model.resolve().vocab_size
    if tokenizer.vocab_size > vocab_size:
        raise ConfigError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but model.vocab_size is "
            f"{vocab_size}; raise model.vocab_size"
        )
    return tokenizer


def run_meta(cfg: Config, tokenizer: TextTokenizer) -> dict[str, Any]:
    """What every checkpoint records: the resolved config, the commit, the tokenizer, the model."""
    return {
        "config": to_dict(cfg),
        "git_commit": git_commit(),
        "tokenizer": tokenizer.describe(),
        "model": dataclasses.asdict(cfg.model.resolve()),
    }


def resume_point(plan: Plan, env: DistEnv, run_dir: RunDir, lock: RunLock, meta: dict[str, Any]) -> Path | None:
    """Rank 0 takes the lock and finds the checkpoint this run continues from (checked against this
    config and backend); every rank gets the answer. RunComplete when it is the final one."""
    cfg = plan.cfg
    run_path = Path(cfg.run.dir)

    def decide() -> Path | None:
        holder = lock.acquire()
        if holder is not None:
            raise ConfigError(
                f"run.dir '{run_dir.path}' is in use by another launch ({holder}); wait for it "
                "to end, stop it, or choose another run.dir"
            )
        found = find_resume_point(cfg.run, meta["config"], run_dir)
        if found is not None:
            branch = bool(cfg.run.init_from) and run_path.resolve() not in found.resolve().parents
            check_resume_compatible(read_meta(found), meta, branch_start=found if branch else None)
            plan.backend.engine_class().check_checkpoint(found, env.world_size)
        return found

    resume_from = rank0_decides(decide)
    if resume_from is not None and read_meta(resume_from)["step"] >= cfg.train.max_steps:
        started_elsewhere = run_path.resolve() not in resume_from.resolve().parents
        if cfg.run.init_from and cfg.run.resume == "auto" and started_elsewhere:  # run.init_from's
            raise ConfigError(
                f"run.init_from's checkpoint {resume_from} is at step {read_meta(resume_from)['step']}, "
                f"not before train.max_steps={cfg.train.max_steps}: there would be nothing to train"
            )
        raise RunComplete(read_meta(resume_from)["step"], resume_from)
    return resume_from


@dataclass
class Parts:
    """What a checkpoint restores: the engine (sharded), and each rank's loader, train state and
    the meter's logging window; the checkpointer that saves and loads them."""

    engine: Engine
    loader: PackedLoader
    state: TrainState
    meter: StepMeter
    checkpointer: Checkpointer


def build_parts(plan: Plan, start: Start, docs: Documents, val_end: tuple[int, int], run_dir: RunDir) -> Parts:
    """The engine (model, parallelism, optimizers), the loader after the validation windows, the
    train state, the meter and the checkpointer of them all (collective)."""
    cfg, env = plan.cfg, start.env
    windows = cfg.train.tokens_per_step // cfg.data.seq_len
    loader = PackedLoader(
        cfg.data, docs, first=val_end, windows_per_step=windows, rank=env.rank, world_size=env.world_size
    )
    dtype = compute_dtype(cfg.train.dtype, env.device)
    engine = plan.backend.build_engine(
        cfg.model.resolve(), cfg.parallel, cfg.optim, cfg.train, env, dtype, plan.accum_steps
    )
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
    return Parts(engine, loader, state, meter, checkpointer)


def build_trainer(plan: Plan) -> Trainer:
    """Build and (if there is a checkpoint) restore everything; open the run directory. Raises
    RunComplete when the run directory already holds this run's final checkpoint."""
    cfg = plan.cfg
    start = start_launch(plan)
    env, accum_steps = start.env, plan.accum_steps
    tokenizer = load_text(cfg)
    docs = plan.source.open(cfg.data, tokenizer)
    # Read and tokenised once, on rank 0 (10M tokens for the paper's presets), then broadcast: 64
    # ranks do not each download the validation documents, and a data error is one line from rank 0.
    val, val_end = rank0_decides(lambda: build_val_set(cfg.data, docs))
    run_dir, lock = RunDir(cfg.run.dir, active=env.is_main), RunLock(Path(cfg.run.dir))
    meta = run_meta(cfg, tokenizer)
    try:
        resume_from = resume_point(plan, env, run_dir, lock, meta)
        parts = build_parts(plan, start, docs, val_end, run_dir)
        if resume_from is not None:
            parts.checkpointer.load(resume_from)
        prepare_run_dir(run_dir, parts.state.step)
    except BaseException:
        lock.release(discard=True)  # nothing ran: leave no lock file or directory the user did not have
        raise
    model = parts.engine.model
    extra = {
        "params": model.num_params(),
        "non_embedding_params": model.num_params(non_embedding=True),
        "model": meta["model"],  # the resolved shape: a run directory describes itself (the report reads it)
        "accum_steps": accum_steps,
        "data": docs.describe(),
        "val_end": {"piece": val_end[0], "row": val_end[1]},
        "val_windows": len(val),
        "device": str(env.device),
        "dtype": str(parts.engine.dtype),
        "fp32_matmul": start.tf32,  # train.tf32 as CUDA applied it (tf32 | ieee); None off CUDA
        "world_size": env.world_size,
        "tokenizer": tokenizer.describe(),
        "resumed_from": str(resume_from) if resume_from else None,
    }
    run_dir.open(meta["config"], cfg.train, extra=extra)
    step = parts.state.step
    begins = f"resuming at step {step}" if step else "fresh start"
    log.info("model: %.2fM parameters; %s; %s", extra["params"] / 1e6, plan.step_shape(), begins)
    return Trainer(
        cfg=cfg,
        env=env,
        engine=parts.engine,
        loader=parts.loader,
        state=parts.state,
        meter=parts.meter,
        checkpointer=parts.checkpointer,
        run_dir=run_dir,
        lock=lock,
        tokenizer=tokenizer,
        val=val,
        meta=meta,
        accum_steps=accum_steps,
        features=[feature(cfg) for feature in plan.features],
        start_step=step,
    )
