"""orscale.OrScaleLM keeps torch.optim's conventions: hooks, closure, zero_grad, state dicts (round
trips, independence, DCP), LR schedulers on both kinds of group, add_param_group, torch.compile, and
a documented public API."""

from __future__ import annotations

import copy
import inspect
import io
import pydoc

import pytest
import torch
from torch import nn

import orscale
from orscale import OrScaleLM
from tests.orscale.optim_helpers import hf_gpt2, lm_step_grads

pytestmark = pytest.mark.usefixtures("one_thread")


def _opt(model: nn.Module, **kw) -> OrScaleLM:
    return OrScaleLM(model, lr=0.02, adamw_lr=0.005, ns_dtype="fp32", **kw)


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_hooks_fire_once_per_call() -> None:
    model = hf_gpt2()
    opt = _opt(model)
    seen: list[str] = []
    opt.register_step_pre_hook(lambda o, args, kwargs: seen.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: seen.append("post"))
    opt.register_state_dict_pre_hook(lambda o: seen.append("sd_pre"))
    opt.register_state_dict_post_hook(lambda o, sd: seen.append("sd_post"))
    opt.register_load_state_dict_pre_hook(lambda o, sd: seen.append("load_pre"))
    opt.register_load_state_dict_post_hook(lambda o: seen.append("load_post"))
    lm_step_grads(model, 0)
    opt.step()
    opt.load_state_dict(opt.state_dict())
    assert seen == ["pre", "post", "sd_pre", "sd_post", "load_pre", "load_post"]


def test_closure_is_evaluated_once_with_grad_and_its_loss_returned() -> None:
    model, twin = hf_gpt2(), hf_gpt2()
    opt, ref = _opt(model), _opt(twin)
    calls = []

    def closure() -> float:
        calls.append(torch.is_grad_enabled())
        lm_step_grads(model, 0)
        return 1.5

    assert opt.step(closure) == 1.5 and calls == [True]
    lm_step_grads(twin, 0)
    assert ref.step() is None
    for (n, p), (_, q) in zip(model.named_parameters(), twin.named_parameters(), strict=True):
        assert torch.equal(p, q), n


def test_zero_grad_reaches_both_kinds() -> None:
    model = hf_gpt2()
    opt = _opt(model)
    lm_step_grads(model, 0)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_state_dict_round_trip_into_a_new_model_is_bit_equal() -> None:
    """Through torch.save / torch.load(weights_only=True) into another model's optimizer: the same
    groups (kinds, LRs), state and next steps, bit for bit."""
    model = hf_gpt2()
    opt = _opt(model)
    for t in range(2):
        lm_step_grads(model, t)
        opt.step()
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    fresh = hf_gpt2(seed=1)
    fresh.load_state_dict(saved["model"])
    fresh_opt = _opt(fresh)
    fresh_opt.load_state_dict(saved["optim"])
    assert [(g["kind"], g["lr"]) for g in fresh_opt.param_groups] == [("muon", 0.02), ("adamw", 0.005)]
    assert fresh_opt.muon.state is fresh_opt.state and fresh_opt.adamw.state is fresh_opt.state
    assert fresh_opt.param_groups == fresh_opt.muon.param_groups + fresh_opt.adamw.param_groups
    for t in (2, 3):
        for m, o in ((model, opt), (fresh, fresh_opt)):
            lm_step_grads(m, t)
            o.step()
    for (n, p), (_, q) in zip(model.named_parameters(), fresh.named_parameters(), strict=True):
        assert torch.equal(p, q), n


