"""orscale.OrScaleLM, one optimizer for a whole model: which parameter takes which step (the one rule
the trainer shares), every parameter trained, equal to the project's two-optimizer step, conv
weights, name patterns, and copies that step as the original."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

from orscale import (
    MuonFamily,
    OptimConfig,
    OrScaleLM,
    ReplicatedMuonFamily,
    build_optimizers,
    hidden_matrices,
    set_lr,
)
from orscale.muon_spec import MuonOptions
from orscale.routing import route_parameters
from tests.orscale.optim_helpers import gpt_hidden, hf_gpt2, lm_step_grads, matrices, set_grads

pytestmark = pytest.mark.usefixtures("one_thread")

GPT2_HIDDEN = {
    f"transformer.h.{i}.{m}.weight" for i in range(2) for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
}


def _kinds(opt: torch.optim.Optimizer) -> dict[str, set[str]]:
    return {g["kind"]: set(g["param_names"]) for g in opt.param_groups}


# ----------------------------------------------------------------------------- the rule
@pytest.mark.parametrize("preset", ["tiny", "125m"])
@pytest.mark.parametrize("center_mlp", [False, True])
def test_the_projects_gpt_routes_as_the_paper_names_it(preset: str, center_mlp: bool) -> None:
    """The general rule on this project's GPT: exactly the blocks' 2-D weights, in order (the tied
    embedding, norm gains and CBP's centring biases are AdamW's), and route_parameters' groups."""
    from models.gpt import GPT
    from models.presets import get_preset

    with torch.device("meta"):
        model = GPT(get_preset(preset, center_mlp=center_mlp))
    named = list(model.named_parameters())
    expected = [n for n, p in named if gpt_hidden(n, p)]
    assert [n for n, _ in hidden_matrices(named, model)] == expected
    routing = route_parameters(model, OptimConfig(name="orscale_lm"))
    assert [n for n, _ in routing.matrices] == expected
    assert [[n for n, _ in g["params"]] for g in routing.adamw_groups] == [
        [n for n, p in named if not gpt_hidden(n, p)]
    ]


@pytest.mark.parametrize("tied", [True, False])
def test_hf_gpt2_embeddings_and_head_are_adamws(tied: bool) -> None:
    """wte and wpe (nn.Embedding), lm_head (tied to wte, or its own [vocab, width] matrix), norms and
    biases go to AdamW; the blocks' Conv1D matrices to the Muon step; from the modules, or from the
    names with a warning that they were guessed."""
    model = hf_gpt2(tied=tied)
    named = list(model.named_parameters())
    kinds = _kinds(OrScaleLM(model))
    assert kinds["muon"] == GPT2_HIDDEN
    assert kinds["adamw"] == {n for n, _ in named} - GPT2_HIDDEN
    assert ("lm_head.weight" in kinds["adamw"]) == (not tied)
    with pytest.warns(UserWarning, match="routing guessed: no model given, so roles come from parameter names"):
        assert _kinds(OrScaleLM(model.named_parameters())) == kinds


def test_filtering_by_shape_alone_is_refused() -> None:
    model = hf_gpt2()
    with pytest.raises(ValueError, match=r"plain tensors cannot be routed .*named_parameters\(\)"):
        OrScaleLM(model.parameters())


def test_plain_tensors_and_groups_with_the_model_are_routed_as_the_model() -> None:
    """model=: plain tensors, and groups without a 'kind' (the Hugging Face Trainer's, with and without
    weight decay), split as OrScaleLM(model) splits them, each part keeping its group's settings."""
    model = hf_gpt2()
    own = _kinds(OrScaleLM(model))
    assert _kinds(OrScaleLM(model.parameters(), model=model)) == own
    decayed = [p for p in model.parameters() if p.ndim == 2]
    groups = [{"params": decayed, "weight_decay": 0.1}, {"params": [p for p in model.parameters() if p.ndim < 2]}]
    opt = OrScaleLM(groups, model=model, weight_decay=0.0)
    assert [(g["kind"], g["weight_decay"]) for g in opt.param_groups] == [("muon", 0.1), ("adamw", 0.1), ("adamw", 0.0)]
    assert set(opt.param_groups[0]["param_names"]) == own["muon"] == GPT2_HIDDEN
    assert set(opt.param_groups[1]["param_names"]) | set(opt.param_groups[2]["param_names"]) == own["adamw"]
    with pytest.raises(ValueError, match=r"a param group without 'kind' holds 2-D tensors: pass model=model"):
        OrScaleLM(groups)
    with pytest.raises(
        ValueError, match=r"a tensor of shape \(3, 3\) in a param group without 'kind' is not a parameter"
    ):
        OrScaleLM([{"params": [nn.Parameter(torch.ones(3, 3))]}], model=model)
    with pytest.raises(ValueError, match="params is a model and model= is another one"):
        OrScaleLM(model, model=hf_gpt2())


