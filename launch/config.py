"""The run configuration: YAML file + dotted CLI overrides -> the sections, composed.

Each section lives beside its owner and checks itself on construction: `model:` in
`models/presets.py`, `data:` in `data/data_config.py`, `optim:` in `orscale/optim_config.py`, `run:`
and `train:` in `launch/train_config.py`, `parallel:` in `launch/parallel_config.py`, and a loop
feature's own `train.<section>` in its file under launch/features/. This module reads YAML, applies
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
from typing import TYPE_CHECKING, Any

import yaml

from data.data_config import DataConfig
from evals.eval_config import EvalConfig
from launch.backends import backend_for
from launch.environment import EnvFacts
from launch.errors import SECTION_ERRORS, ConfigError
from launch.features.registry import feature_sections
from launch.nested import deep_merge, load_yaml, set_dotted, unknown_key, yaml_problem
from launch.parallel_config import ParallelConfig
from launch.runtime.attention import resolve_attention
from launch.train_config import RunConfig, TrainConfig, require
from models.presets import ModelConfig
from orscale.optim_config import OptimConfig

if TYPE_CHECKING:
    TrainSections = TrainConfig
else:
    # `train:` with each loop feature's own section (`train.<section>`, launch/features/): a feature adds
    # its section in its own file, and the config reads, checks and records it like any other.
    TrainSections = dataclasses.make_dataclass(
        "TrainSections",
        [(name, options, field(default_factory=options)) for name, options in feature_sections()],
        bases=(TrainConfig,),
    )
    TrainSections.__module__ = __name__  # so a pickled config finds its class here


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainSections = field(default_factory=TrainSections)
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
        hint = " (write the number without quotes)" if tp in (int, float) and _is_number(value) else ""
        raise ConfigError(f"config key '{key}' must be {tp.__name__}, got {type(value).__name__} {value!r}{hint}")
    return value


def _is_number(value: Any) -> bool:
    """Whether `value` is a number written as a string (a quoted `'5'`), not a word."""
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return isinstance(value, str)


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
    cfg = read_config(path, overrides)
    return resolve(cfg, facts if facts is not None else EnvFacts.from_env(cfg.train))


def read_config(path: str | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """A YAML file (optional) with dotted overrides applied, type-checked, each section checked; not
    yet resolved against a launch (`resolve`)."""
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
    return _build(Config, tree, "")


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
