"""CUDA-only behaviour, guarded on CPU: each test runs the code with CUDA's question
answered for the CPU and asserts what a GPU run would do.

1. ZeRO computes in the run's dtype: DeepSpeed's forward asks `torch.is_autocast_enabled()` (CUDA's
   autocast when no device is named); answered for the CPU, it must keep bf16 matmuls, and still
   reduce gradients in fp32.
2. A ZeRO resume places AdamW's `step` by torch's rule: on the parameter's device for a fused group
   (a partition on the `meta` device stands for CUDA), where it was otherwise.
3. Throughput counts training time only, with an evaluation inside a logging window.
4. `train.tf32` sets CUDA's fp32 matmul precision and the run records it.
5. Downstream scoring of a compiled model meets a few shapes, not a graph per length.
7. Fused AdamW on FSDP2 parameters keeps no DTensorSpec per step; the leaking torch versions fall
   back to foreach.
8. The attention kernel a run asks for is the one its compiled blocks execute, with torch.compile's
   on-disk caches warm from a run that asked for another.
"""

from __future__ import annotations

import gc
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from launch.backends.registry import backend_for
from launch.run.meter import StepMeter
from launch.runtime.process_group import DistEnv, set_tf32
from orscale.adamw import FUSED_DTENSOR_LEAK, adamw_implementation, fused_leaks
from tests.orscale import zero_worker as zw
from tests.pool import rank_pool

CPU = DistEnv(0, 1, 0, torch.device("cpu"), "none")


# ------------------------------------------------------------------ 1. ZeRO's compute dtype
def _zero_forward(dtype_name: str) -> dict:
    """One ZeRO-2 micro-batch under the engine's autocast with torch's "is autocast on?" (no device
    named: CUDA's) answered for the CPU, as DeepSpeed's forward wrapper sees it on a GPU."""
    dtype = getattr(torch, dtype_name)
    real = torch.is_autocast_enabled
    torch.is_autocast_enabled = lambda device_type=None: real(device_type or "cpu")  # type: ignore[assignment]
    try:
        from launch.backends.registry import backend_for
        from launch.engine.deepspeed_engine import DeepSpeedEngine
        from launch.runtime.process_group import init_distributed

        cfg = zw.make_config("orscale_lm", backend="zero2")
        env = init_distributed(backend_for(cfg.parallel.backend), cfg.train.device)
        model_cfg = zw.get_preset("tiny", **zw.MODEL)
        engine = DeepSpeedEngine(
            backend_for(cfg.parallel.backend), model_cfg, cfg.parallel, cfg.optim, cfg.train, env, dtype, zw.ACCUM
        )
        seen: list[torch.dtype] = []
        engine.model.blocks[0].attn.qkv.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
        engine.forward_backward(zw.batches()[0, 0, : zw.MICRO], last_micro_batch=False)
        zero = engine._ds.optimizer
        import deepspeed.comm.comm as ds_comm

        return {
            "shm_op": ds_comm.cdb.shm_comm_op is not None,
            "matmul": [str(d) for d in seen],
            "reduce": sorted(str(d) for d in zero.ipg_buckets),
            "tagged": sorted(n for n, p in engine.model.named_parameters() if hasattr(p, "comm_dtype")),
        }
    finally:
        torch.is_autocast_enabled = real  # type: ignore[assignment]


@pytest.mark.slow
def test_zero_computes_in_bf16_when_autocast_is_asked_about_cuda_and_reduces_in_fp32():
    bf16 = rank_pool(1).run(_zero_forward, "bfloat16")[0]
    assert bf16["matmul"] == ["torch.bfloat16"]  # DeepSpeed's own autocast did not switch it off
    assert bf16["reduce"] == ["torch.float32"] and bf16["tagged"] == []  # gradients reduced in fp32
    fp32 = rank_pool(1).run(_zero_forward, "float32")[0]
    assert fp32["matmul"] == ["torch.float32"] and fp32["reduce"] == ["torch.float32"]
    # on the CPU accelerator, DeepSpeed's shared-memory inference all-reduce is neither built nor loaded
    assert not bf16["shm_op"] and not fp32["shm_op"]


# ------------------------------------------------------------------ 2. ZeRO state placement
def _zero_load_onto_meta(ckpt_dir: str) -> dict:
    """Save a ZeRO-2 AdamW state after one step, then load it into partitions on the `meta` device
    (standing for CUDA), with the AdamW groups fused, then foreach."""
    from orscale.distributed.zero import ROLE
    from orscale.distributed.zero_checkpoint import load_zero_state, save_zero_state

    cfg, env, engine = zw._zero_engine("adamw", 2)
    zw._train(cfg, env, engine, range(1))
    opt = engine.optimizer
    save_zero_state(opt, Path(ckpt_dir) / "rank0.safetensors")
    flat = [g for g in opt.param_groups if g[ROLE] == "adamw"]
    out = {}
    for impl in ("fused", "foreach"):
        for group in flat:
            group["params"][0] = torch.empty_like(group["params"][0], device="meta")
            group["fused"], group["foreach"] = (True, None) if impl == "fused" else (None, True)
        load_zero_state(opt, Path(ckpt_dir))
        out[impl] = [{k: (str(v.device), str(v.dtype)) for k, v in opt.state[g["params"][0]].items()} for g in flat]
    return out


