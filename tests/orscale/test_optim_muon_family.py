"""The Muon-family optimizer: SPEC formulas per preset, calibration, state, no host sync."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from torch import nn

from orscale import MuonFamily, OptimConfig, build_optimizers, collect_diagnostics
from orscale.newton_schulz import newton_schulz
from orscale.variants import VARIANTS as PRESETS

EPS = 1e-6


pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------- helpers
def tiny_gpt(dtype: torch.dtype = torch.float32) -> nn.Module:
    from models.gpt import GPT
    from models.presets import get_preset

    torch.manual_seed(0)
    cfg = get_preset("tiny", vocab_size=256, max_seq_len=32)
    return GPT(cfg).to(dtype)


def backward(model: nn.Module, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, model.cfg.vocab_size, (2, 16), generator=gen)
    model.zero_grad(set_to_none=True)
    logits = model(idx)  # the model's contract: idx [B, T] -> logits [B, T, V]
    targets = torch.roll(idx, -1, 1).flatten()
    loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets)
    loss.backward()


def matrices(shapes=((24, 8), (8, 24), (24, 8), (16, 16)), seed: int = 0) -> list[tuple[str, nn.Parameter]]:
    gen = torch.Generator().manual_seed(seed)
    names = [
        "blocks.0.attn.qkv.weight",
        "blocks.0.mlp.down.weight",
        "blocks.1.attn.qkv.weight",
        "blocks.0.attn.out.weight",
    ]
    return [(n, nn.Parameter(0.02 * torch.randn(s, generator=gen))) for n, s in zip(names, shapes, strict=True)]


def set_grads(named, scale: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _, p in named:
        p.grad = scale * torch.randn(p.shape, generator=gen).to(p.dtype)


# ----------------------------------------------------------------------------- SPEC reference
def reference_step(name: str, W, M, c, G, lr, wd, r_min=0.1, r_max=5.0, mu=0.95):
    """SPEC §1–3 written out per matrix, independently of the optimizer's code (float64 norms)."""
    M = mu * M + G
    Mh = mu * M + G
    Q = newton_schulz(Mh, 5, "polar_express", "fp32").double()
    W, Mh = W.double(), Mh.double()
    m, n = W.shape
    s = (
        0.2 * math.sqrt(max(m, n))
        if name in ("muon_moonlight", "orscale_lm", "muscale", "orscale_lm_uncalibrated", "orscale_lm_decoupled")
        else 1.0
    )

    def clip(r):
        return min(max(r, r_min), r_max)

    if name == "muon":
        W = (1 - lr * wd) * W - lr * Q
    elif name == "muon_moonlight":
        W = (1 - lr * wd) * W - lr * s * Q
    elif name in ("orscale", "orscale_lm_uncalibrated"):
        D = wd * W + s * Q
        W = W - lr * clip(W.norm() / (D.norm() + EPS)) * D
    elif name == "orscale_lm":
        D = wd * W + s * Q
        if c == 0:
            c = (W.norm() / D.norm()).item()
        W = W - lr * clip(W.norm() / (c * D.norm() + EPS)) * D
    elif name == "orscale_qnorm":
        W = (1 - lr * wd) * W - lr * clip(W.norm() / (Q.norm() + EPS)) * Q
    elif name == "mutrust":
        W = (1 - lr * wd) * W - lr * clip(W.norm() / (Mh.norm() + EPS)) * Q
    elif name == "muscale":
        rms = lambda X: X.norm() / math.sqrt(X.numel())  # noqa: E731
        W = (1 - lr * wd) * W - lr * clip(rms(W) / (rms(Mh) + EPS)) * s * Q
    elif name == "orscale_lm_decoupled":
        if c == 0:
            c = (W.norm() / (s * Q).norm()).item()
        W = (1 - lr * wd) * W - lr * clip(W.norm() / (c * (s * Q).norm() + EPS)) * s * Q
    else:
        raise AssertionError(name)
    return W.float(), M, c


