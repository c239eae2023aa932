"""The Muon-family optimizer: SPEC formulas per preset, calibration, the first step, torch's Muon.
State, checkpoints, host syncs and diagnostics: tests/orscale/test_muon_state.py."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from orscale import MuonFamily, OptimConfig, OrScaleLM, build_optimizers
from orscale.muon_spec import MuonOptions
from orscale.newton_schulz import newton_schulz
from orscale.variants import VARIANTS as PRESETS
from tests.orscale.optim_helpers import backward, matrices, set_grads, tiny_gpt

EPS = 1e-6


pytestmark = pytest.mark.usefixtures("one_thread")


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
        rms = lambda X: X.norm() / math.sqrt(X.numel())
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
    (opt, _) = build_optimizers(model, OptimConfig(name="orscale_lm").with_options(MuonOptions(ns_dtype="fp32")))
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
    lm = build_optimizers(model, OptimConfig(name="orscale_lm", lr=lr).with_options(MuonOptions(ns_dtype="fp32")))[0]
    mm = build_optimizers(twin, OptimConfig(name="muon_moonlight", lr=lr).with_options(MuonOptions(ns_dtype="fp32")))[0]
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


BAD_NUMBERS = {  # id: (the constructor's keyword arguments, the error, what it says)
    "lr-nan": (dict(lr=float("nan")), ValueError, r"lr must be a finite number ≥ 0, got nan \(float\)"),
    "lr-inf": (dict(lr=math.inf), ValueError, r"lr must be a finite number ≥ 0, got inf \(float\)"),
    "lr-str": (dict(lr="1e-3"), TypeError, r"lr must be a finite number ≥ 0, got '1e-3' \(str\)"),
    "wd-nan": (dict(weight_decay=float("nan")), ValueError, r"weight_decay must be a finite number ≥ 0, got nan"),
    "momentum-nan": (dict(momentum=float("nan")), ValueError, r"momentum must be a finite number in \[0, 1\), got"),
    "eps-nan": (dict(eps=float("nan")), ValueError, r"eps must be a finite number > 0, got nan"),
    "r_max-inf": (dict(r_max=math.inf), ValueError, r"r_max must be a finite number ≥ r_min \(0.1\), got inf"),
}


@pytest.mark.parametrize(("kwargs", "error", "said"), BAD_NUMBERS.values(), ids=BAD_NUMBERS)
def test_a_hyper_parameter_that_is_not_a_finite_number_is_refused_in_one_line(kwargs, error, said) -> None:
    with pytest.raises(error, match=f"^{said}"):
        MuonFamily(matrices(), **kwargs)
    if "lr" in kwargs:  # the whole-model optimizer's path: its matrices' LR, AdamW's set apart
        with pytest.raises(error, match=f"^{said}"):
            OrScaleLM(tiny_gpt(), adamw_lr=1e-3, **kwargs)


def test_a_nan_lr_set_after_construction_stops_the_step() -> None:
    """A scheduler's NaN (a host float; every comparison with it false) would skip every update."""
    params = matrices()
    opt = MuonFamily(params, lr=0.02)
    set_grads(params, 1.0, seed=0)
    opt.param_groups[0]["lr"] = float("nan")
    before = [p.detach().clone() for _, p in params]
    with pytest.raises(ValueError, match=r"^param group 0's lr must be a number ≥ 0, got nan$"):
        opt.step()
    assert all(torch.equal(p, b) for (_, p), b in zip(params, before, strict=True))


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


# ----------------------------------------------------------------------------- direction hooks
class TripledThenScaled(MuonFamily):
    """A member that changes the direction through the step's hooks: 3Q after Newton–Schulz, each
    matrix's rows counted through the step's reduction, then a = 2·rows/(3·m): the step runs on 2Q."""

    extra_sum_columns = 1
    scales_directions = True

    def shape_directions(self, w, qs):
        rows = torch.tensor([[float(q.shape[0])] for q in qs], device=qs[0].device)
        return [3 * q.float() for q in qs], rows

    def direction_scales(self, w, sums, extra):
        m = torch.tensor([float(p.shape[0]) for p in w.params], device=extra.device)
        return 2 * extra[:, 0] / (3 * m)


@pytest.mark.parametrize("name", list(PRESETS))
def test_hooks_that_double_the_direction_give_twice_the_shape_factor(name: str) -> None:
    """With max(m, n) = 100, s = 1 on the direction 2Q is Moonlight's s = 0.2·√100 = 2 on Q: every
    variant (trust ratios of ‖λW + sQ‖, ‖sQ‖ or ‖M̂‖, coupled or decoupled decay, calibration) steps
    alike, and the diagnostics read the direction the step used (‖2Q‖)."""
    shapes = ((100, 12), (12, 100), (100, 24), (100, 100))
    hooked, plain = matrices(shapes), matrices(shapes)
    a = TripledThenScaled(hooked, lr=0.02, weight_decay=0.1, variant=name, shape="one", ns_dtype="fp32")
    b = MuonFamily(plain, lr=0.02, weight_decay=0.1, variant=name, shape="moonlight", ns_dtype="fp32")
    for t in range(3):
        set_grads(hooked, 1.0, seed=t)
        set_grads(plain, 1.0, seed=t)
        a.step()
        b.step()
        for (n, p), (_, q) in zip(hooked, plain, strict=True):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-7, msg=f"{n} t={t}")
    da, db = a.matrix_diagnostics(), b.matrix_diagnostics()
    for n, row in db.items():
        want = {**row, "q_norm": 2 * row["q_norm"]}
        assert da[n] == pytest.approx(want, rel=1e-5), n


@pytest.mark.parametrize("name", ["Lion", "CBP", "LAMB", "LARS", "OrScaleLM without hidden matrices"])
def test_every_optimizer_refuses_an_lr_that_is_not_a_finite_number(name) -> None:
    """NaN passed `lr < 0` (every comparison with it is false): the optimizer then skipped no update
    but moved nothing; a string failed on the comparison with a bare TypeError."""
    from orscale.cbp import CBP
    from orscale.lamb_lars import LAMB, LARS
    from orscale.lion import Lion

    build = {
        "Lion": Lion,
        "CBP": CBP,
        "LAMB": LAMB,
        "LARS": LARS,
        "OrScaleLM without hidden matrices": lambda params, lr: OrScaleLM(nn.Sequential(nn.LayerNorm(4)), lr=lr),
    }[name]
    for bad, error in ((float("nan"), ValueError), (float("inf"), ValueError), ("1e-3", TypeError)):
        with pytest.raises(error, match=r"^lr must be a finite number ≥ 0, got "):
            build([nn.Parameter(torch.ones(2, 2))], lr=bad)
