"""Tensor factories that must name their device. On a GPU the single-process, DDP and ZeRO
builds run under `with torch.device("cuda")`; a factory without `device=` then lands on CUDA and meets
a CPU generator or CPU tensors. The same class of bug shows on CPU under an ambient *meta* device: a
factory without a device makes a meta tensor, which either fails loudly or leaks into the numbers.
So model init, the loss and one step of every optimizer family run here under `torch.device("meta")`
and must equal the same work without it."""

from __future__ import annotations

import pytest
import torch

from launch.backends.registry import backend_for
from launch.engine.parallelize import build_model
from launch.plan import load_config
from launch.runtime.process_group import DistEnv
from models import GPT, get_preset
from orscale import OPTIMIZER_NAMES, OptimConfig, build_optimizers
from orscale.muon_spec import MuonOptions

CFG = get_preset("tiny", n_layer=2, d_model=32, n_head=2, max_seq_len=16, vocab_size=128)
CPU = DistEnv(0, 1, 0, torch.device("cpu"), "none")


def _batch() -> torch.Tensor:
    return torch.randint(0, CFG.vocab_size, (2, 17), generator=torch.Generator().manual_seed(5))


def test_init_value_is_cpu_and_unchanged_under_an_ambient_meta_device():
    model = GPT(CFG, seed=3)
    names = [n for n, _ in model.named_parameters()] + ["rope_cos"]
    plain = {n: model.init_value(n, 11) for n in names}
    with torch.device("meta"):
        ambient = {n: model.init_value(n, 11) for n in names}
    for name in names:
        assert ambient[name].device.type == "cpu", name
        assert torch.equal(ambient[name], plain[name]), name


@pytest.mark.parametrize("backend", ["none", "ddp"])  # the `with torch.device(env.device)` build path
def test_build_model_under_an_ambient_meta_device_gives_the_same_weights(backend):
    parallel = load_config(None, [f"parallel.backend={backend}"]).parallel
    plain = build_model(CFG, parallel, 7, CPU, backend=backend_for(parallel.backend))
    with torch.device("meta"):
        ambient = build_model(CFG, parallel, 7, CPU, backend=backend_for(parallel.backend))
        seedless = GPT(CFG)  # built on meta: nothing drawn, nothing initialised
    assert seedless.tok_emb.weight.is_meta
    for (name, a), (_, b) in zip(ambient.state_dict().items(), plain.state_dict().items(), strict=True):
        assert a.device.type == "cpu" and torch.equal(a, b), name
    with torch.device("cuda" if torch.cuda.is_available() else "meta"):  # GPT.init_weights draws on the CPU
        again = build_model(CFG, parallel, 7, CPU, backend=backend_for(parallel.backend))
    assert torch.equal(again.tok_emb.weight, plain.tok_emb.weight)


def test_loss_and_backward_under_an_ambient_meta_device():
    model, batch = GPT(CFG, seed=1), _batch()
    want = model(batch[:, :-1], batch[:, 1:])
    want.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    with torch.device("meta"):
        got = model(batch[:, :-1], batch[:, 1:])
        got.backward()
        per_token = model.token_losses(batch[:, :-1], batch[:, 1:])
    assert got.device.type == "cpu" and torch.equal(got, want)
    assert per_token.device.type == "cpu"
    for name, p in model.named_parameters():
        assert torch.equal(p.grad, grads[name]), name


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_one_optimizer_step_under_an_ambient_meta_device(name):
    """Every optimizer (state built eagerly, then two steps: calibration, trust ratio, diagnostics)
    with the steps run under an ambient meta device equals the same steps without it."""
    finals = []
    for ambient in (False, True):
        model, batch = GPT(CFG, seed=2), _batch()
        cfg = OptimConfig(name=name, lr=0.01).with_options(MuonOptions(ns_dtype="fp32", diagnostics=True))
        optimizers = build_optimizers(model, cfg)
        for _ in range(2):
            model(batch[:, :-1], batch[:, 1:]).backward()
            with torch.device("meta") if ambient else torch.device("cpu"):
                for opt in optimizers:
                    opt.step()
                    opt.zero_grad(set_to_none=True)
        finals.append({n: p.detach().clone() for n, p in model.named_parameters()})
    for key, value in finals[0].items():
        assert finals[1][key].device.type == "cpu" and torch.equal(finals[1][key], value), f"{name}: {key}"
