"""M2 activation centring (seed 000 §4, eq. 9–10): a mean update with bias transport leaves the
function unchanged; the gradient is centred; ranks agree once batch means are averaged."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from models.centered_linear import CenteredLinear, fold_centered, update_means

pytestmark = pytest.mark.usefixtures("one_thread")


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
