"""Model size presets (the paper's four scales, docs/algorithm.md "The paper's language-model setup",
and a CPU-sized `tiny`) and the `model:` section of a run config, which resolves to a `GPTConfig`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any

from models.gpt import GPTConfig


class ModelConfigError(ValueError):
    """A user error in the `model:` section: one line naming the key and the fix."""


PRESETS: dict[str, GPTConfig] = {
    # tiny: a few minutes on 2 CPU cores, same architecture and vocabulary as the paper's.
    "tiny": GPTConfig(n_layer=4, d_model=128, n_head=4, max_seq_len=256),
    "125m": GPTConfig(n_layer=12, d_model=768, n_head=12, max_seq_len=1024),
    "399m": GPTConfig(n_layer=12, d_model=1536, n_head=12, max_seq_len=8192),
    "545m": GPTConfig(n_layer=14, d_model=1792, n_head=14, max_seq_len=4096),
    "1.1b": GPTConfig(n_layer=18, d_model=2304, n_head=18, max_seq_len=4096),
}

# Parameter counts the paper logged (docs/algorithm.md, the setup table), checked by the tests.
PAPER_PARAM_COUNTS = {"125m": 123.6e6, "399m": 417.0e6, "545m": 629.7e6, "1.1b": 1262.6e6}


def get_preset(name: str, **overrides: int | bool | None) -> GPTConfig:
    """Preset by name with optional field overrides (None values are ignored)."""
    if name not in PRESETS:
        raise ModelConfigError(f"unknown model.preset '{name}' (valid: {', '.join(PRESETS)})")
    changes: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
    try:
        return replace(PRESETS[name], **changes)
    except ValueError as err:  # GPTConfig's own shape checks, already one line naming model.*
        raise ModelConfigError(str(err)) from None


@dataclass
class ModelConfig:
    """The `model:` section: a preset, and any field that, when set, overrides the preset's value
    (e.g. a smaller test model). Checked on construction: the preset exists and the resulting
    shapes are valid."""

    preset: str = "tiny"
    n_layer: int | None = None
    d_model: int | None = None
    n_head: int | None = None
    max_seq_len: int | None = None
    vocab_size: int | None = None
    center_mlp: bool | None = None  # CBP's M2 in every MLP down-projection

    def __post_init__(self) -> None:
        self.resolve()

    def resolve(self) -> GPTConfig:
        """The preset with the overrides applied: resolved once, again only if a field changed."""
        key = dataclasses.astuple(self)
        cached = self.__dict__.get("_resolved")
        if cached is None or cached[0] != key:
            cfg = get_preset(
                self.preset,
                n_layer=self.n_layer,
                d_model=self.d_model,
                n_head=self.n_head,
                max_seq_len=self.max_seq_len,
                vocab_size=self.vocab_size,
                center_mlp=self.center_mlp,
            )
            cached = (key, cfg)
            self.__dict__["_resolved"] = cached  # not a field: asdict() and the saved config ignore it
        return cached[1]


def param_counts(cfg: GPTConfig) -> tuple[int, int]:
    """(total, non-embedding) parameters of `models.gpt.GPT(cfg)` from the shapes alone (the tied
    embedding/head counted once): what `GPT.num_params` counts, without building the model."""
    d, L = cfg.d_model, cfg.n_layer
    per_block = 3 * d * d + d * d + 4 * d * d + 4 * d * d + 2 * d  # qkv, out, MLP up and down, two norm gains
    if cfg.center_mlp:
        per_block += d  # the centred down-projection's bias (its input mean is a buffer)
    non_embedding = L * per_block + d  # + the final norm's gain
    return non_embedding + cfg.vocab_size * d, non_embedding
