"""Parameter routing, config errors, LR schedule."""

from __future__ import annotations

import math
from dataclasses import fields, replace

import pytest
import torch
from torch import nn

from orscale import OPTIMIZER_NAMES, MuonFamily, OptimConfig, build_optimizers, lr_at, set_lr
from orscale import OptimConfigError as ConfigError
from orscale.muon_spec import MuonOptions
from orscale.registry import optimizer_spec
from orscale.routing import canonical_name

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model() -> nn.Module:
    from models.gpt import GPT
    from models.presets import get_preset

    torch.manual_seed(0)
    return GPT(get_preset("tiny", vocab_size=256, max_seq_len=32))


def _owners(optimizers) -> dict[int, list[tuple[int, int]]]:
    owners: dict[int, list[tuple[int, int]]] = {}
    for oi, opt in enumerate(optimizers):
        for gi, group in enumerate(opt.param_groups):
            for p in group["params"]:
                owners.setdefault(id(p), []).append((oi, gi))
    return owners


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_every_param_in_exactly_one_optimizer(model: nn.Module, name: str) -> None:
    opts = build_optimizers(model, OptimConfig(name=name))
    owners = _owners(opts)
    named = dict(model.named_parameters())
    assert set(owners) == {id(p) for p in named.values()}
    assert all(len(v) == 1 for v in owners.values())
    # Tied head: the embedding is also the output projection, and appears once.
    assert named["tok_emb.weight"].data_ptr() == model.tok_emb.weight.data_ptr()
    assert sum(p is model.tok_emb.weight for o in opts for g in o.param_groups for p in g["params"]) == 1
    for opt in opts:
        for group in opt.param_groups:
            assert group["lr"] == OptimConfig().lr
    if name == "adamw":
        assert len(opts) == 1 and isinstance(opts[0], torch.optim.AdamW)
        g = opts[0].param_groups[0]
        assert g["betas"] == (0.9, 0.95) and g["eps"] == 1e-8 and g["weight_decay"] == 0.1
        return
    if optimizer_spec(name).routing == "elementwise":  # one optimizer over every tensor: >= 2-D and 1-D groups
        (opt,) = opts
        assert [g["role"] for g in opt.param_groups] == ["matrices", "vectors"]
        mats, vecs = opt.param_groups
        assert all(p.ndim >= 2 for p in mats["params"]) and all(p.ndim == 1 for p in vecs["params"])
        assert mats["weight_decay"] == 0.1 and vecs["weight_decay"] == (0.1 if name == "cbp" else 0.0)
        return
    muon, adamw = opts
    assert isinstance(muon, MuonFamily) and isinstance(adamw, torch.optim.AdamW)
    L = model.cfg.n_layer
    matrix_names = set(muon.param_groups[0]["param_names"])
    assert matrix_names == {
        f"blocks.{i}.{m}.weight" for i in range(L) for m in ("attn.qkv", "attn.out", "mlp.up", "mlp.down")
    }
    rest = set(adamw.param_groups[0]["param_names"])
    assert rest == (
        {"tok_emb.weight", "final_norm.weight"}
        | {f"blocks.{i}.{n}_norm.weight" for i in range(L) for n in ("attn", "mlp")}
    )
    assert adamw.param_groups[0]["weight_decay"] == 0.1
    assert muon.param_groups[0]["weight_decay"] == 0.1


def test_exempt_norms_and_embeddings(model: nn.Module) -> None:
    for name in ("adamw", "orscale_lm"):
        opts = build_optimizers(model, OptimConfig(name=name, exempt_norms_and_embeddings=True))
        adamw = opts[-1]
        by_wd = {g["weight_decay"]: set(g["param_names"]) for g in adamw.param_groups}
        assert "tok_emb.weight" in by_wd[0.0] and "final_norm.weight" in by_wd[0.0]
        assert all(model.get_parameter(n).ndim == 1 or n == "tok_emb.weight" for n in by_wd[0.0])
        if name == "adamw":
            assert "blocks.0.attn.qkv.weight" in by_wd[0.1]
        else:
            assert set(by_wd) == {0.0}  # nothing decayed left on the AdamW side
        assert all(len(v) == 1 for v in _owners(opts).values())