@pytest.mark.slow
def test_zero_resume_puts_step_where_torch_would_fused_on_the_device(tmp_path):
    placed = rank_pool(1).run(_zero_load_onto_meta, str(tmp_path))[0]
    for state in placed["fused"]:
        assert state["step"] == ("meta", "torch.float32")  # fused AdamW's kernel reads it on the device
    for state in placed["foreach"]:
        assert state["step"][0] == "cpu"  # torch keeps a non-fused step on the host
    for state in placed["fused"] + placed["foreach"]:
        assert state["exp_avg"][0] == state["exp_avg_sq"][0] == "meta"


# ------------------------------------------------------------------ 3. throughput
class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_tokens_per_s_of_a_window_with_an_evaluation_inside_counts_training_time_only(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr("launch.run.meter.time.perf_counter", clock)
    meter = StepMeter(CPU, (6.0, 5.0), params=10, non_embedding_params=10)
    meter.restart_clock()
    for step in range(1, 11):  # 10 steps of 1 s and 1,000 tokens; a 7 s evaluation after step 5
        clock.now += 1.0
        meter.add_micro_batch(torch.tensor(1.0))
        meter.end_step(step, 1.0, 1000, data_wait_s=0.25)
        if step == 5:
            with meter.paused():
                clock.now += 7.0
    out = meter.read(tokens_seen=10_000)
    assert out["tokens_per_s"] == pytest.approx(1000.0)  # not 2,000 (5 steps' time) nor 588 (17 s)
    assert out["data_wait_frac"] == pytest.approx(0.25)
    assert out["train_loss"] == pytest.approx(1.0)


# ------------------------------------------------------------------ 4. TF32
@pytest.fixture
def restore_matmul_precision():
    before = torch.backends.cuda.matmul.fp32_precision
    yield
    torch.backends.cuda.matmul.fp32_precision = before


@pytest.mark.usefixtures("restore_matmul_precision")
def test_tf32_sets_cudas_fp32_matmul_precision_and_leaves_the_cpu_alone():
    assert set_tf32(True, torch.device("cpu")) is None
    assert torch.backends.cuda.matmul.fp32_precision != "tf32"  # untouched off CUDA
    assert set_tf32(True, torch.device("cuda", 0)) == "tf32"
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert set_tf32(False, torch.device("cuda", 0)) == "ieee"


def test_tf32_is_a_train_setting_recorded_in_the_run(tmp_path):
    from launch.plan import load_config

    assert load_config(None, []).train.tf32 is True
    assert load_config(None, ["train.tf32=false"]).train.tf32 is False


# ------------------------------------------------------------------ 5. compiled evaluation
@pytest.mark.task_data
@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_downstream_scoring_of_a_compiled_model_meets_at_most_four_shapes():
    from torch._dynamo.utils import counters

    from data import load_tokenizer
    from launch.engine.parallelize import build_model
    from launch.evaluation.tasks import prepare_tasks, score_prepared
    from launch.plan import load_config
    from models import get_preset
    from tests.helpers import BPE4K

    model_kw = dict(n_layer=1, d_model=32, n_head=2, max_seq_len=64, vocab_size=4096)
    tok = load_tokenizer(BPE4K)
    args = (["arc_easy", "piqa"], 0, 24, tok.encode_batch, 64, 8)
    summaries = {}
    for mode in ("none", "blocks"):
        cfg = load_config(None, ["parallel.backend=none", f"parallel.compile={mode}"])
        model = build_model(
            get_preset("tiny", **model_kw),
            cfg.parallel,
            7,
            CPU,
            compile_backend="aot_eager",
            backend=backend_for(cfg.parallel.backend),
        )
        model.eval()
        prepared = prepare_tasks(*args, static_shapes=mode != "none")
        shapes = {tuple(b.inputs.shape) for p in prepared for b in p.batches}
        before = counters["stats"]["unique_graphs"]
        logprobs = lambda i, t, m=model: -m(i, t, per_token=True).float()  # noqa: E731
        summaries[mode], _ = score_prepared(logprobs, prepared, CPU)
        graphs = counters["stats"]["unique_graphs"] - before
        if mode == "blocks":
            assert len(shapes) <= 4 and graphs == len(shapes), (shapes, graphs)
        else:
            assert len(shapes) > 4  # the tight batches this replaces: one graph per length
    for task, s in summaries["none"].items():  # padding to a bucket changes no score
        assert summaries["blocks"][task]["acc"] == s["acc"] and summaries["blocks"][task]["acc_norm"] == s["acc_norm"]


# ------------------------------------------------------------------ 7. fused AdamW on DTensors
def _dtensor_specs_over_steps(impl: str) -> list[int]:
    """Live DTensorSpec objects after steps 2, 6 and 10 of AdamW (`impl`) on FSDP2 parameters."""
    from torch.distributed.fsdp import fully_shard

    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **{impl: True})
    counts = []
    for step in range(1, 11):
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
        if step in (2, 6, 10):
            gc.collect()
            counts.append(sum(type(o).__name__ == "DTensorSpec" for o in gc.get_objects()))
    return counts


