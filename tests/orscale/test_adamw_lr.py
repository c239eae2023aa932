"""optim.adamw_lr / optim.adamw_weight_decay: the AdamW group (token embedding = tied
head, norm gains) at a peak LR and decay of its own, in every optimizer family; unset, today's tied
protocol bit for bit."""

from __future__ import annotations

import pytest
import torch

from launch.errors import ConfigError
from launch.plan import load_config
from models import GPT, get_preset
from orscale import OPTIMIZER_NAMES, OptimConfig, build_optimizers, set_lr
from orscale.muon_spec import MuonOptions
from orscale.routing import route_parameters
from orscale.schedule import lr_at, lr_scales
from tests.orscale import group_lr_worker as worker
from tests.orscale.optim_helpers import gpt_hidden

CFG = get_preset("tiny", n_layer=2, d_model=32, n_head=2, max_seq_len=16, vocab_size=128)
FAMILIES = ("adamw", "muon_moonlight", "orscale_lm", "cbp", "lamb", "lars")


def _train(name: str, steps: int = 3, **optim) -> tuple[dict[str, torch.Tensor], list[list[torch.optim.Optimizer]]]:
    model = GPT(CFG, seed=4)
    cfg = OptimConfig(name=name, lr=0.01, warmup_steps=2, **optim).with_options(MuonOptions(ns_dtype="fp32"))
    optimizers = build_optimizers(model, cfg)
    batch = torch.randint(0, CFG.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    for step in range(steps):
        set_lr(optimizers, lr_at(step, cfg.lr, cfg.warmup_steps, steps, 0.0))
        model(batch[:, :-1], batch[:, 1:]).backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return {n: p.detach().clone() for n, p in model.named_parameters()}, optimizers


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_adamw_lr_unset_and_equal_to_lr_give_bit_identical_runs(name):
    unset, _ = _train(name)
    equal, _ = _train(name, adamw_lr=0.01, adamw_weight_decay=0.1)
    for key, value in unset.items():
        assert torch.equal(equal[key], value), f"{name}: {key}"


@pytest.mark.parametrize("name", FAMILIES)
def test_adamw_lr_changes_only_the_adamw_groups_lr(name):
    """4 x the LR on the embedding and norm gains, optim.lr on the hidden matrices, at every step of
    the schedule; the first step of the hidden matrices is unchanged (same gradients), the rest of the
    model's is not."""
    model = GPT(CFG, seed=4)
    cfg = OptimConfig(name=name, lr=0.01, adamw_lr=0.04, warmup_steps=2)
    optimizers = build_optimizers(model, cfg)
    for step in range(5):
        lr = lr_at(step, cfg.lr, cfg.warmup_steps, 5, 0.0)
        set_lr(optimizers, lr)
        for opt in optimizers:
            for group in opt.param_groups:
                hidden = all(gpt_hidden(n, p) for n, p in zip(group["param_names"], group["params"], strict=True))
                assert group["lr"] == pytest.approx(lr if hidden else 4 * lr, rel=1e-12), (name, step)
    one, _ = _train(name, steps=1)
    scaled, _ = _train(name, steps=1, adamw_lr=0.04)
    moved = {n for n in one if not torch.equal(one[n], scaled[n])}
    matrices = {n for n in one if n.startswith("blocks.") and one[n].ndim == 2}
    assert moved == set(one) - matrices, name  # the first step of every family is per tensor


def test_adamw_weight_decay_is_the_adamw_groups_decay_only():
    cfg = OptimConfig(name="orscale_lm", weight_decay=0.1, adamw_weight_decay=0.0)
    routing = route_parameters(GPT(CFG, seed=0), cfg)
    assert [g["weight_decay"] for g in routing.adamw_groups] == [0.0]
    adamw = route_parameters(GPT(CFG, seed=0), OptimConfig(name="adamw", adamw_weight_decay=0.0))
    decays = {all(gpt_hidden(n, p) for n, p in g["params"]): g["weight_decay"] for g in adamw.adamw_groups}
    assert decays == {True: 0.1, False: 0.0}


def test_cbp_still_equalises_the_split_embedding_with_the_matrices():
    """CBP's M1 target is the mean energy over the matrices' role: splitting the embedding into a
    group of its own (for its LR) keeps it in that mean. Checked against the tied run above at
    adamw_lr = lr (bit-identical); here the split groups share one role."""
    routing = route_parameters(GPT(CFG, seed=0), OptimConfig(name="cbp", adamw_lr=0.02))
    roles = [(g["role"], [n for n, _ in g["params"]][:1]) for g in routing.elementwise]
    assert roles[0] == ("matrices", ["tok_emb.weight"]) and roles[1][0] == "matrices"


def test_the_scale_survives_a_state_dict_load_from_a_run_without_it():
    """An older checkpoint's param groups have no scale (and a resumed run may change adamw_lr):
    set_lr reads this run's scales, not the loaded groups' keys."""
    _, (old,) = _train("adamw", steps=1)
    _, (new,) = _train("adamw", steps=1, adamw_lr=0.04)
    assert lr_scales(old) == [1.0] and lr_scales(new) == [1.0, 4.0]
    new_groups = [len(g["params"]) for g in new.param_groups]
    assert sum(new_groups) == len(old.param_groups[0]["params"])
    saved = new.state_dict()
    new.load_state_dict(saved)
    set_lr([new], 0.5)
    assert [g["lr"] for g in new.param_groups] == [0.5, 2.0]
    assert all("lr_scale" not in g for g in saved["param_groups"])  # never in a checkpoint


@pytest.mark.parametrize("value", ["0", "-1e-3", "inf", "abc"])
def test_bad_adamw_lr_is_one_line(value):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"optim.adamw_lr={value}"])
    assert "optim.adamw_lr" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="optim.adamw_weight_decay"):
        load_config(None, ["optim.adamw_weight_decay=-0.1"])


# ------------------------------------------------------------------ every engine (pool of ranks, slow)
def _worker(backend: str, optims: list[str], nproc: int) -> dict:
    """group_lr_worker.run_all on `nproc` ranks of the pool (one process: no group, as train.py)."""
    from tests.pool import rank_pool

    return rank_pool(nproc).run(worker.run_all, backend, optims, group=nproc > 1)[0]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("backend, nproc", [("none", 1), ("fsdp", 2), ("zero2", 2)])
def test_every_engine_applies_the_adamw_groups_lr_at_every_step(backend, nproc):
    got = _worker(backend, ["orscale_lm", "adamw", "cbp"], nproc)
    scale = 0.04 / 0.01
    for optim, result in got.items():
        kinds = set()
        for step in result["steps"]:
            lr = step["lr"]
            for kind, group_lr in step["groups"]:
                kinds.add(kind)
                want = scale * lr if kind == "adamw" else lr
                assert group_lr == pytest.approx(want, rel=1e-12), (backend, optim, kind)
        assert "adamw" in kinds and kinds & {"hidden", "zero-matrix"}, (backend, optim, kinds)
    assert worker.STEPS == len(got["orscale_lm"]["steps"])
