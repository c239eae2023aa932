"""The run configuration: YAML file + dotted CLI overrides -> the sections, composed.

Each section lives beside its owner and checks itself on construction: `model:` in
`models/presets.py`, `data:` in `data/data_config.py`, `optim:` in `orscale/optim_config.py`, `run:`
and `train:` in `launch/train_config.py`, `parallel:` in `launch/parallel_config.py`, `eval:` in
`evals/eval_config.py`. A registered component with settings of its own (an optimizer family, a
schedule, a data source, a loop feature) owns an options dataclass read from its own sub-section,
`<section>.<its section>` (`optim.cbp`, `optim.wsd`, `data.hub`, `train.sample`); this module reads
YAML, moves the keys of the format before those sub-sections to where they live now (one line each,
records/config_keys.py), type-checks every key and composes the sections and sub-sections.

Unknown keys, wrong types and impossible values raise `ConfigError` with one line that names the
key and says what would be valid.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from data.data_config import DataConfig
from data.sources.registry import SOURCES, source_of, source_options
from evals.eval_config import EvalConfig
from launch.backends.registry import AUTO, BACKENDS, backend_for, backend_options
from launch.errors import SECTION_ERRORS, ConfigError
from launch.features.registry import feature_options
from launch.nested import deep_merge, load_yaml, set_dotted, unknown_key, yaml_problem
from launch.parallel_config import ParallelConfig
from launch.train_config import RunConfig, TrainConfig, require
from models.presets import ModelConfig
from orscale.optim_config import OptimConfig
from orscale.registry import OPTIMIZERS, SCHEDULES, optim_options, optimizer_spec, schedule_of
from records.config_keys import upgrade


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # What reading and `resolve` found that the user should hear, said once logging is set up
    # (launch/run/build.py): notes, and warnings of what may be a mistake; not settings: no YAML key,
    # not in config.yaml.
    notes: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)
    warnings: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)


SECTIONS = "sections"  # the field of a section that holds its components' sub-sections


@dataclass(frozen=True)
class Choice:
    """One kind of component chosen by a key of a section (`optim.name` chooses an optimizer family):
    `chosen(section)`, the options classes of the one it chooses; `table()`, every component's by
    name; `strict`: a sub-section of another component, set to other than its defaults, is a one-line
    error (a schedule's, whose keys mean nothing to another), else a note (a sweep's base config may set
    one optimizer's options for every optimizer)."""

    section: str
    key: str
    chosen: Callable[[Any], tuple[type[Any], ...]]
    table: Callable[[], dict[str, tuple[type[Any], ...]]]
    strict: bool


CHOICES: tuple[Choice, ...] = (
    Choice(
        "optim",
        "name",
        lambda optim: optimizer_spec(optim.name).options,
        lambda: {name: spec.options for name, spec in OPTIMIZERS.items()},
        strict=False,
    ),
    Choice(
        "optim",
        "schedule",
        lambda optim: schedule_of(optim.schedule).options,
        lambda: {name: schedule.options for name, schedule in SCHEDULES.items()},
        strict=True,
    ),
    Choice(
        "parallel",
        "backend",
        # auto: the plan resolves it against the world size (launch/plan.py checks the rest then)
        lambda p: tuple(backend_options()) if p.backend == AUTO else backend_for(p.backend).options,
        lambda: {name: kind.options for name, kind in BACKENDS.items()},
        strict=True,
    ),
    Choice(
        "data",
        "source",
        lambda data: source_of(data).options,
        lambda: {source.listed_as or " or ".join(source.names): source.options for source in SOURCES},
        strict=False,
    ),
)


def component_options() -> dict[type, list[type[Any]]]:
    """Each section's sub-sections: the options classes of its registered components."""
    return {
        OptimConfig: optim_options(),
        DataConfig: source_options(),
        TrainConfig: feature_options(),
        ParallelConfig: backend_options(),
    }


def chosen_options(cfg: Config) -> dict[type, list[type[Any]]]:
    """The sub-sections `cfg`'s components read: each choice's (its optimizer's, schedule's, data
    source's), and every loop feature's (a feature's section says whether the run has it)."""
    chosen: dict[type, list[type[Any]]] = {TrainConfig: feature_options()}
    for choice in CHOICES:
        section = getattr(cfg, choice.section)
        chosen.setdefault(type(section), []).extend(choice.chosen(section))
    return chosen


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


def _build(cls: type, data: dict[str, Any], prefix: str, parts: dict[type, list[type[Any]]]) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init and f.name != SECTIONS}
    own = {o.section: o for o in parts.get(cls, [])}
    kwargs: dict[str, Any] = {}
    sections: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key in own:
            sections[key] = _build_section(own[key], value, full, parts)
        elif key not in names:
            raise ConfigError(unknown_key("config key", str(key), sorted(names | set(own)), prefix))
        elif dataclasses.is_dataclass(hints[key]):
            kwargs[key] = _build_section(hints[key], value, full, parts)
        else:
            kwargs[key] = _coerce(value, hints[key], full)
    for key in names - kwargs.keys():  # a section the tree leaves out still gets its components' sub-sections
        if dataclasses.is_dataclass(hints[key]):
            kwargs[key] = _build(hints[key], {}, f"{prefix}{key}.", parts)
    if own:
        kwargs[SECTIONS] = {
            name: sections.get(name) or _build(o, {}, f"{prefix}{name}.", parts) for name, o in own.items()
        }
    try:
        return cls(**kwargs)
    except SECTION_ERRORS as err:
        raise ConfigError(str(err)) from None


