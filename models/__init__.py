"""The paper's GPT (single-device code, no parallelism), its size presets and config section, and
the name mapping to Hugging Face `transformers`."""

from models.gpt import GPT, GPTConfig
from models.presets import PRESETS, ModelConfig, ModelConfigError, get_preset, param_counts

__all__ = ["GPT", "GPTConfig", "ModelConfig", "ModelConfigError", "PRESETS", "get_preset", "param_counts"]
