"""CBP (seed 000 Algorithm 1), M2 centring, LARS and LAMB: formulas against independent references.

References here are written from the paper's pseudocode (float64, one tensor at a time), closed
forms for constant gradients, torch.optim.SGD, and timm's Lamb/Lars when timm is installed.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import io
import math
import pathlib
import sys
import types

import pytest
import torch
from torch import nn

from models.centered_linear import CenteredLinear, fold_centered, update_means
from orscale.cbp import CBP, equalization_scales
from orscale.trust_ratio import LAMB, LARS, trust_ratio_param_groups

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPES = [(6, 4), (4,), (5, 6), (5,), (3, 5)]


# ----------------------------------------------------------------------------- helpers
def make_params(seed: int = 0, shapes=SHAPES) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]


def grad_seq(steps: int, seed: int = 1, shapes=SHAPES, spread: float = 3.0) -> list[list[torch.Tensor]]:
    """Random gradients whose block scales differ by up to e^±spread (so the M1 clip binds)."""
    gen = torch.Generator().manual_seed(seed)
    scales = [math.exp(spread * (2 * torch.rand((), generator=gen).item() - 1)) for _ in shapes]
    return [[k * torch.randn(s, generator=gen) for k, s in zip(scales, shapes)] for _ in range(steps)]


def run(opt: torch.optim.Optimizer, params: list[nn.Parameter], grads) -> list[list[torch.Tensor]]:
    """Apply the gradient sequence; returns the params after each step."""
    out = []
    for gs in grads:
        for p, g in zip(params, gs):
            p.grad = g.to(p.dtype, copy=True)
        opt.step()
        out.append([p.detach().clone() for p in params])
    return out


def ref_cbp(theta, grads, lr, betas=(0.9, 0.999), zeta=1e-3, rho=0.99, s_min=0.1, s_max=4.0,
            equalize=True, precondition=True):
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
            q = [rho * ql + (1 - rho) * float(g.pow(2).sum()) for ql, g in zip(q, gs)]
        gt = [sl * g for sl, g in zip(s, gs)]
        for i in range(len(th)):
            m[i] = b1 * m[i] + (1 - b1) * gt[i]
            mh = m[i] / (1 - b1 ** t)
            if precondition and t > 1:
                p_t = 1.0 / ((v[i] / (1 - b2 ** (t - 1))).sqrt() + zeta)
            else:
                p_t = torch.ones_like(mh)
            th[i] = th[i] - lr * p_t * mh
            v[i] = b2 * v[i] + (1 - b2) * gt[i] ** 2
        out.append([x.clone() for x in th])
        scales.append(s)
    return out, scales


def assert_close_lists(a, b, rtol=2e-5, atol=1e-6):
    for x, y in zip(a, b):
        torch.testing.assert_close(x.double(), y.double(), rtol=rtol, atol=atol)


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
    for step, (a, b) in enumerate(zip(got, want)):
        assert_close_lists(a, b), step


def test_first_step_is_plain_gradient_step() -> None:
    """t = 1: s = 1 and P_1 = I, so θ₁ = θ₀ − η·m̂₁ = θ₀ − η·g exactly, whatever the block scales."""
    params = make_params()
    theta0 = [p.detach().clone() for p in params]
    grads = grad_seq(1, spread=5.0)
    run(CBP(params, lr=0.1), params, grads)
    for p, t0, g in zip(params, theta0, grads[0]):
        torch.testing.assert_close(p.detach(), t0 - 0.1 * g, rtol=1e-6, atol=1e-7)


def test_second_step_by_hand() -> None:
    """Two one-element blocks, β1 = 0: step 2 uses s from q₁ = (1−ρ)g₁² and v̂₁ = (s₁g₁)² = g₁²."""
    a, b = nn.Parameter(torch.tensor([1.0])), nn.Parameter(torch.tensor([2.0]))
    opt = CBP([a, b], lr=0.1, betas=(0.0, 0.999))
    run(opt, [a, b], [[torch.tensor([0.01]), torch.tensor([1.0])]])  # θ = (0.999, 1.9)
    run(opt, [a, b], [[torch.tensor([0.02]), torch.tensor([0.5])]])
    q = [0.01 * 0.01 ** 2, 0.01 * 1.0]
    c = math.sqrt(sum(q) / 2)
    s = [min(max(c / math.sqrt(x), 0.1), 4.0) for x in q]  # (4.0 clipped from 70.7, 0.707)
    assert s[0] == 4.0 and abs(s[1] - math.sqrt(0.5 * (1 + 1e-4))) < 1e-9
    want_a = 0.999 - 0.1 * s[0] * 0.02 / (0.01 + 1e-3)
    want_b = 1.9 - 0.1 * s[1] * 0.5 / (1.0 + 1e-3)
    assert abs(a.item() - want_a) < 1e-5 and abs(b.item() - want_b) < 1e-6


def multipliers(before, after, grads, lr):
    """Per-coordinate effective multiplier −Δθ/(η·g) (β1 = 0 makes it s_l·P_t)."""
    return [(b - a) / (lr * g) for a, b, g in zip(after, before, grads)]


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
    for x, y in zip(runs[0][4], runs[1][4]):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=0)  # step 5: identical operator
    # ...and the statistics do absorb g₅ afterwards: step 6's operator differs.
    assert any(not torch.allclose(x, y, rtol=1e-2) for x, y in zip(runs[0][5], runs[1][5]))


def test_lemma_1_bounds() -> None:
    """Every effective multiplier s_l/(√v̂_{t−1} + ζ) lies in [s_min/(G+ζ), s_max/ζ] for t ≥ 2,
    G = max|g̃| over the run; t = 1 gives exactly 1 (P_1 = I, s = 1)."""
    lr, zeta, steps = 1e-3, 1e-3, 25
    shapes = [(8, 8), (8,), (16, 8), (3, 16)]
    gen = torch.Generator().manual_seed(3)
    grads = []
    for t in range(steps):  # heavy-tailed, block scales 1e-3 … 1e2, some tiny coordinates
        grads.append([(10.0 ** (torch.randint(-3, 3, (), generator=gen).item()))
                      * torch.randn(s, generator=gen) ** 3 + 1e-6 for s in shapes])
    # float64 weights (fp32 state and update): Δθ is measured without the weights' rounding.
    params = [nn.Parameter(p.detach().double()) for p in make_params(shapes=shapes)]
    theta0 = [p.detach().clone() for p in params]
    opt = CBP(params, lr=lr, betas=(0.0, 0.999), zeta=zeta)
    hist = [theta0] + run(opt, params, grads)
    _, scales = ref_cbp(theta0, grads, lr=lr, betas=(0.0, 0.999), zeta=zeta)
    G = max(float((s * g.double()).abs().max()) for sc, gs in zip(scales, grads) for s, g in zip(sc, gs))
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
    for p, t0, gi in zip(params, theta0, g):
        torch.testing.assert_close(p.detach(), t0 - 7 * 0.01 * gi, rtol=1e-5, atol=1e-6)


def test_m1_off_m3_on_is_lagged_damped_adam() -> None:
    """Constant g: m̂ = g, v̂_{t−1} = g², so every step after the first is −η·g/(|g| + ζ)."""
    params = make_params()
    theta0 = [p.detach().clone() for p in params]
    g = grad_seq(1)[0]
    zeta = 0.05
    run(CBP(params, lr=0.01, equalize=False, zeta=zeta), params, [g] * 5)
    for p, t0, gi in zip(params, theta0, g):
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


@pytest.mark.parametrize("make", [lambda ps: CBP(ps, lr=0.01, weight_decay=0.1),
                                  lambda ps: CBP(ps, lr=0.01, weight_decay=0.1,
                                                 decoupled_weight_decay=False, precondition=False),
                                  lambda ps: LAMB(ps, lr=0.01, weight_decay=0.1),
                                  lambda ps: LARS(ps, lr=0.5, weight_decay=0.01)])
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
    for p, q in zip(a, b):
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
    assert all(torch.equal(w, p) for w, p in zip(weights, params))
    for i, st in before["state"].items():
        for key, val in st.items():
            other = after["state"][i][key]
            assert torch.equal(val, other) if isinstance(val, torch.Tensor) else val == other


@pytest.mark.parametrize("make", [lambda ps: CBP(ps, lr=0.01), lambda ps: LAMB(ps, weight_decay=0.1),
                                  lambda ps: LARS(ps, weight_decay=0.1)])
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
    eq = [a * b for a, b in zip(s, norms)]
    assert abs(d["diag/cbp/eq_disparity"] - max(eq) / min(eq)) < 1e-3 * max(eq) / min(eq)


# ----------------------------------------------------------------------------- M2 centring
def test_centered_linear_mean_update_keeps_function_exact() -> None:
    torch.manual_seed(0)
    layer = CenteredLinear(16, 8, rho=0.5)  # fast EMA: a large μ move
    with torch.no_grad():
        layer.mu.copy_(torch.rand(16))
    x = torch.relu(torch.randn(64, 16)) + 3.0  # large, positive mean: the ReLU regime
    probe = torch.randn(32, 16) * 2 + 1
    layer.train()
    mu0 = layer.mu.clone()
    layer(x).sum().backward()  # records x̄ (training mode, grad enabled)
    assert torch.equal(layer.mu, mu0)  # forward only records; μ waits for update_mean()
    with torch.no_grad():  # not recorded
        y0, b0 = layer(probe), layer.bias.detach().clone()
    layer.update_mean()
    with torch.no_grad():
        y1 = layer(probe)
    assert (layer.mu - mu0).abs().max() > 0.5 and (layer.bias - b0).abs().max() > 0.1
    torch.testing.assert_close(layer.mu, 0.5 * mu0 + 0.5 * x.mean(0))
    assert ((y1 - y0).norm() / y0.norm()).item() < 1e-6
    folded = layer.fold()
    assert ((folded(probe) - y1).norm() / y1.norm()).item() < 1e-6


def test_centered_linear_compiles_once_and_idles_without_records() -> None:
    """The row count is a tensor: a compiled forward is not recompiled per micro-batch (it was,
    guarding on a Python int), and a step with nothing recorded leaves μ and b̃ bit-identical."""
    import torch._dynamo

    torch.manual_seed(3)
    layer = CenteredLinear(16, 8)
    compiled = torch.compile(layer, backend="eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(2):
            for _ in range(3):  # gradient-accumulation micro-batches
                compiled(torch.rand(2, 5, 16)).sum().backward()
            layer.update_mean()
    assert layer.mu.abs().min() > 0 and int(layer._rows) == 0
    mu, bias = layer.mu.clone(), layer.bias.detach().clone()
    layer.average_mean_(lambda t: t)
    layer.update_mean()  # no training forward since the last update
    assert torch.equal(layer.mu, mu) and torch.equal(layer.bias, bias)


def test_centered_linear_gradient_is_centered() -> None:
    """Eq. (9): ∂L/∂W = δ·(x − μ)ᵀ."""
    torch.manual_seed(1)
    layer = CenteredLinear(5, 3)
    with torch.no_grad():
        layer.mu.copy_(torch.randn(5))
    x, delta = torch.randn(7, 5), torch.randn(7, 3)
    (layer(x) * delta).sum().backward()
    torch.testing.assert_close(layer.weight.grad, delta.T @ (x - layer.mu))


def test_centered_training_loop_is_continuous_and_ranks_agree() -> None:
    torch.manual_seed(2)
    model = nn.Sequential(CenteredLinear(4, 16), nn.ReLU(), CenteredLinear(16, 3))
    twin = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    for _ in range(5):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        with torch.no_grad():
            before = model(x)
        update_means(model)
        with torch.no_grad():
            torch.testing.assert_close(model(x), before, rtol=1e-5, atol=1e-6)
    assert model[2].mu.abs().max() > 0 and "mu" in model[2].state_dict()
    assert "_sum" not in model[2].state_dict()
    # Two "ranks" with different batches end with the same μ once the batch means are averaged.
    xa, xb = torch.randn(8, 4), torch.randn(8, 4) + 1
    ra, rb = copy.deepcopy(twin), copy.deepcopy(twin)
    ra(xa), rb(xb)
    for i in (0, 2):  # stands in for all_reduce(AVG) over the two ranks, layer by layer
        ma, mb = ra[i]._sum / ra[i]._rows, rb[i]._sum / rb[i]._rows
        ra[i].average_mean_(lambda t, a=ma, b=mb: t.copy_((a + b) / 2))  # in place
        rb[i].average_mean_(lambda t, a=ma, b=mb: (a + b) / 2)  # returned
    update_means(ra)
    update_means(rb)
    for i in (0, 2):
        torch.testing.assert_close(ra[i].mu, rb[i].mu)
        torch.testing.assert_close(ra[i].bias, rb[i].bias)
    torch.testing.assert_close(ra[0].mu, 0.01 * (xa.mean(0) + xb.mean(0)) / 2)
    plain = fold_centered(copy.deepcopy(model))
    assert not any(isinstance(m, CenteredLinear) for m in plain.modules())
    torch.testing.assert_close(plain(x), model(x), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- LAMB / LARS
def ref_lamb(theta, grads, lr, wd, trust, betas=(0.9, 0.999), eps=1e-6):
    b1, b2 = betas
    th = [t.double().clone() for t in theta]
    m = [torch.zeros_like(t) for t in th]
    v = [torch.zeros_like(t) for t in th]
    for t, gs in enumerate(grads, start=1):
        for i, g in enumerate(gs):
            g = g.double()
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            u = (m[i] / (1 - b1 ** t)) / ((v[i] / (1 - b2 ** t)).sqrt() + eps)
            d = u + wd[i] * th[i]
            wn, dn = th[i].norm(), d.norm()
            r = wn / dn if trust[i] and wn > 0 and dn > 0 else 1.0
            th[i] = th[i] - lr * r * d
    return th


def ref_lars(theta, grads, lr, wd, trust, momentum=0.9, eta=1e-3, eps=1e-8):
    th = [t.double().clone() for t in theta]
    buf = [torch.zeros_like(t) for t in th]
    for gs in grads:
        for i, g in enumerate(gs):
            g = g.double()
            wn, gn = th[i].norm(), g.norm()
            r = eta * wn / (gn + wd[i] * wn + eps) if trust[i] and wn > 0 and gn > 0 else 1.0
            buf[i] = momentum * buf[i] + r * (g + wd[i] * th[i])
            th[i] = th[i] - lr * buf[i]
    return th


def _split(params):
    named = [(f"p{i}", p) for i, p in enumerate(params)]
    groups = trust_ratio_param_groups(named, weight_decay=0.1)
    assert [g["trust"] for g in groups] == [True, False]
    order = [p for g in groups for _, p in g["params"]]
    return groups, order


@pytest.mark.parametrize("cls,lr", [(LAMB, 0.01), (LARS, 2.0)])
def test_trust_ratio_against_reference(cls, lr) -> None:
    params = make_params()
    groups, order = _split(params)
    theta0 = [p.detach().clone() for p in order]
    grads = grad_seq(8, shapes=[tuple(p.shape) for p in order])
    run(cls(groups, lr=lr), order, grads)
    wd = [0.1 if p.ndim >= 2 else 0.0 for p in order]
    trust = [p.ndim >= 2 for p in order]
    ref = (ref_lamb if cls is LAMB else ref_lars)(theta0, grads, lr, wd, trust)
    assert_close_lists([p.detach() for p in order], ref, rtol=1e-5, atol=1e-6)
    moved = [((p.detach() - t0).norm() / t0.norm()).item() for p, t0 in zip(order, theta0)]
    assert min(moved) > 1e-5  # every tensor, trust-ratio or not, was updated


def _load_timm():
    """timm's Lamb/Lars without importing timm/__init__ (which needs torchvision)."""
    spec = importlib.util.find_spec("timm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("timm not installed")
    root = pathlib.Path(list(spec.submodule_search_locations)[0])
    saved = {k: sys.modules.get(k) for k in ("timm", "timm.optim")}
    try:
        for name, path in (("timm", root), ("timm.optim", root / "optim")):
            mod = types.ModuleType(name)
            mod.__path__ = [str(path)]
            sys.modules[name] = mod
        lamb = importlib.import_module("timm.optim.lamb").Lamb
        lars = importlib.import_module("timm.optim.lars").Lars
    finally:
        for k in [k for k in sys.modules if k == "timm" or k.startswith("timm.")]:
            del sys.modules[k]
        sys.modules.update({k: v for k, v in saved.items() if v is not None})
    return lamb, lars


@pytest.mark.parametrize("which", ["lamb", "lars"])
def test_trust_ratio_against_timm(which: str) -> None:
    """A small MLP regression trained 15 steps by ours and by timm's implementation."""
    timm_lamb, timm_lars = _load_timm()
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))
    twin = copy.deepcopy(model)
    x, y = torch.randn(64, 6), torch.randn(64, 3)
    ours_groups = trust_ratio_param_groups(model.named_parameters(), weight_decay=0.05)
    mats = [p for n, p in twin.named_parameters() if p.ndim >= 2]
    vecs = [p for n, p in twin.named_parameters() if p.ndim < 2]
    if which == "lamb":
        ours = LAMB(ours_groups, lr=0.02)
        theirs = timm_lamb([dict(params=mats, weight_decay=0.05, always_adapt=True),
                            dict(params=vecs, weight_decay=0.0)], lr=0.02, max_grad_norm=None)
    else:
        ours = LARS(ours_groups, lr=0.3)
        theirs = timm_lars([dict(params=mats, weight_decay=0.05, always_adapt=True),
                            dict(params=vecs, weight_decay=0.0)], lr=0.3, momentum=0.9)
    losses = []
    for _ in range(15):
        for net, opt in ((model, ours), (twin, theirs)):
            opt.zero_grad()
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
        losses.append(loss.item())
    for (n, a), b in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)
    assert losses[-1] < losses[0]  # it trained (the comparison is not between frozen models)
