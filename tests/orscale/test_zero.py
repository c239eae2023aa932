"""DeepSpeed ZeRO-1/2 (launch/deepspeed_engine.py, orscale/distributed/zero.py): equal to a single-process run.

The distributed tests run ``tests/orscale/zero_worker.py`` on 2 ranks of the pool (tests/pool.py:
CPU, gloo, ``DS_ACCELERATOR=cpu``): a 3-layer d=64 GPT, 5 steps of 2 accumulated micro-batches on fixed
synthetic tokens, fp32 Newton–Schulz, warmup + cosine LR, grad clip 0.6 (active on most steps).
With 3 layers the ZeRO partition boundary cuts ``blocks.1.mlp.up`` in two, so the owner exchange
(all_to_all) runs.

Tolerance 1e-5 relative (per tensor). What is left is reduction-order noise: two ranks average
two half-batch gradients where one process sums one batch (~1e-7 relative), which Newton–Schulz
and five steps grow to ~3e-6. AdamW's eps is 1e-6 in these runs: at the paper's 1e-8, gradient
elements that nearly cancel (|g| ~ 5e-9 in ``blocks.2.attn.out``) turn that same 1e-7 noise into
~2% of an lr step (1.7e-4 per-tensor difference after one step), even between two single-process
computations that merely sum the halves in a different order, so no ZeRO implementation could
pass a 1e-5 test there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from launch.backends.registry import backend_for
from launch.config import Config
from launch.engine.base import checkpoint_layout
from launch.engine.deepspeed_engine import FORMAT, DeepSpeedEngine, ds_config
from launch.engine.torch_engine import TorchEngine
from launch.errors import ConfigError
from orscale.distributed.zero_layout import build_layout
from tests.orscale import zero_worker as zw
from tests.orscale.optim_helpers import muon_family_members
from tests.pool import rank_pool

OPTIMS = ("adamw", "muon_moonlight", "orscale_lm", *muon_family_members())  # and the Muon family's other members
RTOL = 1e-5


# ------------------------------------------------------------------------------------ fast checks
def test_layout_cuts_matrices_at_partition_boundaries_and_plans_agree():
    # Flat group of 3 ranks × 10 elements: a [0, 6) on rank 0; b [6, 22) across ranks 0, 1, 2;
    # c [22, 30) on rank 2.
    names, shapes, offsets = ["a", "b", "c"], [torch.Size([2, 3]), torch.Size([4, 4]), torch.Size([2, 4])], [0, 6, 22]
    layouts = [build_layout(names, shapes, offsets, 10, r, 3) for r in range(3)]
    lay = layouts[0]
    assert [[(pc.rank, pc.part_off, pc.mat_off, pc.n) for pc in ps] for ps in lay.pieces] == [
        [(0, 0, 0, 6)],
        [(0, 6, 0, 4), (1, 0, 4, 10), (2, 0, 14, 2)],
        [(2, 2, 0, 8)],
    ]
    assert lay.owner == [0, 1, 2]  # b: most of it lies on rank 1
    assert all(layout.needs_exchange for layout in layouts)
    for me in range(3):
        for peer in range(3):
            if me != peer:  # what `me` sends to `peer` is exactly what `peer` expects from `me`
                assert layouts[me].outgoing[peer] == layouts[peer].incoming[me]
    assert [pc.n for pc in layouts[1].kept] == [10]
    # Ties go to the lowest rank; a layout where every matrix sits whole on one rank needs no exchange.
    tie = build_layout(["t"], [torch.Size([2, 4])], [6], 10, 0, 2)  # 4 on rank 0, 4 on rank 1
    assert tie.owner == [0]
    whole = build_layout(["x", "y"], [torch.Size([2, 5]), torch.Size([2, 5])], [0, 10], 10, 1, 2)
    assert whole.owner == [0, 1] and not whole.needs_exchange


def _cfg(backend: str, optim: str = "orscale_lm") -> Config:
    cfg = Config()
    cfg.parallel.backend = backend
    cfg.optim.name = optim
    return cfg


def test_zero_config_errors_are_one_line():
    ddp = _cfg("ddp")
    with pytest.raises(ConfigError, match="parallel.backend=ddp"):  # only a ZeRO backend builds this engine
        DeepSpeedEngine(backend_for("ddp"), None, ddp.parallel, ddp.optim, ddp.train, None, torch.float32, 1)
    from orscale import OPTIMIZER_NAMES

    for name in OPTIMIZER_NAMES:  # every optimizer runs under ZeRO (whole tensors at owner ranks)
        backend_for("zero1").check_optimizer(_cfg("zero1", name).optim)
    center = _cfg("zero2", "cbp")
    center.model.center_mlp, center.train.skip_spikes = True, True
    backend_for("zero2").check_optimizer(center.optim)  # M2 and the spike guard run under ZeRO too


def test_ds_config_leaves_clipping_to_us_and_keeps_fp32_arithmetic():
    cfg = _cfg("zero1")
    cfg.train.micro_batch_size = 4
    c = ds_config(1, cfg.train.micro_batch_size, world_size=8, accum_steps=3)
    assert c["gradient_clipping"] == 0.0 and c["zero_optimization"]["stage"] == 1
    assert c["train_batch_size"] == 4 * 3 * 8 and c["gradient_accumulation_steps"] == 3
    # fp32 params, gradients and reductions on every stage: bf16 compute comes from autocast.
    for stage in (1, 2):
        c = ds_config(stage, _cfg(f"zero{stage}").train.micro_batch_size, 8, 3)
        assert not c["bf16"]["enabled"] and not c["fp16"]["enabled"] and c["communication_data_type"] == "fp32"
        assert not c["torch_autocast"]["enabled"]  # an fp32 run
    # A bf16 run: DeepSpeed autocasts the forward itself (it would switch an outer autocast off),
    # with no module whose gradients it would reduce in bf16 (tests/launch/test_gpu_guards.py runs it).
    bf16 = ds_config(2, 4, 8, 3, torch.bfloat16)["torch_autocast"]
    assert bf16 == {"enabled": True, "dtype": "torch.bfloat16", "lower_precision_safe_modules": []}


def test_owner_muon_family_is_built_like_build_optimizers():
    """orscale.distributed.zero copies build_optimizers' MuonFamily arguments: guard against drift."""
    from models import GPT, get_preset
    from orscale import build_optimizers
    from orscale.muon_family import MuonFamily
    from orscale.muon_spec import MuonOptions, muon_family_kwargs

    cfg = _cfg("zero2", "orscale_lm_decoupled").optim
    cfg.lr, cfg.weight_decay = 3e-3, 0.05
    cfg = cfg.with_options(
        MuonOptions(
            momentum=0.9,
            nesterov=False,
            ns_steps=4,
            ns_coefficients="jordan",
            ns_dtype="fp32",
            r_min=0.2,
            r_max=3.0,
            trust_eps=1e-7,
            diagnostics=not MuonOptions().diagnostics,
        )
    )
    model = GPT(get_preset("tiny", n_layer=1, d_model=32, n_head=2, max_seq_len=8, vocab_size=64))
    ref = build_optimizers(model, cfg)[0]
    mine = MuonFamily(list(ref.param_groups[0]["params"]), **muon_family_kwargs(cfg))
    strip = {"params", "param_names"}
    assert {k: v for k, v in mine.param_groups[0].items() if k not in strip} == {
        k: v for k, v in ref.param_groups[0].items() if k not in strip
    }
    assert mine.track_diagnostics == ref.track_diagnostics