def test_state_dict_is_independent_of_the_optimizer() -> None:
    """Changing a returned state dict's groups, or a loaded one afterwards, leaves the optimizer alone;
    a state dict from one optimizer refers to parameters by position, not identity; one with other
    kinds of groups is refused in one line."""
    model = hf_gpt2()
    opt = _opt(model)
    sd = opt.state_dict()
    sd["param_groups"][0]["lr"] = 9.0
    assert opt.param_groups[0]["lr"] == 0.02
    other = _opt(hf_gpt2())
    other.load_state_dict(sd)
    sd["param_groups"][1]["lr"] = 7.0
    assert [g["lr"] for g in other.param_groups] == [9.0, 0.005]
    assert (
        other.muon.state[other.param_groups[0]["params"][0]]["momentum_buffer"]
        is not (opt.state[opt.param_groups[0]["params"][0]]["momentum_buffer"])
    )
    swapped = dict(sd, param_groups=sd["param_groups"][::-1])
    with pytest.raises(
        ValueError, match=r"param groups of kinds \['adamw', 'muon'\], this optimizer \['muon', 'adamw'\]"
    ):
        other.load_state_dict(swapped)


def test_adamw_state_is_torchs_from_the_start() -> None:
    """AdamW's state exists before the first step (so a checkpoint helper that fills existing state
    saves it), as torch's AdamW creates it at its first step: same keys, dtypes, devices, shapes."""
    model = hf_gpt2()
    opt = _opt(model)
    rest = opt.param_groups[1]["params"]
    torch_adamw = torch.optim.AdamW([nn.Parameter(p.detach().clone()) for p in rest], foreach=True)
    for p in torch_adamw.param_groups[0]["params"]:
        p.grad = torch.zeros_like(p)
    torch_adamw.step()
    for p, q in zip(rest, torch_adamw.param_groups[0]["params"], strict=True):
        ours, theirs = opt.state[p], torch_adamw.state[q]
        assert ours.keys() == theirs.keys()
        for key in ours:
            a, b = ours[key], theirs[key]
            assert (a.dtype, a.device, a.shape, a.is_contiguous()) == (b.dtype, b.device, b.shape, b.is_contiguous())


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_checkpoint_of_a_fresh_optimizer_restores_both_parts(tmp_path) -> None:
    """get_state_dict -> dcp.save -> dcp.load -> set_state_dict, torch.distributed.checkpoint's path (the
    one accelerate's and torchtitan's FSDP2 checkpoints take): the resumed optimizer steps as the
    original, AdamW moments included."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model = hf_gpt2()
    opt = _opt(model)
    for t in range(2):
        lm_step_grads(model, t)
        opt.step()
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp_path))
    fresh = hf_gpt2(seed=1)
    fresh_opt = _opt(fresh)
    msd, osd = get_state_dict(fresh, fresh_opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(tmp_path))
    set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for m, o in ((model, opt), (fresh, fresh_opt)):
        lm_step_grads(m, 2)
        o.step()
    for (n, p), (_, q) in zip(model.named_parameters(), fresh.named_parameters(), strict=True):
        assert torch.equal(p, q), n


def test_one_lr_scheduler_drives_both_lrs() -> None:
    """LambdaLR scales each group from its own LR; at a factor of 0 nothing moves (coupled decay
    included); then the next factor reaches both steps."""
    model = hf_gpt2()
    opt = _opt(model)
    factors = [0.0, 0.5]
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: factors[min(step, 1)])
    assert [g["lr"] for g in opt.param_groups] == [0.0, 0.0]
    lm_step_grads(model, 0)
    before = _weights(model)
    opt.step()
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    scheduler.step()
    assert [g["lr"] for g in opt.param_groups] == [0.01, 0.0025]
    assert opt.muon.param_groups[0]["lr"] == 0.01 and opt.adamw.param_groups[0]["lr"] == 0.0025
    lm_step_grads(model, 1)
    opt.step()
    assert all(not torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_add_param_group_by_kind() -> None:
    model = hf_gpt2()
    opt = _opt(model)
    extra = nn.Linear(4, 6)
    opt.add_param_group({"params": [("extra.weight", extra.weight)], "kind": "muon", "lr": 0.05})
    opt.add_param_group({"params": [("extra.bias", extra.bias)]})  # no 2-D tensor: AdamW's
    assert [g["kind"] for g in opt.param_groups] == ["muon", "adamw", "muon", "adamw"]
    assert opt.param_groups[2]["lr"] == 0.05 and opt.param_groups[3]["lr"] == 0.005
    before = extra.weight.detach().clone(), extra.bias.detach().clone()
    lm_step_grads(model, 0)
    extra(torch.ones(2, 4)).sum().backward()
    opt.step()
    assert not torch.equal(extra.weight, before[0]) and not torch.equal(extra.bias, before[1])
    assert len(opt.state_dict()["state"]) == len(list(model.parameters())) + 2
    with pytest.raises(ValueError, match="a param group without 'kind' holds 2-D tensors: say kind='muon'"):
        opt.add_param_group({"params": [("other", nn.Parameter(torch.ones(3, 3)))]})
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [("extra.bias", extra.bias)], "kind": "adamw"})


def test_add_param_group_takes_plain_tensors() -> None:
    """A group of plain tensors beside the named groups of OrScaleLM(model): named after its place
    (torch refuses a mix of named and unnamed groups), stepped, in the state dict."""
    model = hf_gpt2()
    opt = _opt(model)
    extra = nn.Linear(4, 6)
    opt.add_param_group({"params": nn.Linear(4, 6, bias=False).parameters(), "kind": "muon"})
    opt.add_param_group({"params": [extra.weight], "kind": "muon"})
    opt.add_param_group({"params": extra.bias})  # no 2-D tensor: AdamW's
    assert [g["param_names"] for g in opt.param_groups[2:]] == [["group2.param0"], ["group3.param0"], ["group4.param0"]]
    before = extra.weight.detach().clone(), extra.bias.detach().clone()
    lm_step_grads(model, 0)
    extra(torch.ones(2, 4)).sum().backward()
    opt.step()
    assert not torch.equal(extra.weight, before[0]) and not torch.equal(extra.bias, before[1])
    assert opt.state_dict()["param_groups"][3]["param_names"] == ["group3.param0"]


def test_one_cycle_lr_cycles_both_momentums() -> None:
    """torch's OneCycleLR with its default cycle_momentum=True: the Muon groups' momentum is cycled
    (as betas[0], the key it writes) and the step uses it: equal, bit for bit, to an optimizer whose
    LRs and momenta are set by hand (the Muon group's `momentum`, AdamW's `betas`) to the same values."""
    model, twin = hf_gpt2(), hf_gpt2()
    opt, ref = _opt(model), _opt(twin)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[0.02, 0.005], total_steps=4, pct_start=0.5)
    momenta = []
    for t in range(3):
        for g, h in zip(opt.param_groups, ref.param_groups, strict=True):
            h["lr"] = g["lr"]
            h["momentum" if h["kind"] == "muon" else "betas"] = g["betas"][0] if h["kind"] == "muon" else g["betas"]
        lm_step_grads(model, t)
        lm_step_grads(twin, t)
        opt.step()
        ref.step()
        momenta.append(opt.param_groups[0]["momentum"])
        sched.step()
    assert momenta[0] == 0.95 and momenta[1] < 0.9  # cycled: down towards base_momentum, then back
    for (n, p), (_, q) in zip(model.named_parameters(), twin.named_parameters(), strict=True):
        assert torch.equal(p, q), n
    opt.param_groups[0]["momentum"], opt.param_groups[0]["betas"] = 0.5, (0.6,)
    with pytest.raises(ValueError, match=r"momentum was set to 0.5 and its betas\[0\] to 0.6 since the last step"):
        opt.step()


def test_param_groups_given_by_kind_and_empty_groups() -> None:
    w, b = nn.Parameter(torch.randn(5, 3)), nn.Parameter(torch.zeros(5))
    opt = OrScaleLM([{"params": [w], "kind": "muon"}, {"params": [], "kind": "adamw"}, {"params": [b]}], lr=0.1)
    assert [(g["kind"], len(g["params"])) for g in opt.param_groups] == [("muon", 1), ("adamw", 0), ("adamw", 1)]
    before = w.detach().clone(), b.detach().clone()
    w.grad, b.grad = torch.ones_like(w), torch.ones_like(b)
    opt.step()
    assert not torch.equal(w, before[0]) and not torch.equal(b, before[1])


def test_parameters_swapped_before_the_first_step_are_followed() -> None:
    """accelerate's FSDP2 prepare(model, optimizer) swaps each group's parameters for the sharded ones
    (fsdp2_switch_optimizer_parameters: group["params"] = [...]) before any step: the optimizer then
    runs on the new parameters, as one built over them; after a step, a swap is refused in one line."""
    model, swapped, twin = hf_gpt2(), hf_gpt2(), hf_gpt2()
    opt, ref = _opt(model), _opt(twin)
    new = dict(swapped.named_parameters())
    for group in opt.param_groups:
        group["params"] = [new[n] for n in group["param_names"]]
    for t in range(2):
        for m, o in ((swapped, opt), (twin, ref)):
            lm_step_grads(m, t)
            o.step()
    for (n, p), (_, q) in zip(swapped.named_parameters(), twin.named_parameters(), strict=True):
        assert torch.equal(p, q), n
    assert len(opt.state_dict()["state"]) == len(new)
    opt.param_groups[0]["params"] = list(model.parameters())[: len(opt.param_groups[0]["params"])]
    with pytest.raises(RuntimeError, match="parameters of its groups were replaced after it stepped"):
        opt.step()


def test_compiled_step_has_no_graph_break() -> None:
    """torch.compile(fullgraph=True) of a function calling step(): torch's AdamW alone breaks the graph
    on purpose (its step wrapper); the parts' own step functions do not. (Compiled, AdamW's bias
    corrections are tensor arithmetic rather than host floats: equal up to rounding.)"""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 16))
    opt = _opt(model)
    twin = copy.deepcopy(model)
    ref = _opt(twin)
    idx = torch.arange(6)
    for m in (model, twin):
        m(idx).square().mean().backward()
    torch._dynamo.reset()
    try:
        torch.compile(lambda: opt.step(), backend="eager", fullgraph=True)()
    finally:
        torch._dynamo.reset()
    ref.step()
    for (n, p), (_, q) in zip(model.named_parameters(), twin.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=n)


@pytest.mark.slow  # inductor compiles the step's C++ (about 40 s on a cold cache, one graph)
def test_inductor_compiles_a_function_that_calls_step() -> None:
    """torch.compile with its default backend (inductor) of a function calling step(): the Muon part's
    passes are traced into the caller's graph (a custom operator that mutates a list and returns
    tensors cannot be functionalised); three steps equal the eager optimizer's, up to rounding."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 16))
    twin = copy.deepcopy(model)
    opt, ref = _opt(model, diagnostics=False), _opt(twin, diagnostics=False)
    idx = torch.arange(6)
    torch._dynamo.reset()
    try:
        step = torch.compile(lambda: opt.step())
        for _ in range(3):
            for m in (model, twin):
                m.zero_grad()
                m(idx).square().mean().backward()
            step()
            ref.step()
    finally:
        torch._dynamo.reset()
    for (n, p), (_, q) in zip(model.named_parameters(), twin.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=n)


def test_public_api_is_documented() -> None:
    """Every export of orscale is documented in its own words, and help(orscale.OrScaleLM) shows the call."""
    for name in orscale.__all__:
        obj = getattr(orscale, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
            assert doc and not doc.startswith(f"{name}("), f"orscale.{name} has no docstring of its own"
    text = pydoc.render_doc(orscale.OrScaleLM, renderer=pydoc.plaintext)
    assert "OrScaleLM(model, lr=1e-3, adamw_lr=None, weight_decay=0.1)" in text
    assert "docs/library.md" in text and "flatten_conv" in text and "muon_names" in text