def test_frozen_params_are_left_out(model: nn.Module) -> None:
    model.final_norm.weight.requires_grad_(False)
    try:
        opts = build_optimizers(model, OptimConfig(name="orscale_lm"))
        assert id(model.final_norm.weight) not in _owners(opts)
    finally:
        model.final_norm.weight.requires_grad_(True)


@pytest.mark.parametrize(
    "change, pattern",
    [
        ({"name": "sgdx"}, r"optim\.name 'sgdx'.*valid: adamw, muon, muon_moonlight"),
        ({"r_min": 2.0, "r_max": 1.0}, r"optim\.muon\.r_min \(2\.0\) must be > 0 and <= optim\.muon\.r_max"),
        ({"lr": -1e-3}, r"optim\.lr must be a finite number > 0"),
        ({"weight_decay": -0.1}, r"optim\.weight_decay must be >= 0"),
        ({"ns_dtype": "fp16"}, r"optim\.muon\.ns_dtype"),
        ({"ns_coefficients": "newton"}, r"optim\.muon\.ns_coefficients"),
    ],
)
def test_bad_config_raises_config_error(model: nn.Module, change: dict, pattern: str) -> None:
    muon = {k: change.pop(k) for k in list(change) if k in {f.name for f in fields(MuonOptions)}}
    with pytest.raises(ConfigError, match=pattern) as err:
        build_optimizers(model, replace(OptimConfig(name="orscale_lm"), **change).with_options(MuonOptions(**muon)))
    assert "\n" not in str(err.value)


def test_vector_to_matrix_optimizer_names_it() -> None:
    with pytest.raises(ValueError, match=r"'blocks\.0\.attn_norm\.weight' has shape \(8,\)"):
        MuonFamily(
            [
                ("blocks.0.attn.qkv.weight", nn.Parameter(torch.randn(24, 8))),
                ("blocks.0.attn_norm.weight", nn.Parameter(torch.ones(8))),
            ]
        )


def test_model_without_hidden_matrices() -> None:
    """An embedding and a norm only: nothing for the Muon family (the rule is not the GPT's names); a
    hidden layer before the output layer (the last nn.Linear, AdamW's)."""
    with pytest.raises(ValueError, match="found no hidden 2-D weight matrices"):
        build_optimizers(nn.Sequential(nn.Embedding(8, 4), nn.LayerNorm(4)), OptimConfig(name="muon"))
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    muon, adamw = build_optimizers(model, OptimConfig(name="muon"))
    assert muon.param_groups[0]["param_names"] == ["0.weight"]


def test_canonical_name_strips_wrappers() -> None:
    assert canonical_name("_orig_mod.blocks.0.attn.qkv.weight") == "blocks.0.attn.qkv.weight"
    assert canonical_name("module._orig_mod.tok_emb.weight") == "tok_emb.weight"
    assert canonical_name("blocks.1._checkpoint_wrapped_module.mlp.up.weight") == "blocks.1.mlp.up.weight"
    assert canonical_name("blocks.0.module_x.weight") == "blocks.0.module_x.weight"


# ----------------------------------------------------------------------------- schedule
def test_lr_schedule_known_points() -> None:
    f = lambda s: lr_at(s, peak=1.0, warmup=10, total=110, min_ratio=0.1)
    assert f(0) == pytest.approx(0.1)  # (step+1)/warmup: the first step has lr > 0
    assert f(4) == pytest.approx(0.5)
    assert f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0)  # cosine starts at the peak
    assert f(60) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway through the cosine
    assert f(35) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.25)))
    assert f(110) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)
    values = [f(s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))
    assert lr_at(0, 3e-4, 0, 100, 0.0) == pytest.approx(3e-4)  # no warmup
    assert lr_at(99, 1.0, 0, 100, 0.0) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.99)))
    with pytest.raises(ValueError):
        lr_at(-1, 1.0, 10, 100, 0.0)
    with pytest.raises(ValueError):
        lr_at(0, 1.0, 10, 100, 1.5)


def test_set_lr_reaches_every_group(model: nn.Module) -> None:
    opts = build_optimizers(model, OptimConfig(name="orscale_lm", exempt_norms_and_embeddings=True))
    set_lr(opts, 0.123)
    assert all(g["lr"] == 0.123 for o in opts for g in o.param_groups)