@pytest.mark.parametrize("grad_scale", [1e-4, 1.0])  # tiny grads push trust ratios to r_max
@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_matches_spec_formula(name: str, grad_scale: float) -> None:
    named = matrices()
    ref = {n: (p.detach().clone(), torch.zeros_like(p), 0.0) for n, p in named}
    opt = MuonFamily(named, lr=0.02, weight_decay=0.1, variant=name, ns_dtype="fp32")
    for t in range(3):
        set_grads(named, grad_scale, seed=t)
        for n, p in named:
            W, M, c = ref[n]
            ref[n] = reference_step(name, W, M, c, p.grad.clone(), lr=0.02, wd=0.1)
        opt.step()
        for n, p in named:
            torch.testing.assert_close(p.detach(), ref[n][0], rtol=2e-5, atol=1e-7, msg=f"{name} {n} t={t}")


def test_orscale_hand_made_matrix() -> None:
    """OrScale (s = 1, c = 1): W ← W − η·clip(‖W‖/(‖λW+Q‖+ε))·(λW+Q), on a 3×2 matrix."""
    W0 = torch.tensor([[0.5, -1.0], [2.0, 0.25], [-0.75, 1.5]])
    G = torch.tensor([[0.1, 0.2], [-0.3, 0.05], [0.0, -0.4]])
    p = nn.Parameter(W0.clone())
    opt = MuonFamily([p], lr=0.1, weight_decay=0.1, variant="orscale", ns_dtype="fp32")
    p.grad = G.clone()
    opt.step()
    M_hat = 0.95 * G + G  # M = G after one step from zero; Nesterov look-ahead
    Q = newton_schulz(M_hat, 5, "polar_express", "fp32")
    D = 0.1 * W0 + Q
    r = min(max(W0.norm() / (D.norm() + 1e-6), 0.1), 5.0)
    torch.testing.assert_close(p.detach(), W0 - 0.1 * r * D, rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------- calibration
def test_orscale_lm_first_ratio_is_one_on_tiny_gpt() -> None:
    model = tiny_gpt()
    (opt, _) = build_optimizers(model, OptimConfig(name="orscale_lm", ns_dtype="fp32"))
    w0 = {n: p.detach().norm().item() for n, p in model.named_parameters()}
    backward(model)
    opt.step()
    diag = opt.matrix_diagnostics()
    assert len(diag) == 4 * model.cfg.n_layer
    for name, d in diag.items():
        # r₀ = ‖W₀‖/(c‖D₀‖ + ε) with c = ‖W₀‖/‖D₀‖, i.e. ‖W₀‖/(‖W₀‖ + ε): 1 up to ε/‖W₀‖.
        assert d["r_raw"] == pytest.approx(w0[name] / (w0[name] + EPS), rel=1e-6), name
        assert abs(d["r"] - 1.0) < 1e-5 and d["c"] > 0
        assert d["at_rmin"] == 0 and d["at_rmax"] == 0


@pytest.mark.parametrize("lr", [1e-3, 1.0])
def test_orscale_lm_first_update_equals_moonlight(lr: float) -> None:
    """r₀ = 1, so W − η·r₀·(λW + sQ) equals Moonlight's (1 − ηλ)W − ηsQ at the first step."""
    model = tiny_gpt()
    backward(model)
    twin = copy.deepcopy(model)
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        q.grad = p.grad.clone()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    lm = build_optimizers(model, OptimConfig(name="orscale_lm", lr=lr, ns_dtype="fp32"))[0]
    mm = build_optimizers(twin, OptimConfig(name="muon_moonlight", lr=lr, ns_dtype="fp32"))[0]
    lm.step()
    mm.step()
    checked = 0
    with torch.no_grad():
        for (n, a), (_, b) in zip(model.named_parameters(), twin.named_parameters(), strict=True):
            if not n.startswith("blocks.") or a.ndim != 2:
                continue
            checked += 1
            # Allowed difference: r₀ = 1 − ε/‖W₀‖ + O(ε²) (ε sits in the ratio's denominator),
            # plus fp32 rounding of the stored weights (2⁻²⁴ relative to ‖W‖).
            da, db = a - before[n], b - before[n]
            w0 = before[n].norm().item()
            # Weights after the step: same to fp32 precision.
            tol_w = 1e-6 + EPS / w0 * (db.norm() / b.norm()).item()
            assert ((a - b).norm() / b.norm()).item() <= tol_w, n
            # The updates themselves (rounding of W dominates ‖ΔW‖ when η is small).
            tol = 1e-6 + EPS / w0 + 2.0**-23 * w0 / db.norm().item()
            assert ((da - db).norm() / db.norm()).item() <= tol, n
    assert checked == 4 * model.cfg.n_layer


def test_no_calibration_on_zero_grad_or_zero_lr() -> None:
    named = matrices()
    opt = MuonFamily(named, lr=0.02, variant="orscale_lm", ns_dtype="fp32")
    for _, p in named:  # eager state, before any step
        st = opt.state[p]
        assert st["c"].dtype == torch.float32 and st["c"].ndim == 0 and st["c"].item() == 0
        assert st["momentum_buffer"].dtype == torch.float32
        assert not st["momentum_buffer"].any()
    for _, p in named:
        p.grad = torch.zeros_like(p)
    opt.step()  # zero gradient, lr > 0
    assert all(opt.state[p]["c"].item() == 0 for _, p in named)
    set_grads(named, 1.0, seed=1)
    before = [p.detach().clone() for _, p in named]
    for g in opt.param_groups:
        g["lr"] = 0.0
    opt.step()  # lr = 0: neither calibrates nor moves the weights
    assert all(opt.state[p]["c"].item() == 0 for _, p in named)
    assert all(torch.equal(b, p) for b, (_, p) in zip(before, named, strict=True))
    for g in opt.param_groups:
        g["lr"] = 0.02
    opt.step()
    assert all(opt.state[p]["c"].item() > 0 for _, p in named)


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

    cfg = OptimConfig(name="orscale_lm", ns_dtype="fp32")
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
        opts = build_optimizers(_Wrap(named), OptimConfig(name=name, lr=0.05, ns_dtype="fp32"))
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


class _Wrap(nn.Module):
    """A module exposing given (name, param) pairs under their dotted names."""

    def __init__(self, named):
        super().__init__()
        for n, p in named:
            mod = self
            *path, leaf = n.split(".")
            for part in path:
                if not hasattr(mod, part):
                    mod.add_module(part, nn.Module())
                mod = getattr(mod, part)
            mod.register_parameter(leaf, p)


def test_muon_moonlight_matches_torch_muon() -> None:
    """Cross-check against torch.optim.Muon (Jordan coefficients, bf16, adjust 'match_rms_adamw').
    torch's momentum is an EMA ((1−μ)× ours), which Newton–Schulz's normalisation cancels."""
    named = matrices()
    twin = [(n, nn.Parameter(p.detach().clone())) for n, p in named]
    before = [p.detach().clone() for _, p in named]
    ours = MuonFamily(
        named, lr=0.02, weight_decay=0.1, variant="muon_moonlight", ns_coefficients="jordan", ns_dtype="bf16"
    )
    theirs = torch.optim.Muon([p for _, p in twin], lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for t in range(3):
        set_grads(named, 1.0, seed=t)
        set_grads(twin, 1.0, seed=t)
        ours.step()
        theirs.step()
    for (_, a), (_, b), w in zip(named, twin, before, strict=True):
        assert ((a - b).norm() / (b - w).norm()).item() < 0.03


@pytest.mark.parametrize("name", list(PRESETS))
def test_diagnostics_off_gives_same_weights(name: str) -> None:
    a, b = matrices(), matrices()
    on = MuonFamily(a, lr=0.02, variant=name, ns_dtype="fp32")
    off = MuonFamily(b, lr=0.02, variant=name, ns_dtype="fp32", track_diagnostics=False)
    for t in range(2):
        set_grads(a, 1.0, seed=t)
        set_grads(b, 1.0, seed=t)
        on.step()
        off.step()
    assert all(torch.equal(p, q) for (_, p), (_, q) in zip(a, b, strict=True))
    assert off.diagnostics() == {} and on.diagnostics()


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="blocks.0.attn_norm.weight"):
        MuonFamily([("blocks.0.attn_norm.weight", nn.Parameter(torch.ones(8)))])
    with pytest.raises(ValueError, match="unknown Muon-family preset"):
        MuonFamily(matrices(), variant="lars")
    with pytest.raises(ValueError, match="denominator"):
        MuonFamily(matrices(), variant="orscale", denominator="gradient")
    with pytest.raises(ValueError, match="r_min"):
        MuonFamily(matrices(), r_min=2.0, r_max=1.0)
    # Overriding one named choice of a preset.
    opt = MuonFamily(matrices(), variant="orscale_lm", decay="decoupled")
    assert opt.param_groups[0]["decay"] == "decoupled"
    assert opt.param_groups[0]["calibration"] == "lazy"
