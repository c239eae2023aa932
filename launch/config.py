"""Typed run configuration: YAML file + dotted CLI overrides -> validated dataclasses.

Unknown keys, wrong types and impossible values raise `ConfigError` with one line that names the
key and says what would be valid. Kept dependency-free (dataclasses + PyYAML) because the
validation rules are small and the error messages matter more than generality.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml


class UserError(ValueError):
    """Any user error (config, data, setup): the trainer prints its one-line message and exits 2."""


class ConfigError(UserError):
    """A user error in the configuration: the message is one line naming key and fix."""


@dataclass
class RunConfig:
    dir: str = "runs/tiny"
    resume: str = "auto"  # auto | none | <path to a checkpoint>
    overwrite: bool = False  # allow starting fresh in a run dir that already has metrics
    keep_checkpoints: int = 3  # newest complete checkpoints kept; older ones are deleted


@dataclass
class ModelConfig:
    preset: str = "tiny"
    # Any of these, when set, override the preset's value (e.g. a smaller test model).
    n_layer: Optional[int] = None
    d_model: Optional[int] = None
    n_head: Optional[int] = None
    max_seq_len: Optional[int] = None
    vocab_size: Optional[int] = None


@dataclass
class DataConfig:
    # A hub dataset name (e.g. HuggingFaceFW/fineweb-edu) or a builder such as "json"/"parquet"
    # together with data_files. Relative paths resolve against the project root.
    source: str = "json"
    subset: Optional[str] = None  # hub config name, e.g. sample-10BT
    data_files: list[str] = field(default_factory=list)
    split: str = "train"
    text_field: str = "text"
    tokenizer: str = "assets/tokenizers/gpt2"
    seq_len: int = 256
    val_tokens: int = 16384  # constant validation size: identical for every run
    val_batch_size: int = 8
    encode_batch_docs: int = 64  # documents tokenised per encode_batch call
    logical_shards: int = 16  # fixed split of the stream, independent of the world size


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    exempt_norms_and_embeddings: bool = False  # AdamW: no decay on norm gains / embeddings
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_coefficients: str = "polar_express"  # polar_express | jordan
    ns_dtype: str = "bf16"  # bf16 | fp32 (fp32 for exact equality tests)
    r_min: float = 0.1
    r_max: float = 5.0
    trust_eps: float = 1e-6
    grad_clip: float = 1.0  # global grad-norm clip; 0 disables
    diagnostics: bool = True  # Muon family: per-matrix trust-ratio diagnostics (diag/ in metrics)
    warmup_steps: int = 1000
    min_lr_ratio: float = 0.0  # cosine floor as a fraction of the peak LR


@dataclass
class TrainConfig:
    max_steps: int = 200
    tokens_per_step: int = 8192  # global; reached by gradient accumulation
    micro_batch_size: int = 8  # sequences per micro-batch per rank
    seed: int = 42
    log_every: int = 10
    eval_every: int = 50
    ckpt_every: int = 0  # 0: only the final checkpoint
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32
    device: str = "auto"  # auto | cpu | cuda
    progress: bool = True
    record_windows: bool = False  # debug: log a hash of every training window per rank (data audits)


@dataclass
class ParallelConfig:
    backend: str = "none"  # none | ddp | fsdp | zero1 | zero2
    meta_init: bool = True  # FSDP2: build on meta, init shards after sharding (never whole on a rank)
    activation_checkpointing: bool = False
    compile: bool = False  # torch.compile each block
    muon_mode: str = "owner"  # owner: NS once per matrix on one rank | replicate: everywhere (debug)


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotated type, allowing int -> float; raise on mismatch."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], key)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"config key '{key}' must be a list, got {value!r}")
        (item_tp,) = typing.get_args(tp)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # PyYAML reads `1e-3` (no dot) as a string: accept it as the number it means
            return float(value)
        except ValueError:
            pass
    if tp is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # e.g. `model.preset=125m` is fine, `run.resume=none` too
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(
            f"config key '{key}' must be {tp.__name__}, got {type(value).__name__} {value!r}"
        )
    return value


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(
                f"unknown config key '{full}' (valid keys here: {', '.join(sorted(names))})"
            )
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{full}' must be a mapping, got {value!r}")
            kwargs[key] = _build(tp, value, f"{full}.")
        else:
            kwargs[key] = _coerce(value, tp, full)
    return cls(**kwargs)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config key '{dotted}': '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """`a.b=1` strings -> nested dict; values parsed as YAML scalars (so 1e-3, true, [1,2])."""
    tree: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like section.key=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        _set_dotted(tree, key.strip(), value)
    return tree


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(path: Optional[str], overrides: list[str] = ()) -> Config:
    """Read a YAML file (optional), apply dotted overrides, type-check and validate."""
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file '{path}' not found (try configs/tiny.yaml)")
        try:
            tree = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as err:
            first = str(err).splitlines()[0]
            raise ConfigError(f"config file '{path}' is not valid YAML: {first}") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"config file '{path}' must hold a mapping of sections")
    tree = _deep_merge(tree, parse_overrides(list(overrides)))
    cfg = _build(Config, tree, "")
    validate(cfg)
    return cfg


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate_optim(o: OptimConfig) -> None:
    """Value checks of optim.* (also used by `orscale.build_optimizers` on configs built in code)."""
    _require(o.lr >= 0, f"optim.lr must be >= 0, got {o.lr}")
    _require(o.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {o.weight_decay}")
    _require(len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas),
             f"optim.betas must be two numbers in [0, 1), got {o.betas}")
    _require(0 <= o.momentum < 1, f"optim.momentum must be in [0, 1), got {o.momentum}")
    _require(0 < o.r_min <= o.r_max,
             f"optim.r_min ({o.r_min}) must be > 0 and <= optim.r_max ({o.r_max})")
    _require(o.ns_dtype in ("bf16", "fp32"), f"optim.ns_dtype must be bf16 or fp32, got {o.ns_dtype!r}")
    _require(o.ns_steps >= 1, f"optim.ns_steps must be >= 1, got {o.ns_steps}")
    _require(o.grad_clip >= 0, f"optim.grad_clip must be >= 0 (0 disables), got {o.grad_clip}")
    _require(o.warmup_steps >= 0, f"optim.warmup_steps must be >= 0, got {o.warmup_steps}")
    _require(0 <= o.min_lr_ratio <= 1, f"optim.min_lr_ratio must be in [0, 1], got {o.min_lr_ratio}")
    _require(o.trust_eps > 0, f"optim.trust_eps must be > 0, got {o.trust_eps}")
    _require(o.eps > 0, f"optim.eps must be > 0, got {o.eps}")


def validate(cfg: Config) -> None:
    """Value checks that types alone cannot express. Model-shape checks live with the model."""
    o, t, d = cfg.optim, cfg.train, cfg.data
    _require(cfg.run.resume in ("auto", "none") or bool(cfg.run.resume),
             "run.resume must be auto, none or a checkpoint path")
    validate_optim(o)
    _require(t.max_steps >= 1, f"train.max_steps must be >= 1, got {t.max_steps}")
    _require(t.micro_batch_size >= 1, f"train.micro_batch_size must be >= 1, got {t.micro_batch_size}")
    _require(t.log_every >= 1, f"train.log_every must be >= 1, got {t.log_every}")
    _require(t.eval_every >= 0, f"train.eval_every must be >= 0 (0: only at the end), got {t.eval_every}")
    _require(t.ckpt_every >= 0, f"train.ckpt_every must be >= 0, got {t.ckpt_every}")
    _require(t.dtype in ("auto", "bf16", "fp32"), f"train.dtype must be auto, bf16 or fp32, got {t.dtype!r}")
    _require(t.device in ("auto", "cpu", "cuda"), f"train.device must be auto, cpu or cuda, got {t.device!r}")
    _require(d.seq_len >= 2, f"data.seq_len must be >= 2, got {d.seq_len}")
    _require(d.val_tokens >= d.seq_len,
             f"data.val_tokens ({d.val_tokens}) must be >= data.seq_len ({d.seq_len})")
    _require(d.val_tokens % d.seq_len == 0,
             f"data.val_tokens ({d.val_tokens}) must be a multiple of data.seq_len ({d.seq_len})")
    _require(d.val_batch_size >= 1, f"data.val_batch_size must be >= 1, got {d.val_batch_size}")
    _require(d.encode_batch_docs >= 1, f"data.encode_batch_docs must be >= 1, got {d.encode_batch_docs}")
    _require(d.logical_shards >= 1, f"data.logical_shards must be >= 1, got {d.logical_shards}")
    _require(t.tokens_per_step % d.seq_len == 0,
             f"train.tokens_per_step ({t.tokens_per_step}) must be a multiple of data.seq_len ({d.seq_len})")
    _require(cfg.parallel.muon_mode in ("owner", "replicate"),
             f"parallel.muon_mode must be owner or replicate, got {cfg.parallel.muon_mode!r}")
    _require(cfg.parallel.backend in ("none", "ddp", "fsdp", "zero1", "zero2"),
             f"parallel.backend must be one of none, ddp, fsdp, zero1, zero2; got {cfg.parallel.backend!r}")


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
