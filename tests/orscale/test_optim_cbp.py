"""CBP (seed 000 Algorithm 1): formulas against an independent reference written from the paper's
pseudocode (float64, one tensor at a time), closed forms for constant gradients and torch.optim.SGD.
M2 centring: tests/models/test_centered_linear.py; LARS and LAMB: tests/orscale/test_optim_lamb_lars.py."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from torch import nn

from orscale.cbp import CBP, equalization_scales
from orscale.lamb_lars import LAMB, LARS
from tests.orscale.optim_helpers import assert_close_lists, grad_seq, make_params, run

pytestmark = pytest.mark.usefixtures("one_thread")


def ref_cbp(
    theta, grads, lr, betas=(0.9, 0.999), zeta=1e-3, rho=0.99, s_min=0.1, s_max=4.0, equalize=True, precondition=True
):
    """Algorithm 1 of the paper, literally, in float64. Returns (params per step, scales per step)."""
    b1, b2 = betas
    th = [t.detach().double().clone() for t in theta]
    m = [torch.zeros_like(t) for t in th]
    v = [torch.zeros_like(t) for t in th]
    q = [0.0] * len(th)
    out, scales = [], []
    for t, gs in enumerate(grads, start=1):
        gs = [g.double() for g in gs]
        if not equalize:
            s = [1.0] * len(th)
        elif t == 1:
            s = [1.0] * len(th)  # line 3: s_l = 1 at t = 1
        else:
            c = math.sqrt(sum(q) / len(q))
            s = [min(max(c / math.sqrt(ql), s_min), s_max) for ql in q]
        if equalize:  # line 4, after s is formed
            q = [rho * ql + (1 - rho) * float(g.pow(2).sum()) for ql, g in zip(q, gs, strict=True)]
        gt = [sl * g for sl, g in zip(s, gs, strict=True)]
        for i in range(len(th)):
            m[i] = b1 * m[i] + (1 - b1) * gt[i]
            mh = m[i] / (1 - b1**t)
            if precondition and t > 1:
                p_t = 1.0 / ((v[i] / (1 - b2 ** (t - 1))).sqrt() + zeta)
            else:
                p_t = torch.ones_like(mh)
            th[i] = th[i] - lr * p_t * mh
            v[i] = b2 * v[i] + (1 - b2) * gt[i] ** 2
        out.append([x.clone() for x in th])
        scales.append(s)
    return out, scales


# ----------------------------------------------------------------------------- CBP vs Algorithm 1
CONFIGS = {
    "full": dict(),
    "m1_only": dict(precondition=False),
    "m3_only": dict(equalize=False),
    "base": dict(equalize=False, precondition=False),
    "no_momentum": dict(betas=(0.0, 0.999)),
    "tight_clip": dict(s_min=0.5, s_max=1.5, rho=0.9),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cbp_matches_algorithm_1(name: str) -> None:
    kw = CONFIGS[name]
    params = make_params()
    theta0 = [p.detach().clone() for p in params]
    grads = grad_seq(12)
    got = run(CBP(params, lr=0.01, **kw), params, grads)
    want, _ = ref_cbp(theta0, grads, lr=0.01, **kw)
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        assert_close_lists(a, b), step


def test_first_step_is_plain_gradient_step() -> None:
    """t = 1: s = 1 and P_1 = I, so θ₁ = θ₀ − η·m̂₁ = θ₀ − η·g exactly, whatever the block scales."""
    params = make_params()
    theta0 = [p.detach().clone() for p in params]
    grads = grad_seq(1, spread=5.0)
    run(CBP(params, lr=0.1), params, grads)
    for p, t0, g in zip(params, theta0, grads[0], strict=True):
        torch.testing.assert_close(p.detach(), t0 - 0.1 * g, rtol=1e-6, atol=1e-7)


def test_second_step_by_hand() -> None:
    """Two one-element blocks, β1 = 0: step 2 uses s from q₁ = (1−ρ)g₁² and v̂₁ = (s₁g₁)² = g₁²."""
    a, b = nn.Parameter(torch.tensor([1.0])), nn.Parameter(torch.tensor([2.0]))
    opt = CBP([a, b], lr=0.1, betas=(0.0, 0.999))
    run(opt, [a, b], [[torch.tensor([0.01]), torch.tensor([1.0])]])  # θ = (0.999, 1.9)
    run(opt, [a, b], [[torch.tensor([0.02]), torch.tensor([0.5])]])
    q = [0.01 * 0.01**2, 0.01 * 1.0]
    c = math.sqrt(sum(q) / 2)
    s = [min(max(c / math.sqrt(x), 0.1), 4.0) for x in q]  # (4.0 clipped from 70.7, 0.707)
    assert s[0] == 4.0 and abs(s[1] - math.sqrt(0.5 * (1 + 1e-4))) < 1e-9
    want_a = 0.999 - 0.1 * s[0] * 0.02 / (0.01 + 1e-3)
    want_b = 1.9 - 0.1 * s[1] * 0.5 / (1.0 + 1e-3)
    assert abs(a.item() - want_a) < 1e-5 and abs(b.item() - want_b) < 1e-6


def multipliers(before, after, grads, lr):
    """Per-coordinate effective multiplier −Δθ/(η·g) (β1 = 0 makes it s_l·P_t)."""
    return [(b - a) / (lr * g) for a, b, g in zip(after, before, grads, strict=True)]


def test_lag_step_t_uses_only_past_statistics() -> None:
    lr, kw = 0.01, dict(betas=(0.0, 0.999))
    grads = grad_seq(6)
    other = grad_seq(6, seed=7, spread=6.0)
    alt = grads[:4] + [other[4], grads[5]]  # same history through t = 4, different g at t = 5
    runs = []
    for seq in (grads, alt):
        params = [nn.Parameter(p.detach().double()) for p in make_params()]
        opt = CBP(params, lr=lr, **kw)
        hist = [[p.detach().clone() for p in params]] + run(opt, params, seq)
        runs.append([multipliers(hist[t], hist[t + 1], seq[t], lr) for t in range(6)])
    for x, y in zip(runs[0][4], runs[1][4], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=0)  # step 5: identical operator
    # ...and the statistics do absorb g₅ afterwards: step 6's operator differs.
    assert any(not torch.allclose(x, y, rtol=1e-2) for x, y in zip(runs[0][5], runs[1][5], strict=True))


def test_lemma_1_bounds() -> None:
    """Every effective multiplier s_l/(√v̂_{t−1} + ζ) lies in [s_min/(G+ζ), s_max/ζ] for t ≥ 2,
    G = max|g̃| over the run; t = 1 gives exactly 1 (P_1 = I, s = 1)."""
    lr, zeta, steps = 1e-3, 1e-3, 25
    shapes = [(8, 8), (8,), (16, 8), (3, 16)]
    gen = torch.Generator().manual_seed(3)
    grads = []
    for _ in range(steps):  # heavy-tailed, block scales 1e-3 … 1e2, some tiny coordinates
        grads.append(
            [
                (10.0 ** (torch.randint(-3, 3, (), generator=gen).item())) * torch.randn(s, generator=gen) ** 3 + 1e-6
                for s in shapes
            ]
        )
    # float64 weights (fp32 state and update): Δθ is measured without the weights' rounding.
    params = [nn.Parameter(p.detach().double()) for p in make_params(shapes=shapes)]
    theta0 = [p.detach().clone() for p in params]
    opt = CBP(params, lr=lr, betas=(0.0, 0.999), zeta=zeta)
    hist = [theta0] + run(opt, params, grads)
    _, scales = ref_cbp(theta0, grads, lr=lr, betas=(0.0, 0.999), zeta=zeta)
    G = max(
        float((s * g.double()).abs().max())
        for sc, gs in zip(scales, grads, strict=True)
        for s, g in zip(sc, gs, strict=True)
    )
    lo, hi = 0.1 / (G + zeta), 4.0 / zeta
    seen_clip = {x for sc in scales for x in sc} & {0.1, 4.0}
    assert seen_clip, "the random problem should drive the M1 clip"
    for t in range(steps):
        for mult in multipliers(hist[t], hist[t + 1], grads[t], lr):
            if t == 0:
                torch.testing.assert_close(mult, torch.ones_like(mult), rtol=1e-3, atol=0)
            else:
                assert mult.min().item() >= lo * (1 - 1e-3) and mult.max().item() <= hi * (1 + 1e-3)


# ----------------------------------------------------------------------------- switches
def test_m1_off_m3_off_no_momentum_is_sgd() -> None:
    grads = grad_seq(5)
    a, b = make_params(), make_params()
    run(CBP(a, lr=0.05, betas=(0.0, 0.999), equalize=False, precondition=False), a, grads)
    run(torch.optim.SGD(b, lr=0.05), b, grads)
    assert_close_lists([p.detach() for p in a], [p.detach() for p in b], rtol=1e-6, atol=1e-7)


def test_m1_off_m3_off_is_bias_corrected_momentum() -> None:
    """The paper's base (Table 7): with a constant g, m̂_t = g for every t, so θ_t = θ₀ − tηg."""
    params = make_params()
    theta0 = [p.detach().clone() for p in params]
    g = grad_seq(1)[0]
    run(CBP(params, lr=0.01, equalize=False, precondition=False), params, [g] * 7)
    for p, t0, gi in zip(params, theta0, g, strict=True):
        torch.testing.assert_close(p.detach(), t0 - 7 * 0.01 * gi, rtol=1e-5, atol=1e-6)