def _build_section(cls: Any, value: Any, full: str, parts: dict[type, list[type[Any]]]) -> Any:
    if not isinstance(value, dict):
        raise ConfigError(f"config key '{full}' must be a mapping, got {value!r}")
    return _build(cls, value, f"{full}.", parts)


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
    return config_from_tree(deep_merge(tree, parse_overrides(list(overrides))))


def config_from_tree(tree: dict[str, Any]) -> Config:
    """The config of `tree`, its sections as YAML writes them (a file with overrides, a run's
    config.yaml): keys that moved read where they live now (said in `notes`), every key
    type-checked, every section and its components' checks run."""
    tree, moved = upgrade(tree)
    cfg = _build(Config, tree, "", component_options())
    try:
        if cfg.parallel.backend != AUTO:
            backend_for(cfg.parallel.backend)  # a name of the table (auto: resolved by the plan)
        chosen = chosen_options(cfg)
        for check_ok, message in optimizer_spec(cfg.optim.name).checks(cfg.optim):
            require(check_ok, message)
    except SECTION_ERRORS as err:
        raise ConfigError(str(err)) from None
    read = {f"{section_name(p)}.{o.section}" for p, os in chosen.items() for o in os}
    cfg.notes = (*_moved_notes(moved, read), *_unread(cfg, tree))
    return cfg


def section_name(cls: type) -> str:
    """The YAML key of a section class (`optim` for OptimConfig)."""
    return next(f.name for f in dataclasses.fields(Config) if f.type in (cls, cls.__name__))


def _moved_notes(moved: Iterable[tuple[str, tuple[str, ...]]], read: set[str]) -> list[str]:
    """One line per key of the earlier format: where it lives now (a key that stayed where it was and
    also set a component's own key: said where that component runs)."""
    notes = []
    for old, new in moved:
        if old not in new:
            notes.append(f"config key '{old}' is now '{' and '.join(new)}' (read as that; write it so)")
            continue
        taken = [key for key in new if key != old and key.rsplit(".", 1)[0] in read]
        if taken:
            notes.append(f"config key '{old}' also set '{' and '.join(taken)}' (its own key now; write that)")
    return notes