def test_name_patterns_override_the_rule() -> None:
    model = hf_gpt2()
    kinds = _kinds(OrScaleLM(model, muon_names=[r"\.wpe\."], adamw_names=[r"mlp\.c_fc"]))
    fc = {n for n in GPT2_HIDDEN if "c_fc" in n}
    assert kinds["muon"] == GPT2_HIDDEN - fc | {"transformer.wpe.weight"}
    assert fc <= kinds["adamw"]
    with pytest.raises(ValueError, match=r"matches muon_names 'c_fc' and adamw_names 'mlp'"):
        OrScaleLM(model, muon_names=["c_fc"], adamw_names=["mlp"])
    with pytest.raises(ValueError, match=r"muon_names 'ln_f' matches 'transformer.ln_f.weight' of shape \(32,\)"):
        OrScaleLM(model, muon_names=["ln_f"])
    with pytest.raises(ValueError, match=r"adamw_names: '\(' is not a regular expression"):
        OrScaleLM(model, adamw_names=["("])


def test_frozen_parameters_are_left_out() -> None:
    model = hf_gpt2()
    model.transformer.wpe.weight.requires_grad_(False)
    model.transformer.h[0].attn.c_attn.weight.requires_grad_(False)
    names = {n for g in OrScaleLM(model).param_groups for n in g["param_names"]}
    assert "transformer.wpe.weight" not in names and "transformer.h.0.attn.c_attn.weight" not in names


# ----------------------------------------------------------------------------- the step
def test_one_optimizer_trains_every_parameter_and_equals_two() -> None:
    """OrScaleLM on GPT2 moves every parameter, and matches build_optimizers' MuonFamily + AdamW
    on the same split (the trainer's OrScale-LM) to fp32 rounding, at distinct LRs."""
    model, twin = hf_gpt2(), hf_gpt2()
    opt = OrScaleLM(model, lr=0.02, adamw_lr=0.005, ns_dtype="fp32")
    cfg = OptimConfig(name="orscale_lm", lr=0.02, adamw_lr=0.005).with_options(MuonOptions(ns_dtype="fp32"))
    pair = build_optimizers(twin, cfg)
    set_lr(pair, cfg.lr)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    for t in range(3):
        lm_step_grads(model, seed=t)
        lm_step_grads(twin, seed=t)
        opt.step()
        for o in pair:
            o.step()
    for (n, p), (_, q) in zip(model.named_parameters(), twin.named_parameters(), strict=True):
        assert not torch.equal(p, start[n]), n
        torch.testing.assert_close(p, q, msg=n)


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.norm = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 6, 3, bias=False)
        self.fc = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.norm(self.conv1(x)))
        return self.fc(self.conv2(x).mean((2, 3)))