def test_m1_off_m3_on_is_lagged_damped_adam() -> None:
    """Constant g: m̂ = g, v̂_{t−1} = g², so every step after the first is −η·g/(|g| + ζ)."""
    params = make_params()
    theta0 = [p.detach().clone() for p in params]
    g = grad_seq(1)[0]
    zeta = 0.05
    run(CBP(params, lr=0.01, equalize=False, zeta=zeta), params, [g] * 5)
    for p, t0, gi in zip(params, theta0, g, strict=True):
        want = t0 - 0.01 * gi - 4 * 0.01 * gi / (gi.abs() + zeta)
        torch.testing.assert_close(p.detach(), want, rtol=1e-5, atol=1e-6)


def test_equalization_scales_edge_cases() -> None:
    raw, s = equalization_scales(torch.zeros(3), 0.1, 4.0)
    assert torch.equal(s, torch.ones(3))  # no statistics yet: s = 1
    raw, s = equalization_scales(torch.tensor([1.0, 100.0, 0.0, 1e6]), 0.1, 4.0)
    c = math.sqrt((1 + 100 + 1e6) / 3)  # the q = 0 block is left out of c
    torch.testing.assert_close(raw, torch.tensor([c, c / 10, 1.0, c / 1e3]))
    torch.testing.assert_close(s, torch.tensor([4.0, 4.0, 1.0, 0.5774]), rtol=1e-4, atol=0)