def _leak_rule_on_real_dtensors() -> dict:
    from torch.distributed.fsdp import fully_shard

    layer = torch.nn.Linear(4, 4)
    fully_shard(layer)
    params = list(layer.parameters())
    return {v: fused_leaks(params, v) for v in ("2.8.0", "2.10.1", "2.11.0+cu128", "2.13.0")}


@pytest.mark.slow
def test_fused_adamw_on_fsdp2_parameters_keeps_no_dtensorspec_per_step():
    pool = rank_pool(1)
    fused, foreach = pool.run(_dtensor_specs_over_steps, "fused")[0], pool.run(_dtensor_specs_over_steps, "foreach")[0]
    assert foreach[0] == foreach[-1]
    leaky = tuple(int(x) for x in torch.__version__.split(".")[:2]) in FUSED_DTENSOR_LEAK
    assert (fused[-1] - fused[0] > 0) == leaky, fused  # this torch leaks iff it is on the list
    rule = pool.run(_leak_rule_on_real_dtensors)[0]
    assert rule == {"2.8.0": False, "2.10.1": True, "2.11.0+cu128": True, "2.13.0": False}
    assert not fused_leaks([torch.zeros(1)], "2.11.0")  # plain tensors: no DTensor dispatch, no leak


def test_auto_picks_foreach_where_fused_leaks_and_an_explicit_fused_is_warned(monkeypatch, caplog):
    cuda = [{"params": [("w", SimpleNamespace(device=torch.device("cuda")))]}]
    monkeypatch.setattr("orscale.adamw.fused_leaks", lambda params, version: True)
    assert adamw_implementation("auto", cuda) == {"foreach": True}
    with caplog.at_level(logging.WARNING, logger="orscale"):
        assert adamw_implementation("fused", cuda, version="2.11.0") == {"fused": True}
    assert "pytorch#188174" in caplog.text and "optim.fused=foreach" in caplog.text


# ------------------------------------------------------------------ 8. the attention kernel, compiled
def _compiled_attention_ran(backend: str, cache_dir: str) -> str:
    """A TorchEngine with compiled blocks (inductor, every op left to its ATen kernel: nothing for a C++
    compiler to build here) and `train.attention=backend`, torch.compile's on-disk caches (inductor's
    and AOTAutograd's) in `cache_dir`: which SDPA kernel its second training step executed."""
    from torch.profiler import profile

    from launch.backends.registry import backend_for
    from launch.plan import load_config
    from launch.runtime.attention import attention_ran

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir  # the pool restores the environment after a job
    model = ["model.preset=tiny", "model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.vocab_size=256"]
    settings = [*model, "model.max_seq_len=16", "data.seq_len=16", "train.device=cpu", "parallel.compile=blocks"]
    settings += ["optim.name=adamw", "train.micro_batch_size=1", "train.tokens_per_step=16", "data.logical_shards=1"]
    settings.append(f"train.attention={backend}")
    cfg = load_config(None, settings)
    with torch._inductor.config.patch(fallback_by_default=True):
        backend = backend_for("none")
        engine = backend.build_engine(cfg.model.resolve(), cfg.parallel, cfg.optim, cfg.train, CPU, torch.float32, 1)
        batch = torch.randint(0, 256, (1, 17), generator=torch.Generator().manual_seed(0))
        engine.forward_backward(batch, last_micro_batch=True)  # compiles
        with profile() as prof:
            engine.forward_backward(batch, last_micro_batch=True)
    return attention_ran(e.name for e in prof.events())


@pytest.mark.slow
def test_a_warm_compile_cache_runs_the_attention_kernel_asked_for(tmp_path):
    """The first job compiles torch's choice (flash, on the CPU) into the on-disk caches; the second,
    with Dynamo's graphs dropped in between (as between two processes, or the check's A/B rows), asks
    for math. AOTAutograd's cache is keyed by the traced graph: with the kernel chosen by a context
    around the compiled block, both graphs were the same and the second job ran flash."""
    pool, cache = rank_pool(1), str(tmp_path / "compile_cache")
    assert pool.run(_compiled_attention_ran, "default", cache, group=False) == ["flash"]
    assert pool.run(_compiled_attention_ran, "math", cache, group=False) == ["math"]
