"""Which kernel runs `F.scaled_dot_product_attention` (`train.attention`, docs/gpu.md): torch's own
order (`default`), or one backend, with the math reference behind it as the fallback:
FlashAttention-2 (`flash`), cuDNN's fused attention (`cudnn`), memory-efficient (`efficient`), the
reference itself (`math`). `auto` picks per board, from what the device check measured on it (its
attention A/B row); a board it has not measured keeps torch's order. The choice is made once, when
the config is resolved, so config.yaml and run.log record it.
"""

from __future__ import annotations

import contextlib
import re
from contextlib import AbstractContextManager

ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "default", "flash", "cudnn", "efficient", "math")
# Board name pattern -> the backend the device check measured fastest there (first match wins).
# Filled from the check's attention row: the one H200 run so far (2026-12-04) measured flash only (torch
# 2.11's default order), so nothing is set yet and every board keeps torch's order.
MEASURED_FASTEST: tuple[tuple[str, str], ...] = ()


def resolve_attention(setting: str, device_name: str | None) -> str:
    """`train.attention` for a device named `device_name` (None: not CUDA): auto -> the measured
    choice for the board, else `default`; anything else as given."""
    if setting != "auto":
        return setting
    if device_name is None:
        return "default"
    return next((b for pattern, b in MEASURED_FASTEST if re.search(pattern, device_name, re.IGNORECASE)), "default")


def attention_context(backend: str) -> AbstractContextManager:
    """The SDPA backend for the code run inside: the named one, with the math reference as the
    fallback for a call it cannot run (so it still runs, slowly); nothing changed for `default`."""
    if backend in ("default", "auto"):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    named = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }
    first = named[backend]
    return sdpa_kernel([first] if first is SDPBackend.MATH else [first, SDPBackend.MATH], set_priority=True)
