"""LARS and LAMB against references written from their papers' definitions (float64) and against
timm's Lamb/Lars when timm is installed (CI installs it)."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import pathlib
import sys
import types

import pytest
import torch
from torch import nn

from orscale.lamb_lars import LAMB, LARS, trust_ratio_param_groups
from tests.orscale.optim_helpers import assert_close_lists, grad_seq, make_params, run

pytestmark = pytest.mark.usefixtures("one_thread")


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
            u = (m[i] / (1 - b1**t)) / ((v[i] / (1 - b2**t)).sqrt() + eps)
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
    moved = [((p.detach() - t0).norm() / t0.norm()).item() for p, t0 in zip(order, theta0, strict=True)]
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
        theirs = timm_lamb(
            [dict(params=mats, weight_decay=0.05, always_adapt=True), dict(params=vecs, weight_decay=0.0)],
            lr=0.02,
            max_grad_norm=None,
        )
    else:
        ours = LARS(ours_groups, lr=0.3)
        theirs = timm_lars(
            [dict(params=mats, weight_decay=0.05, always_adapt=True), dict(params=vecs, weight_decay=0.0)],
            lr=0.3,
            momentum=0.9,
        )
    losses = []
    for _ in range(15):
        for net, opt in ((model, ours), (twin, theirs)):
            opt.zero_grad()
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
        losses.append(loss.item())
    for (n, a), b in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)
    assert losses[-1] < losses[0]  # it trained (the comparison is not between frozen models)