def test_checkpoints_of_either_layout_load_under_every_engine_and_old_files_are_one_line(tmp_path):
    """ZeRO checkpoints load at any world size and stage, and under the torch engines too (and DCP
    ones under ZeRO: launch.checkpoint.portable); DeepSpeed's own files of an earlier version, and a
    directory of neither layout, are named as such in one line."""
    (tmp_path / "zero").mkdir()
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "zero" / "meta.json").write_text(
        json.dumps({"format": FORMAT, "world_size": 2, "stage": 2, "optim": "orscale_lm"})
    )
    assert checkpoint_layout(tmp_path)["world_size"] == 2
    DeepSpeedEngine.check_checkpoint(tmp_path, 3)  # another world size is fine
    TorchEngine.check_checkpoint(tmp_path, 2)  # and another engine
    (tmp_path / "zero" / "zero_meta.json").write_text("{}")
    with pytest.raises(ConfigError, match="DeepSpeed's own ZeRO files") as legacy:
        DeepSpeedEngine.check_checkpoint(tmp_path, 2)
    with pytest.raises(ConfigError, match="DeepSpeed's own ZeRO files"):
        TorchEngine.check_checkpoint(tmp_path, 2)
    (tmp_path / "dcp_run" / "dcp").mkdir(parents=True)
    DeepSpeedEngine.check_checkpoint(tmp_path / "dcp_run", 2)
    TorchEngine.check_checkpoint(tmp_path / "dcp_run", 2)
    (tmp_path / "neither").mkdir()
    with pytest.raises(ConfigError, match="neither dcp/ nor zero/") as neither:
        TorchEngine.check_checkpoint(tmp_path / "neither", 2)
    assert all("\n" not in str(e.value) for e in (legacy, neither))


# ------------------------------------------------------------------------------- distributed runs
def _launch(stage: int, optims: list[str], roundtrip: Path, bf16: bool = False) -> dict:
    """zero_worker.run_all on 2 ranks of the pool; rank 0's results."""
    return rank_pool(zw.WORLD).run(zw.run_all, stage, optims, str(roundtrip), bf16)[0]


@pytest.fixture(scope="module")
def single():
    torch.set_num_threads(1)
    return {name: zw.run_single(name) for name in OPTIMS}


