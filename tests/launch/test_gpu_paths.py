"""The options a GPU run uses, checked where a CPU runs them: parallel.compile (blocks,
model) against eager, fused AdamW against foreach, parallel.reshard_after_forward, activation
checkpointing with meta init (trained and resumed), FSDP2's bf16-parameter policy on 2 gloo ranks.

Compiled paths run with torch.compile's `aot_eager` backend: the same Dynamo graphs and AOT
autograd as on a GPU, without generating kernels. The FSDP2 and multi-rank runs go to the pool of
ranks (tests/pool.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from launch.backends.registry import backend_for
from launch.checkpoint import checkpointer as ckpt
from launch.engine.parallelize import build_model, fsdp_mixed_precision, reshard_after_forward
from launch.plan import load_config
from launch.runtime.process_group import DistEnv
from models import get_preset
from orscale import OptimConfig, build_optimizers
from orscale.adamw import adamw_implementation
from tests.helpers import train_in_pool, train_losses
from tests.pool import rank_pool

MODEL = dict(n_layer=2, d_model=32, n_head=2, max_seq_len=32, vocab_size=512)


def _build(mode: str, backend: str = "none", ac: bool = False, dist_env: DistEnv | None = None):
    cfg = load_config(
        None, [f"parallel.backend={backend}", f"parallel.compile={mode}", f"parallel.activation_checkpointing={ac}"]
    )
    dist_env = dist_env or DistEnv(0, 1, 0, torch.device("cpu"), backend)
    return build_model(
        get_preset("tiny", **MODEL),
        cfg.parallel,
        7,
        dist_env,
        compile_backend="aot_eager",
        backend=backend_for(cfg.parallel.backend),
    )


def _loss_and_grads(model) -> tuple[float, dict[str, torch.Tensor]]:
    batch = torch.randint(0, MODEL["vocab_size"], (2, 17), generator=torch.Generator().manual_seed(3))
    loss = model(batch[:, :-1], batch[:, 1:])
    loss.backward()
    full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t  # FSDP2 keeps DTensor shards
    return loss.item(), {n: full(p.grad).detach().clone() for n, p in model.named_parameters()}


def _assert_same(a: tuple[float, dict], b: tuple[float, dict]) -> None:
    assert a[0] == pytest.approx(b[0], rel=1e-6)
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.slow  # ~10 s of tracing each on 2 shared cores
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("mode", ["blocks", "model"])
def test_compiled_forward_backward_equals_eager_and_compiles_once(mode):
    """parallel.compile=model compiles the whole GPT (embedding, blocks, head and fused loss) into
    one graph, `blocks` one graph shared by every block and one of the head and loss; a second model
    built fresh (as the device check builds one per optimizer) reuses them instead of recompiling
    towards the recompile limit."""
    from torch._dynamo.utils import counters

    eager = _loss_and_grads(_build("none"))
    before = counters["stats"]["unique_graphs"]
    first, second = _loss_and_grads(_build(mode)), _loss_and_grads(_build(mode))
    assert counters["stats"]["unique_graphs"] - before == (2 if mode == "blocks" else 1)
    _assert_same(eager, first)
    _assert_same(eager, second)


def test_compiled_model_keeps_parameter_names_and_the_gpt_type():
    model = _build("model")
    assert type(model).__name__ == "GPT" and all(not n.startswith("_orig_mod") for n, _ in model.named_parameters())


@pytest.mark.usefixtures("one_thread")
def test_fused_adamw_equals_foreach_within_1e6():
    """optim.fused=fused (torch's fused kernel, on CPU too) against foreach: 5 steps of a tiny GPT.
    Measured here: max |Δ| 4.7e-10 after 20 steps of random gradients."""
    results = {}
    for impl in ("fused", "foreach"):
        model = _build("none")
        (opt,) = build_optimizers(model, OptimConfig(name="adamw", lr=1e-2, fused=impl))
        assert opt.param_groups[0]["fused" if impl == "fused" else "foreach"] is True
        for _ in range(5):
            _loss_and_grads(model)
            opt.step()
            opt.zero_grad()
        results[impl] = {n: p.detach().clone() for n, p in model.named_parameters()}
    for name, p in results["fused"].items():
        assert (p - results["foreach"][name]).abs().max().item() <= 1e-6, name


def test_fused_auto_is_fused_on_cuda_and_foreach_elsewhere():
    on = lambda kind: [{"params": [("w", SimpleNamespace(device=torch.device(kind)))]}]
    assert adamw_implementation("auto", on("cuda")) == {"fused": True}
    assert adamw_implementation("auto", on("cpu")) == {"foreach": True}
    assert adamw_implementation("fused", on("cpu")) == {"fused": True}
    assert adamw_implementation("foreach", on("cuda")) == {"foreach": True}


@pytest.mark.parametrize(
    "world, local, expected",
    [(None, None, False), ("1", "1", False), ("8", "8", False), ("16", "8", True), ("64", "4", True)],
)
def test_reshard_after_forward_auto_is_false_on_one_node_true_across_nodes(monkeypatch, world, local, expected):
    for key, value in (("WORLD_SIZE", world), ("LOCAL_WORLD_SIZE", local)):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    assert reshard_after_forward("auto") is expected
    assert reshard_after_forward("true") is True and reshard_after_forward("false") is False


def test_ddp_keeps_rank_local_buffers_without_torchs_deprecation_warning(tmp_path):
    """wrap_ddp keeps `broadcast_buffers=False` (a centred layer's input sum is per rank: not synced,
    not even at init, which `forward_sync_buffers=False` would still do) without the FutureWarning
    torch 2.13 prints for it once per rank."""
    import warnings

    import torch.distributed as dist

    from launch.engine.parallelize import wrap_ddp
    from models import GPT

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = GPT(get_preset("tiny", n_layer=1, d_model=32, max_seq_len=16, vocab_size=64))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            filters = list(warnings.filters)
            ddp = wrap_ddp(model, DistEnv(0, 1, 0, torch.device("cpu"), "ddp"))
            assert warnings.filters == filters  # silenced for that one call, not for the process
        assert [str(w.message) for w in caught] == []
        assert getattr(ddp, "forward_sync_buffers", getattr(ddp, "broadcast_buffers", None)) is False
    finally:
        dist.destroy_process_group()


def test_param_dtype_selects_the_bf16_policy_on_any_device():
    cpu, cuda, bf16, fp32 = torch.device("cpu"), torch.device("cuda"), torch.bfloat16, torch.float32
    assert fsdp_mixed_precision("bf16", fp32, cpu).param_dtype == bf16
    assert fsdp_mixed_precision("bf16", bf16, cpu).reduce_dtype == fp32  # gradients reduced in fp32
    assert fsdp_mixed_precision("fp32", bf16, cuda).param_dtype is None
    assert fsdp_mixed_precision("auto", bf16, cuda).param_dtype == bf16  # today's rule
    assert fsdp_mixed_precision("auto", bf16, cpu).param_dtype is None
    assert fsdp_mixed_precision("auto", fp32, cuda).param_dtype is None
    assert fsdp_mixed_precision("bf16", fp32, cpu).cast_forward_inputs is False  # RoPE tables stay fp32


# ---------------------------------------------------------------- train.py / torchrun (slow)
FSDP = ["parallel.backend=fsdp", "train.max_steps=6", "train.eval_every=6", "optim.name=adamw"]


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory) -> Callable[[str, list[str]], Path]:
    """1-process FSDP2 runs, each made once for the tests below that compare them."""
    made: dict[str, Path] = {}

    def run(name: str, overrides: list[str]) -> Path:
        if name not in made:
            made[name] = tmp_path_factory.mktemp(name)
            train_in_pool([f"run.dir={made[name]}", *FSDP, *overrides])
        return made[name]

    return run


@pytest.mark.slow
def test_fsdp2_reshard_after_forward_false_and_true_give_identical_losses(fsdp_runs):
    true = train_losses(fsdp_runs("reshard-true", ["parallel.fsdp.reshard_after_forward=true"]))
    false = train_losses(fsdp_runs("reshard-false", ["parallel.fsdp.reshard_after_forward=false"]))
    assert sorted(true) == list(range(1, 7)) and true == false


@pytest.mark.slow
def test_fused_adamw_runs_on_fsdp2_dtensors_like_foreach(fsdp_runs):
    foreach = train_losses(fsdp_runs("reshard-false", ["parallel.fsdp.reshard_after_forward=false"]))
    fused = train_losses(fsdp_runs("fused", ["parallel.fsdp.reshard_after_forward=false", "optim.fused=fused"]))
    assert fused.keys() == foreach.keys()
    for step, loss in fused.items():
        assert loss == pytest.approx(foreach[step], rel=1e-6), step


@pytest.mark.slow
def test_activation_checkpointing_with_meta_init_trains_and_resumes_like_without(tmp_path):
    """FSDP2 + activation checkpointing + meta init (it used to crash: KeyError
    'blocks.0.attn_norm.weight'): 6 steps with a checkpoint at step 3, then steps 4-6 again from
    that checkpoint in a new run dir; every loss equals the run without activation checkpointing
    (recomputing the forward gives the same numbers)."""
    common = ["parallel.backend=fsdp", "parallel.fsdp.meta_init=true", "train.max_steps=6", "train.ckpt_every=3"]
    common += ["train.eval_every=0", "optim.name=orscale_lm"]
    ac = [*common, "parallel.activation_checkpointing=true"]
    train_in_pool([f"run.dir={tmp_path / 'plain'}", *common])
    train_in_pool([f"run.dir={tmp_path / 'ac'}", *ac])
    step3 = ckpt.step_dir(tmp_path / "ac" / "checkpoints", 3)
    train_in_pool([f"run.dir={tmp_path / 'resumed'}", f"run.resume={step3}", *ac])
    plain, with_ac, resumed = (train_losses(tmp_path / d) for d in ("plain", "ac", "resumed"))
    assert sorted(plain) == list(range(1, 7)) and sorted(resumed) == [4, 5, 6]
    for step, loss in plain.items():
        assert with_ac[step] == pytest.approx(loss, rel=1e-6, abs=0), step
        if step in resumed:
            assert resumed[step] == pytest.approx(loss, rel=1e-6, abs=0), step


@pytest.mark.slow
@pytest.mark.distributed
def test_bf16_params_on_two_gloo_ranks_match_one_process_under_autocast(tmp_path):
    """gloo all-gathers bf16 (torch 2.13 here: all_gather_into_tensor, reduce_scatter_tensor and
    all_reduce of bf16 tensors all work), so FSDP2's bf16-param policy runs on CPU. Against one
    process under bf16 autocast (fp32 params), bf16 params differ where autocast keeps fp32: the
    embedding output and so the residual stream are bf16, and norm gains multiply in bf16.
    Measured over these 8 steps (largest |loss difference|): 2 ranks with bf16 params 4.4e-4
    (relative 4.1e-5); 1 process of FSDP2 with bf16 params 4.7e-4 (so the gap is the params' dtype,
    not the ranks); 2 ranks with fp32 params 1.4e-4; and fp32 without autocast 2.5e-4 (bf16 compute
    itself). Tolerance: relative 2e-4 (2e-3 at these losses), 4.5x the largest gap, while each
    step from step 6 on moves the loss by more than 0.06."""
    common = ["train.max_steps=8", "train.eval_every=8", "optim.name=orscale_lm", "train.micro_batch_size=2"]
    common += ["train.dtype=bf16"]
    train_in_pool([f"run.dir={tmp_path / 'one'}", *common])
    train_in_pool(
        [f"run.dir={tmp_path / 'two'}", *common, "parallel.backend=fsdp", "parallel.fsdp.param_dtype=bf16"], 2
    )
    one, two = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert sorted(one) == list(range(1, 9)) and one.keys() == two.keys()
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=2e-4), step
    assert one[8] < one[1] - 0.1  # it trained: the tolerance is small against the loss's motion


@pytest.mark.slow
def test_fsdp2_compiled_blocks_and_model_match_eager():
    """1-process FSDP2 (gloo): compile blocks, model, and blocks with activation checkpointing,
    each forward+backward equal to eager FSDP2's (a 1-rank pool job: a process group of one)."""
    out = rank_pool(1).run(_fsdp_worker)[0]
    for case in ("blocks", "model", "blocks+ac"):
        assert out[case]["loss"] == pytest.approx(out["eager"]["loss"], rel=1e-6), case
        for name, norm in out["eager"]["grad_norms"].items():
            assert out[case]["grad_norms"][name] == pytest.approx(norm, rel=1e-5), (case, name)
    assert out["bf16_block_inputs"] == {"x": "torch.bfloat16", "cos": "torch.float32"}


def _fsdp_worker() -> dict:
    from orscale.routing import canonical_name

    torch.set_num_threads(1)
    dist_env = DistEnv(0, 1, 0, torch.device("cpu"), "fsdp")
    out: dict = {}
    cases = {"eager": ("none", False), "blocks": ("blocks", False), "model": ("model", False)}
    for case, (mode, ac) in {**cases, "blocks+ac": ("blocks", True)}.items():
        loss, grads = _loss_and_grads(_build(mode, "fsdp", ac, dist_env))
        norms = {canonical_name(n): g.norm().item() for n, g in grads.items()}
        out[case] = {"loss": loss, "grad_norms": norms}
    # bf16 FSDP2 params: what each block receives (the RoPE tables must stay fp32, as in one process).
    cfg = load_config(None, ["parallel.backend=fsdp", "parallel.fsdp.param_dtype=bf16"])
    model = build_model(
        get_preset("tiny", **MODEL),
        cfg.parallel,
        7,
        dist_env,
        torch.bfloat16,
        backend=backend_for(cfg.parallel.backend),
    )
    seen: dict[str, str] = {}
    model.blocks[0].register_forward_pre_hook(lambda _, args: seen.update(x=str(args[0].dtype), cos=str(args[1].dtype)))
    _loss_and_grads(model)
    out["bf16_block_inputs"] = seen
    return out
