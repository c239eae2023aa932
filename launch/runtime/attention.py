"""Which kernel runs `F.scaled_dot_product_attention` (`train.attention`, docs/gpu.md): torch's own
order (`default`), or one backend, with the math reference behind it as the fallback:
FlashAttention-2 (`flash`), cuDNN's fused attention (`cudnn`), memory-efficient (`efficient`), the
reference itself (`math`). `auto` picks per board, from what the device check measured on it (its
attention A/B row); a board it has not measured keeps torch's order. The choice is made once, when
the config is resolved, so config.yaml and run.log record it; `pin_attention` hands it to the
model's attention layers, which enter it inside their forward, where torch.compile traces it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from torch import nn
from torch.nn.attention import SDPBackend

from models.gpt import Attention

ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "default", "flash", "cudnn", "efficient", "math")
# Board name pattern -> the backend the device check measured fastest there (first match wins).
# Filled from the check's attention row: the one H200 run so far (2026-12-04) measured flash only (torch
# 2.11's default order), so nothing is set yet and every board keeps torch's order.
MEASURED_FASTEST: tuple[tuple[str, str], ...] = ()
_NAMED = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
# The ATen operator each fused backend runs as (its name in a profiler trace, eager or compiled: inductor
# calls these kernels as they are), most specific first; math has none once compiled (inductor
# decomposes it into matmuls and a softmax), so a step that ran attention but none of these ran math.
_OPS = (
    ("cudnn", "_scaled_dot_product_cudnn_attention"),
    ("efficient", "_scaled_dot_product_efficient_attention"),
    ("flash", "_scaled_dot_product_flash_attention"),  # also its CPU kernel, ..._flash_attention_for_cpu
    ("math", "_scaled_dot_product_attention_math"),
)


def resolve_attention(setting: str, device_name: str | None) -> str:
    """`train.attention` for a device named `device_name` (None: not CUDA): auto -> the measured
    choice for the board, else `default`; anything else as given."""
    if setting != "auto":
        return setting
    if device_name is None:
        return "default"
    return next((b for pattern, b in MEASURED_FASTEST if re.search(pattern, device_name, re.IGNORECASE)), "default")


def sdpa_backends(backend: str) -> tuple[SDPBackend, ...]:
    """The SDPA kernels `backend` allows, first choice first: the named one with the math reference
    behind it for a call it cannot run (so it still runs, slowly); none (torch's order) for `default`."""
    if backend in ("default", "auto"):
        return ()
    first = _NAMED[backend]
    return (first,) if first is SDPBackend.MATH else (first, SDPBackend.MATH)


def pin_attention(model: nn.Module, backend: str) -> None:
    """Every attention layer of `model` runs `backend`'s kernels (`sdpa_backends`), chosen inside its
    forward: a compiled block traces the choice, so Dynamo's guards and the on-disk compile caches
    tell one backend's graph from another's."""
    for module in model.modules():
        if isinstance(module, Attention):
            module.sdpa_backends = sdpa_backends(backend)


def attention_ran(op_names: Iterable[str]) -> str:
    """Which SDPA backend a profiled step executed, from its operator names: the fused kernels seen
    ("flash", "cudnn+flash" if several), else "math"."""
    names = list(op_names)
    seen = [backend for backend, op in _OPS if any(op in n for n in names)]
    fused = [b for b in seen if b != "math"]
    return "+".join(fused) if fused else "math"