@pytest.fixture(scope="module", params=[1, 2], ids=["zero1", "zero2"])
def zero_run(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"zero{request.param}")
    return request.param, _launch(request.param, list(OPTIMS), tmp / "ckpt")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("optim", OPTIMS)
def test_zero_matches_single_process(zero_run, single, optim):
    stage, results = zero_run
    ref, got = single[optim], results[optim]
    assert got["ds_optimizer"] == "DeepSpeedZeroOptimizer"
    assert got["losses"] == pytest.approx(ref["losses"], rel=RTOL)
    assert got["grad_norms"] == pytest.approx(ref["grad_norms"], rel=RTOL)  # raw norms, before the clip
    clip = zw.make_config(optim).optim.grad_clip
    assert any(n > clip for n in ref["grad_norms"])  # the clip acted
    worst = {k: _rel(got["weights"][k], ref["weights"][k]) for k in ref["weights"]}
    assert max(worst.values()) < RTOL, sorted(worst.items(), key=lambda kv: -kv[1])[:3]
    assert got["calibration"].keys() == ref["calibration"].keys()
    for name, c in ref["calibration"].items():
        assert c > 0 and got["calibration"][name] == pytest.approx(c, rel=RTOL), name
    if optim == "orscale_lm":
        assert len(ref["calibration"]) == 4 * zw.MODEL["n_layer"]
    if optim != "adamw":
        assert got["exchanged"]  # a matrix straddled the partition boundary and travelled
        assert got["diagnostics"].keys() == ref["diagnostics"].keys() and ref["diagnostics"]
        for key, value in ref["diagnostics"].items():
            assert got["diagnostics"][key] == pytest.approx(value, rel=1e-4, abs=1e-7), key


@pytest.mark.slow
@pytest.mark.distributed
def test_zero_checkpoint_round_trip_continues_identically(zero_run):
    """3 steps, save; a fresh engine from another init seed loads and runs steps 4-5: the same
    losses and weights, bit for bit, as the uninterrupted run; calibration constants restored."""
    _, results = zero_run
    rt, full = results["roundtrip"], results["orscale_lm"]
    # safetensors and JSON only: nothing in a ZeRO checkpoint is unpickled
    assert rt["files"] == ["model.safetensors", "zero/meta.json", "zero/rank0.safetensors", "zero/rank1.safetensors"]
    assert rt["saved_calibration"] and rt["loaded_calibration"] == rt["saved_calibration"]
    assert all(c > 0 for c in rt["saved_calibration"].values())
    assert rt["losses"] == full["losses"]
    for key, value in full["weights"].items():
        assert torch.equal(rt["weights"][key], value), key


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("stage", [1, 2], ids=["zero1", "zero2"])
def test_zero_bf16_runs_close_to_fp32(tmp_path, single, stage):
    """What a CUDA bf16 run uses (here on CPU): bf16 compute through the engine's autocast over fp32
    params, so gradients accumulate and reduce in fp32 on both stages, like FSDP2's. Not an
    equality test (bf16 matmuls)."""
    results = _launch(stage, ["orscale_lm"], tmp_path / "ckpt", bf16=True)
    got, ref = results["orscale_lm"], single["orscale_lm"]
    assert got["ds_optimizer"] == "DeepSpeedZeroOptimizer" and got["exchanged"]
    assert got["losses"] == pytest.approx(ref["losses"], abs=5e-3)
    assert got["calibration"].keys() == ref["calibration"].keys()
    for name, c in ref["calibration"].items():
        assert got["calibration"][name] == pytest.approx(c, rel=2e-2), name
    rt = results["roundtrip"]
    assert rt["losses"] == got["losses"] and rt["loaded_calibration"] == rt["saved_calibration"]


def test_zero_state_files_get_the_mode_the_umask_gives(tmp_path):
    """safetensors writes through a temporary file of mode 0600: a ZeRO file gets the umask's mode, as
    every other file of a checkpoint (here under umask 027: 0640)."""
    from stat import S_IMODE

    from safetensors import safe_open

    from orscale.distributed.zero_checkpoint import NUMBERS, write_zero_state

    before = os.umask(0o027)
    try:
        write_zero_state(({"flat/w/exp_avg@0": torch.ones(3)}, {"owner/w/step": 2}), tmp_path / "rank0.safetensors")
        (tmp_path / "plain.json").write_text("{}")
    finally:
        os.umask(before)
    modes = {p.name: oct(S_IMODE(p.stat().st_mode)) for p in tmp_path.iterdir()}
    assert modes == {"rank0.safetensors": oct(0o640), "plain.json": oct(0o640)}
    with safe_open(str(tmp_path / "rank0.safetensors"), "pt") as fh:  # still the file it was
        assert fh.keys() == ["flat/w/exp_avg@0"] and json.loads(fh.metadata()[NUMBERS]) == {"owner/w/step": 2}