# ----------------------------------------------------------------------------- state, sync, diag
def _roundtrip(sd: dict) -> dict:
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: CBP(ps, lr=0.01, weight_decay=0.1),
        lambda ps: CBP(ps, lr=0.01, weight_decay=0.1, decoupled_weight_decay=False, precondition=False),
        lambda ps: LAMB(ps, lr=0.01, weight_decay=0.1),
        lambda ps: LARS(ps, lr=0.5, weight_decay=0.01),
    ],
)
def test_state_dict_roundtrip_bit_identical(make) -> None:
    grads = grad_seq(6)
    a = make_params()
    opt_a = make(a)
    run(opt_a, a, grads[:3])
    b = [nn.Parameter(p.detach().clone()) for p in a]
    opt_b = make(b)
    opt_b.load_state_dict(_roundtrip(opt_a.state_dict()))
    run(opt_a, a, grads[3:])
    run(opt_b, b, grads[3:])
    for p, q in zip(a, b, strict=True):
        assert torch.equal(p, q)
        for key, val in opt_a.state[p].items():
            other = opt_b.state[q][key]
            assert torch.equal(val, other) if isinstance(val, torch.Tensor) else val == other, key


@pytest.mark.parametrize("cls", [CBP, LAMB, LARS])
def test_eager_state_and_dry_run_change_nothing(cls) -> None:
    params = make_params()
    opt = cls(params, lr=0.01)
    assert all(len(opt.state[p]) > 0 for p in params)  # eager
    before = copy.deepcopy(opt.state_dict())
    weights = [p.detach().clone() for p in params]
    for g in opt.param_groups:
        g["lr"] = 0.0
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    after = opt.state_dict()
    assert all(torch.equal(w, p) for w, p in zip(weights, params, strict=True))
    for i, st in before["state"].items():
        for key, val in st.items():
            other = after["state"][i][key]
            assert torch.equal(val, other) if isinstance(val, torch.Tensor) else val == other


@pytest.mark.parametrize(
    "make", [lambda ps: CBP(ps, lr=0.01), lambda ps: LAMB(ps, weight_decay=0.1), lambda ps: LARS(ps, weight_decay=0.1)]
)
def test_step_never_syncs_with_host(make, monkeypatch) -> None:
    params = make_params()
    opt = make(params)
    grads = grad_seq(3)

    def boom(*_a, **_k):
        raise AssertionError("host sync inside step()")

    for attr in ("item", "tolist", "__bool__", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, attr, boom)
    run(opt, params, grads)  # three steps: covers t = 1 and the lagged path
    monkeypatch.undo()
    assert all(torch.isfinite(p).all() for p in params)


def test_named_params_and_diagnostics() -> None:
    params = make_params()
    named = [(f"layer{i}", p) for i, p in enumerate(params)]
    opt = CBP(named, lr=0.01, betas=(0.0, 0.999))
    assert opt.param_groups[0]["param_names"] == [n for n, _ in named]
    assert opt.diagnostics() == {}
    theta0 = [p.detach().clone() for p in params]
    grads = grad_seq(4)
    run(opt, params, grads)
    d = opt.diagnostics()
    _, scales = ref_cbp(theta0, grads, lr=0.01, betas=(0.0, 0.999))
    s = scales[-1]
    assert abs(d["diag/cbp/s_mean"] - sum(s) / len(s)) < 1e-5
    assert abs(d["diag/cbp/s_min_frac"] - sum(x == 0.1 for x in s) / len(s)) < 1e-9
    assert abs(d["diag/cbp/s_max_frac"] - sum(x == 4.0 for x in s) / len(s)) < 1e-9
    norms = [float(g.norm()) for g in grads[-1]]
    assert abs(d["diag/cbp/grad_disparity"] - max(norms) / min(norms)) < 1e-3 * max(norms) / min(norms)
    eq = [a * b for a, b in zip(s, norms, strict=True)]
    assert abs(d["diag/cbp/eq_disparity"] - max(eq) / min(eq)) < 1e-3 * max(eq) / min(eq)
