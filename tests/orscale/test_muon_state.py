"""The Muon-family optimizer's state and bookkeeping: calibration constants through save/load and
DCP, no host sync in the step, diagnostics (one transfer, saturation, update ratio)."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from orscale import MuonFamily, OptimConfig, build_optimizers, collect_diagnostics
from orscale.muon_spec import MuonOptions
from orscale.variants import VARIANTS as PRESETS
from tests.orscale.optim_helpers import Wrap, backward, matrices, set_grads, tiny_gpt

pytestmark = pytest.mark.usefixtures("one_thread")


def _roundtrip(opt: torch.optim.Optimizer) -> dict:
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_calibration_survives_save_load(dtype: torch.dtype) -> None:
    named = [(n, nn.Parameter(p.detach().to(dtype))) for n, p in matrices()]
    opt = MuonFamily(named, lr=0.02, variant="orscale_lm", ns_dtype="fp32")
    set_grads(named, 1.0, seed=0)
    opt.step()
    saved = _roundtrip(opt)
    fresh_named = [(n, nn.Parameter(p.detach().clone())) for n, p in named]
    fresh = MuonFamily(fresh_named, lr=0.02, variant="orscale_lm", ns_dtype="fp32")
    fresh.load_state_dict(saved)
    for (_, p), (_, q) in zip(named, fresh_named, strict=True):
        a, b = opt.state[p], fresh.state[q]
        assert b["c"].dtype == torch.float32 and b["c"].item() > 0
        assert torch.equal(a["c"], b["c"])
        assert b["momentum_buffer"].dtype == torch.float32
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])
    # The resumed optimizer keeps the old c (not recomputed from the new weights) and continues
    # exactly like the original.
    for t in (1, 2):
        set_grads(named, 1.0, seed=t)
        set_grads(fresh_named, 1.0, seed=t)
        opt.step()
        fresh.step()
    for (_, p), (_, q) in zip(named, fresh_named, strict=True):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["c"], fresh.state[q]["c"])


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_calibration_survives_dcp_checkpoint(dtype: torch.dtype, tmp_path) -> None:
    """The path launch/checkpoint.py takes: get_state_dict -> dcp.save -> dcp.load -> set_state_dict."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    cfg = OptimConfig(name="orscale_lm").with_options(MuonOptions(ns_dtype="fp32"))
    model = tiny_gpt(dtype)
    opts = build_optimizers(model, cfg)
    backward(model)
    for opt in opts:
        opt.step()
    msd, osd = get_state_dict(model, opts)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp_path))
    fresh = tiny_gpt(dtype)
    fresh_opts = build_optimizers(fresh, cfg)
    msd, osd = get_state_dict(fresh, fresh_opts)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(tmp_path))
    set_state_dict(fresh, fresh_opts, model_state_dict=state["model"], optim_state_dict=state["optim"])
    a, b = opts[0], fresh_opts[0]
    for p, q in zip(a.param_groups[0]["params"], b.param_groups[0]["params"], strict=True):
        assert b.state[q]["c"].dtype == torch.float32 and b.state[q]["c"].item() > 0
        assert torch.equal(a.state[p]["c"], b.state[q]["c"])
        assert b.state[q]["momentum_buffer"].dtype == torch.float32
        assert torch.equal(a.state[p]["momentum_buffer"], b.state[q]["momentum_buffer"])


# ----------------------------------------------------------------------------- no host sync
_SYNCING = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


@pytest.mark.parametrize("name", list(PRESETS))
def test_step_never_syncs_with_host(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    named = matrices()
    opt = MuonFamily(named, lr=0.02, variant=name, ns_dtype="fp32")
    set_grads(named, 1.0, seed=0)
    named[1][1].grad = None  # a matrix without gradient takes the partial path

    def forbidden(*args, **kwargs):
        raise AssertionError("host sync inside MuonFamily.step()")

    with monkeypatch.context() as mp:
        for attr in _SYNCING:
            mp.setattr(torch.Tensor, attr, forbidden)
        for _ in range(2):
            opt.step()
        set_grads(named, 1.0, seed=2)
        opt.step()
    assert opt.diagnostics()  # works again once the patches are gone


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_step_never_syncs_cuda() -> None:
    named = [(n, nn.Parameter(p.detach().cuda())) for n, p in matrices()]
    opt = MuonFamily(named, lr=0.02, variant="orscale_lm")
    set_grads(named, 1.0, seed=0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        opt.step()
        opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ----------------------------------------------------------------------------- diagnostics
def test_diagnostics_keys_one_transfer_and_saturation(monkeypatch: pytest.MonkeyPatch) -> None:
    named = matrices()
    opt = MuonFamily(named, lr=0.02, variant="mutrust", ns_dtype="fp32")
    assert opt.diagnostics() == {}
    for t in range(3):
        set_grads(named, 1e-6, seed=t)  # ‖W‖/‖M̂‖ huge: saturates at r_max
        opt.step()
    calls = []
    real = torch.Tensor.tolist

    def counting(self):
        calls.append(1)
        return real(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting)
    monkeypatch.setattr(torch.Tensor, "item", lambda self: pytest.fail("item() in diagnostics"))
    diag = opt.diagnostics()
    assert len(calls) == 1
    for cls in ("attn_qkv", "attn_out", "mlp_down"):
        for field in ("r_raw", "r", "frac_rmin", "frac_rmax", "w_norm", "q_norm", "update_ratio", "c", "cum_frac_rmax"):
            assert f"diag/{cls}/{field}" in diag
        assert diag[f"diag/{cls}/frac_rmax"] == 1.0 and diag[f"diag/{cls}/r"] == 5.0
        assert diag[f"diag/{cls}/r_raw"] > 5.0
    assert "diag/mlp_up/r" not in diag  # no such matrix here
    assert diag["diag/all/cum_frac_rmax"] == 1.0 and diag["diag/all/cum_frac_rmin"] == 0.0


def test_update_ratio_and_collect() -> None:
    for name in ("orscale_lm", "muon_moonlight", "mutrust"):
        named = matrices()
        before = [p.detach().clone() for _, p in named]
        opts = build_optimizers(Wrap(named), OptimConfig(name=name, lr=0.05).with_options(MuonOptions(ns_dtype="fp32")))
        set_grads(named, 1.0, seed=0)
        for opt in opts:
            opt.step()
        per = opts[0].matrix_diagnostics()
        for (n, p), b in zip(named, before, strict=True):
            actual = ((p.detach() - b).norm() / b.norm()).item()
            assert per[n]["update_ratio"] == pytest.approx(actual, rel=1e-4), (name, n)
            assert per[n]["w_norm"] == pytest.approx(b.norm().item(), rel=1e-6)
        merged = collect_diagnostics(opts)
        assert merged and all(k.startswith("diag/") for k in merged)
    assert collect_diagnostics([torch.optim.AdamW([nn.Parameter(torch.ones(2))])]) == {}