def test_cnn_conv_weights_go_to_adamw_or_flattened_to_muon() -> None:
    """Conv weights: AdamW by default; with flatten_conv, the Muon step on their [out, in·k·k]
    matrices, exactly as MuonFamily steps those matrices given as 2-D tensors. The classifier `fc`
    (the last nn.Linear) is AdamW's either way."""
    torch.manual_seed(0)
    model = CNN()
    with pytest.warns(UserWarning, match="found no hidden matrices"):
        assert set(_kinds(OrScaleLM(model))) == {"adamw"}  # fc, its output layer, is AdamW's too
    opt = OrScaleLM(model, flatten_conv=True, ns_dtype="fp32", lr=0.05)
    assert _kinds(opt)["muon"] == {"conv1.weight", "conv2.weight"}
    flat = [nn.Parameter(p.detach().flatten(1).clone()) for p in opt.param_groups[0]["params"]]
    reference = MuonFamily(flat, lr=0.05, ns_dtype="fp32")
    x = torch.randn(4, 3, 9, 9, generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        model.zero_grad()
        model(x).square().mean().backward()
        for p, q in zip(opt.param_groups[0]["params"], flat, strict=True):
            q.grad = p.grad.flatten(1).clone()
        opt.step()
        reference.step()
    for p, q in zip(opt.param_groups[0]["params"], flat, strict=True):
        assert torch.equal(p.detach().flatten(1), q.detach())
    # The owner-rank subclasses lay a conv weight out as its matrix too (one process here)
    conv = [nn.Parameter(p.detach().clone()) for p in opt.param_groups[0]["params"]]
    replicated = ReplicatedMuonFamily(conv, lr=0.05, ns_dtype="fp32")
    assert [[lay.m, lay.n] for lay in replicated._layout.values()] == [[8, 27], [6, 72]]
    channels_last = CNN().to(memory_format=torch.channels_last)
    with pytest.raises(
        ValueError, match=r"'conv1.weight' \(8, 3, 3, 3\) as a \[out, in·k…\] view, which needs a contiguous"
    ):
        OrScaleLM(channels_last, flatten_conv=True)


# ----------------------------------------------------------------------------- copies
def _deepcopy(obj):
    return copy.deepcopy(obj)


def _pickle(obj):
    return pickle.loads(pickle.dumps(obj))


def _torch_save(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def _muon_family() -> tuple[nn.Module, torch.optim.Optimizer]:
    named = matrices()
    model = nn.ParameterDict({n.replace(".", "_"): p for n, p in named})
    return model, MuonFamily(named, lr=0.02, ns_dtype="fp32")


def _orscale_lm() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = hf_gpt2()
    return model, OrScaleLM(model, lr=0.02, adamw_lr=0.005, ns_dtype="fp32")


def _grads(model: nn.Module, seed: int) -> None:
    if hasattr(model, "config"):
        lm_step_grads(model, seed)
    else:
        set_grads(list(model.named_parameters()), 1.0, seed)


@pytest.mark.parametrize("make", [_muon_family, _orscale_lm], ids=["MuonFamily", "OrScaleLM"])
@pytest.mark.parametrize("how", [_deepcopy, _pickle, _torch_save], ids=["deepcopy", "pickle", "torch.save"])
def test_a_copy_steps_as_the_original(make, how) -> None:
    """A copy of (model, optimizer), taken after a step with an LR scheduler attached, steps exactly as
    the original (calibration constants, momentum, AdamW moments, variant, counters all carried) and
    never steps the original (the scheduler's step wrapper stays behind)."""
    model, opt = make()
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    _grads(model, seed=0)
    opt.step()
    scheduler.step()
    model2, opt2 = how((model, opt))
    assert type(opt2) is type(opt) and opt2.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()}
    for t in (1, 2):
        _grads(model2, seed=t)
        opt2.step()
    for n, p in model.named_parameters():
        assert torch.equal(p, frozen[n]), f"stepping the copy moved the original's {n}"
    for t in (1, 2):
        _grads(model, seed=t)
        opt.step()
    for (n, p), (_, q) in zip(model.named_parameters(), model2.named_parameters(), strict=True):
        assert torch.equal(p, q), n


def test_one_ns_dtype_default() -> None:
    """The class, the config and OrScaleLM default to auto: fp32 on a CPU (bf16 on CUDA)."""
    import inspect

    assert inspect.signature(MuonFamily).parameters["ns_dtype"].default == MuonOptions().ns_dtype == "auto"
    assert inspect.signature(OrScaleLM).parameters["ns_dtype"].default == "auto"
    assert MuonFamily([nn.Parameter(torch.ones(3, 2))]).param_groups[0]["ns_dtype"] == "fp32"
    assert OrScaleLM(hf_gpt2()).param_groups[0]["ns_dtype"] == "fp32"
