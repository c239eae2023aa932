"""The run configuration: YAML file + dotted CLI overrides -> the sections, composed.

Each section lives beside its owner and checks itself on construction: `model:` in
`models/presets.py`, `data:` in `data/data_config.py`, `optim:` in `orscale/optim_config.py`, `run:`
and `train:` in `launch/train_config.py`; `parallel:` lives here. This module reads YAML, applies
overrides, type-checks every key, and `resolve`s the result once against the launch's facts
(launch/environment.py): the checks that span sections, then what `auto` and the world size decide.
The sections themselves read no environment, and nothing changes the resolved config afterwards.

Unknown keys, wrong types and impossible values raise `ConfigError` with one line that names the
key and says what would be valid. Kept dependency-free (dataclasses + PyYAML) because the rules are
small and the error messages matter more than generality.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from data.data_config import DataConfig
from evals.eval_config import EvalConfig
from launch.backends import AUTO, BACKEND_NAMES, backend_for, resolve_auto
from launch.environment import EnvFacts
from launch.errors import SECTION_ERRORS, ConfigError
from launch.nested import deep_merge, load_yaml, set_dotted, unknown_key, yaml_problem
from launch.runtime.attention import resolve_attention
from launch.train_config import RunConfig, TrainConfig, at_least, require
from models.presets import ModelConfig
from orscale.distributed.owners import DEFAULT_BUCKET_NUMEL, MODES
from orscale.optim_config import OptimConfig

COMPILE: tuple[str, ...] = ("auto", "none", "blocks", "model")
PARAM_DTYPES: tuple[str, ...] = ("auto", "bf16", "fp32")


@dataclass
class ParallelConfig:
    # none | ddp | fsdp | zero1 | zero2 (launch/backends/) | auto: none for one process, fsdp when
    # launched on several (resolved by `resolve`, so config.yaml records the backend that ran)
    backend: str = "auto"
    meta_init: bool = True  # FSDP2: build on meta, init shards after sharding (never whole on a rank)
    activation_checkpointing: bool = False
    # auto (blocks on CUDA, none on CPU) | none | blocks (each block, and the head with its loss) | model (whole)
    compile: str | bool = "auto"
    # FSDP2: free each block's gathered params after its forward (true), keep them for backward
    # (false: faster, more memory), or auto (false on one node, true across nodes).
    reshard_after_forward: str | bool = "auto"
    # FSDP2 param dtype in forward/backward: auto (bf16 with train.dtype bf16 on CUDA) | bf16 | fp32.
    # Gradients are reduced in fp32 either way; `bf16` runs the bf16-param policy on CPU too (tests).
    param_dtype: str = "auto"
    muon_mode: str = "owner"  # owner: NS once per matrix on one rank | replicate: everywhere (debug)
    # Collective timeouts, seconds: start-up (process groups, rank 0's validation set and resume
    # decision, the checkpoint load), then every collective from the first step on. A rank that stops
    # answering ends the run after comm_timeout_s instead of hanging it (launch/runtime/hangs.py).
    init_timeout_s: float = 1800.0
    comm_timeout_s: float = 600.0
    # HSDP (FSDP2 on a 2-D mesh): shard within groups of dp_shard ranks (a node), replicate across
    # dp_replicate of them; dp_shard -1: the rest of the world (resolved here, recorded in config.yaml).
    dp_replicate: int = 1
    dp_shard: int = -1
    # HSDP + Muon family: split the Newton–Schulz work across the replica groups too (1/R of the
    # FLOPs per rank for Q rows sent across "replicate"; docs/scaling.md says when it pays).
    muon_replica_split: bool = False
    muon_overlap: bool = True  # owner exchange: bucket k+1 in flight while bucket k's NS runs
    muon_bucket_numel: int = DEFAULT_BUCKET_NUMEL  # whole-matrix elements per exchange bucket

    def __post_init__(self) -> None:
        # YAML booleans kept meaning what they meant: compile true = blocks, false = none.
        if isinstance(self.compile, bool):
            self.compile = "blocks" if self.compile else "none"
        if isinstance(self.reshard_after_forward, bool):
            self.reshard_after_forward = "true" if self.reshard_after_forward else "false"
        require(self.compile in COMPILE, f"parallel.compile must be one of {', '.join(COMPILE)}, got {self.compile!r}")
        require(
            self.reshard_after_forward in ("auto", "true", "false"),
            f"parallel.reshard_after_forward must be auto, true or false, got {self.reshard_after_forward!r}",
        )
        require(
            self.param_dtype in PARAM_DTYPES,
            f"parallel.param_dtype must be one of {', '.join(PARAM_DTYPES)}, got {self.param_dtype!r}",
        )
        require(
            self.backend in (*BACKEND_NAMES, AUTO),
            f"parallel.backend must be one of {', '.join(BACKEND_NAMES)} or auto; got {self.backend!r}",
        )
        require(
            self.muon_mode in MODES, f"parallel.muon_mode must be one of {', '.join(MODES)}, got {self.muon_mode!r}"
        )
        for key in ("init_timeout_s", "comm_timeout_s"):
            require(getattr(self, key) > 0, f"parallel.{key} must be > 0 seconds, got {getattr(self, key)}")
        self._check_shape()

    def _check_shape(self) -> None:
        """What any world size checks of the mesh settings (`for_world` checks the rest)."""
        at_least("parallel", self, dp_replicate=(1, "1: no replication"))
        require(
            self.dp_shard == -1 or self.dp_shard >= 1,
            f"parallel.dp_shard must be >= 1, or -1 for the rest of the world, got {self.dp_shard}",
        )
        at_least("parallel", self, muon_bucket_numel=1)

    def for_world(self, world: int) -> ParallelConfig:
        """This section as it runs on `world` processes: backend auto resolved (none for one process,
        fsdp for several), dp_shard -1 resolved to the rest of the world; one-line ConfigError for a
        mesh that does not fit: dp_replicate × dp_shard = the world size."""
        backend = resolve_auto(self.backend, world)
        r = self.dp_replicate
        self._check_shape()
        backend_for(backend).check_layout(self)
        require(
            world % r == 0,
            f"parallel.dp_replicate ({r}) must divide the world size ({world}); use a divisor of {world}",
        )
        shard = world // r if self.dp_shard == -1 else self.dp_shard
        fix = f"parallel.dp_replicate={world // shard} or " if world % shard == 0 else ""
        require(
            r * shard == world,
            f"parallel.dp_replicate ({r}) x parallel.dp_shard ({shard}) must equal the world size "
            f"({world}); set {fix}leave parallel.dp_shard unset (the rest of the world)",
        )
        require(
            not self.muon_replica_split or (r > 1 and self.muon_mode == "owner"),
            "parallel.muon_replica_split=true splits Newton–Schulz owners across the replica groups: it needs "
            f"parallel.dp_replicate > 1 (got {r}) and parallel.muon_mode=owner (got {self.muon_mode})",
        )
        return dataclasses.replace(self, backend=backend, dp_shard=shard)


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # What `resolve` derived that the user should hear, said once logging is set up (launch/run/setup.py);
    # not a setting: no YAML key, not in config.yaml.
    notes: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotated type, allowing int -> float; raise on mismatch. A Union
    takes the first of its types that accepts the value."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        arms = [a for a in typing.get_args(tp) if a is not type(None)]
        for arm in arms:
            try:
                return _coerce(value, arm, key)
            except ConfigError:
                continue
        names = " or ".join(getattr(a, "__name__", str(a)) for a in arms)
        raise ConfigError(f"config key '{key}' must be {names}, got {type(value).__name__} {value!r}")
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str) and item_tp is str:
            value = [value]  # one path where a list of paths is expected
        if not isinstance(value, list):
            raise ConfigError(f"config key '{key}' must be a list, got {value!r}")
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if tp is float and isinstance(value, str) and value.strip().lower().lstrip("+-") in ("inf", "infinity", "nan"):
        value = float(value)  # `optim.lr=inf` means what it says: refused below as not finite
    if tp is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config key '{key}' must be a finite number, got {value!r}")
    if tp is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # e.g. `run.dir=2024` names a directory
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        hint = " (write the number without quotes)" if tp in (int, float) and isinstance(value, str) else ""
        raise ConfigError(f"config key '{key}' must be {tp.__name__}, got {type(value).__name__} {value!r}{hint}")
    return value


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(unknown_key("config key", str(key), sorted(names), prefix))
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{full}' must be a mapping, got {value!r}")
            kwargs[key] = _build(tp, value, f"{full}.")  # type: ignore[arg-type]  # a dataclass type here
        else:
            kwargs[key] = _coerce(value, tp, full)
    try:
        return cls(**kwargs)
    except SECTION_ERRORS as err:
        raise ConfigError(str(err)) from None


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """`a.b=1` strings -> nested dict; values parsed as YAML scalars (so 1e-3, true, [1,2])."""
    tree: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like section.key=value")
        key, raw = item.split("=", 1)
        try:
            value = load_yaml(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        try:
            set_dotted(tree, key.strip(), value)
        except ValueError as err:
            raise ConfigError(f"config key '{key.strip()}': {err}") from None
    return tree


def load_config(path: str | None, overrides: list[str] | tuple[str, ...] = (), facts: EnvFacts | None = None) -> Config:
    """Read a YAML file (optional), apply dotted overrides, type-check, and `resolve` the result
    against `facts` (default: this process's, `EnvFacts.from_env`)."""
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file '{path}' not found (try configs/tiny.yaml)")
        try:
            tree = load_yaml(p.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"config file '{path}' is not valid YAML at {yaml_problem(err)}") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"config file '{path}' must hold a mapping of sections")
    tree = deep_merge(tree, parse_overrides(list(overrides)))
    cfg = _build(Config, tree, "")
    return resolve(cfg, facts if facts is not None else EnvFacts.from_env(cfg.train))


