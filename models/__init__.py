from models.gpt import GPT, GPTConfig
from models.presets import PRESETS, get_preset

__all__ = ["GPT", "GPTConfig", "PRESETS", "get_preset"]
