"""What a plain `python train.py` resolves to on one GPU (docs/gpu.md, "One GPU"): no sharding, AdamW's
fused kernel, compiled blocks with the head and loss; checked with CUDA's answer given to the CPU.
The resolved values are what config.yaml and run.log record (`to_dict` of the loaded config)."""

from __future__ import annotations

import pytest
import torch

from launch.config import to_dict
from launch.plan import load_config
from orscale.adamw import adamw_auto
from tests.helpers import ROOT


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for var in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("config", [None, "configs/125m.yaml", "configs/1.1b.yaml"])
def test_one_gpu_runs_unsharded_with_fused_adamw_and_compiled_blocks(cuda: None, config: str | None) -> None:
    cfg = load_config(str(ROOT / config) if config else None)
    resolved = to_dict(cfg)
    assert resolved["parallel"]["backend"] == "none"  # FSDP2 on one GPU measured 0.967 of its tokens/s
    assert resolved["optim"]["fused"] == "fused"  # foreach: 2.7 ms a 125m step against 1.0 ms
    assert resolved["parallel"]["compile"] == "blocks"


def test_several_gpus_shard_and_a_cpu_runs_eager(monkeypatch: pytest.MonkeyPatch, cuda: None) -> None:
    monkeypatch.setenv("WORLD_SIZE", "8")
    cfg = load_config(str(ROOT / "configs/125m.yaml"))
    assert (cfg.parallel.backend, cfg.parallel.compile) == ("fsdp", "blocks")
    assert cfg.optim.fused == adamw_auto(True, dtensor_params=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("WORLD_SIZE")
    cfg = load_config(None)
    assert (cfg.parallel.backend, cfg.parallel.compile, cfg.optim.fused) == ("none", "none", "foreach")
    cfg = load_config(None, ["train.device=cuda"])  # asked for CUDA: CUDA's defaults (a missing GPU is refused later)
    assert (cfg.parallel.compile, cfg.optim.fused) == ("blocks", "fused")


def test_explicit_settings_are_kept(cuda: None) -> None:
    cfg = load_config(None, ["parallel.compile=model", "optim.fused=foreach", "parallel.backend=none"])
    assert (cfg.parallel.compile, cfg.optim.fused) == ("model", "foreach")
    assert load_config(None, ["parallel.compile=false"]).parallel.compile == "none"  # YAML false still means none


def test_adamw_auto_avoids_fused_on_dtensors_only_where_torch_leaks() -> None:
    assert adamw_auto(True, dtensor_params=True, version="2.11.0+cu130") == "foreach"
    assert adamw_auto(True, dtensor_params=True, version="2.13.0") == "fused"
    assert adamw_auto(True, dtensor_params=False, version="2.11.0") == "fused"
    assert adamw_auto(False, dtensor_params=False) == "foreach"


# ---------------------------------------------------------------- the attention kernel
def test_attention_auto_takes_the_backend_measured_on_the_board(monkeypatch: pytest.MonkeyPatch, cuda: None) -> None:
    import launch.environment as environment
    from launch.runtime import attention

    monkeypatch.setattr(attention, "MEASURED_FASTEST", ((r"H200", "cudnn"),))
    monkeypatch.setattr(environment, "_cuda_device_name", lambda: "NVIDIA H200")
    assert load_config(None).train.attention == "cudnn"
    monkeypatch.setattr(environment, "_cuda_device_name", lambda: "NVIDIA A100-SXM4-80GB")
    assert load_config(None).train.attention == "default"  # not measured there: torch's order
    assert load_config(None, ["train.attention=flash"]).train.attention == "flash"
    assert load_config(None, ["train.device=cpu"]).train.attention == "default"


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("backend, kernel", [("math", "math"), ("flash", "flash_attention_for_cpu")])
def test_a_pinned_attention_layer_runs_the_named_kernel(backend: str, kernel: str) -> None:
    """On the CPU too: SDPA runs the named backend first (seen in the profiler's op names), chosen by
    the layer itself, with no context around the call; the global choice is left as it was."""
    from torch.profiler import profile

    from launch.runtime.attention import attention_ran, pin_attention
    from models.gpt import Attention, GPTConfig

    layer = Attention(GPTConfig(n_layer=1, d_model=16, n_head=2, max_seq_len=8, vocab_size=32))
    pin_attention(layer, backend)
    x, cos, sin = torch.randn(1, 8, 16), torch.ones(8, 8), torch.zeros(8, 8)
    before = torch._C._get_sdp_priority_order()
    with profile() as prof:
        layer(x, cos, sin)
    names = {e.name for e in prof.events()}
    assert any(kernel in n for n in names), sorted(n for n in names if "attention" in n)
    assert attention_ran(names) == backend
    assert torch._C._get_sdp_priority_order() == before and torch.backends.cuda.flash_sdp_enabled()