def resolve(cfg: Config, facts: EnvFacts) -> Config:
    """The config that runs under `facts`, as a new Config (`cfg` is left as it was); what config.yaml
    and run.log record. Checks what spans sections (`validate`) and resolves:
    `parallel`: backend auto and dp_shard -1 for the world size (`ParallelConfig.for_world`);
    the `auto` settings that depend on the device (docs/gpu.md, "One GPU"): on CUDA, `parallel.compile`
    is blocks (compiled blocks, head and loss: the fastest measured) and AdamW fused (foreach on
    FSDP2's DTensors under a torch that leaks there); on a CPU, eager and foreach; `train.attention`
    auto becomes the backend measured fastest on this board, else torch's order;
    `train.micro_batch_size`: at most a rank's share of a step (`fit_micro_batch`, said in `notes`)."""
    from orscale.factories import adamw_auto

    resolved = copy.deepcopy(cfg)  # the sections are filled in below; the caller's stay as they were
    resolved.parallel = cfg.parallel.for_world(facts.world_size)
    validate(resolved)
    parallel, optim, train = resolved.parallel, resolved.optim, resolved.train
    if parallel.compile == "auto":
        parallel.compile = "blocks" if facts.cuda else "none"
    if optim.fused == "auto":
        optim.fused = adamw_auto(facts.cuda, dtensor_params=backend_for(parallel.backend).shards_parameters)
    if train.attention == "auto":
        train.attention = resolve_attention("auto", facts.device_name if facts.cuda else None)
    train.micro_batch_size, note = fit_micro_batch(train, resolved.data.seq_len, facts.world_size)
    resolved.notes = (note,) if note else ()
    return resolved


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


def validate(cfg: Config) -> None:
    """The checks that span sections (each section has checked itself on construction)."""
    t, d = cfg.train, cfg.data
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
    backend_for(cfg.parallel.backend).check_param_dtype(cfg.parallel)
    windows = t.tokens_per_step // d.seq_len
    require(
        windows % d.logical_shards == 0,
        f"a step's {windows} windows (train.tokens_per_step / data.seq_len) must be a multiple of "
        f"data.logical_shards ({d.logical_shards}) so a step draws the same windows at any world size; "
        f"set data.logical_shards={math.gcd(windows, d.logical_shards)} (it must also be a multiple of the "
        f"number of ranks) or train.tokens_per_step to a multiple of {d.logical_shards * d.seq_len}",
    )


def to_dict(cfg: Config) -> dict[str, Any]:
    """The config as config.yaml records it (its sections; not `notes`)."""
    return {f.name: dataclasses.asdict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.init}