def _unread(cfg: Config, tree: dict[str, Any] | None) -> list[str]:
    """One note per sub-section, other than its defaults, that none of the run's components reads (it is
    not recorded); a ConfigError for one that a strict choice's other component owns. `tree`: the
    sections as written (only the sub-sections it sets count); None: every one `cfg` holds."""
    lines = []
    read = {o for options in chosen_options(cfg).values() for o in options}
    for parent, options in component_options().items():
        name = section_name(parent)
        section = getattr(cfg, name)
        written = (tree or {}).get(name)
        for o in options:
            key = f"{name}.{o.section}"
            given = o.section in written if isinstance(written, dict) else tree is None
            if not given or o in read or section.sections.get(o.section, o()) == o():
                continue
            choice = next(c for c in CHOICES if c.section == name and any(o in os for os in c.table().values()))
            chooser = f"{name}.{choice.key}"
            owners = " or ".join(n for n, os in choice.table().items() if o in os)
            if choice.strict:
                raise ConfigError(
                    f"{key} needs {chooser}={owners} (got {getattr(section, choice.key)}); set "
                    f"{chooser}={owners} or leave {key} unset"
                )
            lines.append(
                f"{key} is set but this run ({chooser}={getattr(section, choice.key)}) does not read it: ignored"
            )
    return lines


def check_unread(cfg: Config) -> None:
    """A ConfigError (one line) for a sub-section, other than its defaults, that a strict choice's other
    component owns: what the plan checks once `auto` is resolved (an FSDP2 setting on one process)."""
    _unread(cfg, None)


def keep_chosen(cfg: Config) -> Config:
    """`cfg` with only the sub-sections its components read (what config.yaml records)."""
    out = copy.copy(cfg)
    for parent, options in chosen_options(cfg).items():
        name = section_name(parent)
        section = getattr(cfg, name)
        wanted = {o.section for o in options}
        kept = {key: value for key, value in getattr(section, SECTIONS).items() if key in wanted}
        setattr(out, name, dataclasses.replace(section, **{SECTIONS: kept}))
    return out


def resume_keys(policy: str) -> tuple[str, ...]:
    """The config.yaml keys (`config.<section>.<key>`; a whole section's with a trailing dot) whose change
    on resume has `policy`, as the sections declare it: "fixed" (the checkpoint cannot continue a run
    that changes it: the data's identity, the optimizer) or "routine" (logging, read-ahead, what only
    observes the run: no warning). A field declares it in its metadata (`{"resume": ...}`), a section
    or sub-section class in `resume_policy`; every other change is said as a warning."""
    keys: list[str] = []

    def visit(cls: type, prefix: str) -> None:
        if getattr(cls, "resume_policy", None) == policy:
            keys.append(f"{prefix}.")
            return
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.metadata.get("resume") == policy:
                keys.append(f"{prefix}.{f.name}")
            elif dataclasses.is_dataclass(hints[f.name]):
                visit(hints[f.name], f"{prefix}.{f.name}")
        for options in component_options().get(cls, []):
            visit(options, f"{prefix}.{options.section}")

    hints = typing.get_type_hints(Config)
    for f in dataclasses.fields(Config):
        if f.init:
            visit(hints[f.name], f"config.{f.name}")
    return tuple(keys)


def recorded(tree: dict[str, Any]) -> dict[str, Any]:
    """A config.yaml's sections (this format's or an earlier one's) as this format records them: keys
    that moved where they live now, the sub-sections its components read, every default filled in."""
    return to_dict(keep_chosen(config_from_tree(tree)))


def to_dict(cfg: Config) -> dict[str, Any]:
    """The config as config.yaml records it (its sections, each with its sub-sections; not `notes`)."""
    return {f.name: _record(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.init}


def _record(section: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if f.name == SECTIONS:
            out.update({name: _record(part) for name, part in value.items()})
        elif dataclasses.is_dataclass(value):
            out[f.name] = _record(value)
        else:
            out[f.name] = copy.deepcopy(value)
    return out
