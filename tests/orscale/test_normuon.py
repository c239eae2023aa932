"""NorMuon (orscale/normuon.py) against a re-implementation of the authors' update (zichongli5/NorMuon's
`normuon_update`, with the family's momentum and Moonlight's shape factor), its fp32 state, its options
through the config, and a ZeRO-2 checkpoint of 2 ranks resumed on one process. Its 2-rank runs under
FSDP2, DDP and ZeRO-1/2 against one process, and DCP's round trip of its sharded state (2 ranks -> 1),
are the Muon family's equality tests (test_sharded_optim.py, test_zero.py), which run every member of
the family the optimizer table holds."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from launch.config import to_dict
from launch.errors import ConfigError
from launch.plan import load_config
from orscale import OptimConfig, OptimConfigError, build_optimizers
from orscale.newton_schulz import newton_schulz
from orscale.normuon import SECOND_MOMENT, NorMuon, NorMuonOptions
from tests.helpers import TINY, run_many, train_losses
from tests.orscale.optim_helpers import set_grads

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPES = [(24, 8), (8, 24), (16, 16), (6, 4, 3)]  # tall, wide, square, a conv weight [out, in, k]


def named_params(dtype: torch.dtype = torch.float32) -> list[tuple[str, nn.Parameter]]:
    gen = torch.Generator().manual_seed(0)
    return [(f"m{i}", nn.Parameter((0.1 * torch.randn(s, generator=gen)).to(dtype))) for i, s in enumerate(SHAPES)]


def reference(W, M, v, G, lr, wd, mu=0.95, beta2=0.95, eps=1e-10):
    """One step of the authors' `normuon_update` per matrix (float64 after Newton–Schulz), with the
    family's momentum (M ← μM + G, M̂ = μM + G) and update ((1 − ηλ)W − η·0.2·√max(m, n)·update)."""
    M = mu * M + G
    Q = newton_schulz((mu * M + G).flatten(1), 5, "polar_express", "fp32").double()
    v = v.double().lerp(Q.square().mean(dim=-1, keepdim=True), 1 - beta2)
    update = Q / (v.sqrt() + eps)
    update = update * (Q.norm() / (update.norm() + eps))
    m, n = Q.shape
    W = (1 - lr * wd) * W.double() - lr * 0.2 * math.sqrt(max(m, n)) * update.view(W.shape)
    return W.float(), M, v.float()


def test_the_step_is_the_authors_update_with_the_familys_momentum() -> None:
    named = named_params()
    ref = {n: (p.detach().clone(), torch.zeros_like(p), torch.zeros(p.shape[0], 1)) for n, p in named}
    opt = NorMuon(named, lr=0.02, weight_decay=0.1, ns_dtype="fp32")
    for t in range(4):
        set_grads(named, 1.0, seed=t)
        for n, p in named:
            ref[n] = reference(*ref[n][:3], p.grad.clone(), lr=0.02, wd=0.1)
        opt.step()
        for n, p in named:
            W, _, v = ref[n]
            torch.testing.assert_close(p.detach(), W, rtol=2e-5, atol=1e-7, msg=f"{n} t={t}")
            state = opt.state[p][SECOND_MOMENT]
            assert state.dtype == torch.float32 and state.shape == (p.shape[0], 1)
            torch.testing.assert_close(state, v, rtol=1e-5, atol=0, msg=f"{n} t={t}")
    # the diagnostics read the direction the step took: ‖a·Q'‖ = ‖Q‖ (about √min(m, n))
    q_norms = {n: row["q_norm"] for n, row in opt.matrix_diagnostics().items()}
    assert q_norms == pytest.approx(
        {f"m{i}": math.sqrt(min(s[0], math.prod(s[1:]))) for i, s in enumerate(SHAPES)}, rel=0.1
    )


def test_bf16_weights_keep_the_second_moment_fp32_through_a_checkpoint() -> None:
    named = named_params(torch.bfloat16)
    opt = NorMuon(named, lr=0.02)
    set_grads(named, 1.0, seed=0)
    opt.step()
    twin = named_params(torch.bfloat16)
    again = NorMuon(twin, lr=0.02)
    again.load_state_dict(opt.state_dict())  # torch's own load would cast it to the weights' bf16
    for (_, p), (_, q) in zip(named, twin, strict=True):
        assert again.state[q][SECOND_MOMENT].dtype == torch.float32
        assert torch.equal(again.state[q][SECOND_MOMENT], opt.state[p][SECOND_MOMENT])


@pytest.mark.parametrize(
    ("kw", "said"),
    [
        (dict(beta2=1.0), r"optim\.normuon\.beta2 must be in \[0, 1\), got 1\.0"),
        (dict(beta2=float("nan")), r"optim\.normuon\.beta2 must be in \[0, 1\), got nan"),
        (dict(eps=0.0), r"optim\.normuon\.eps must be > 0, got 0\.0"),
        (dict(eps=math.inf), r"optim\.normuon\.eps must be > 0, got inf"),
    ],
)
def test_options_out_of_range_are_one_line(kw, said) -> None:
    with pytest.raises(OptimConfigError, match=f"^{said}$"):
        NorMuonOptions(**kw)
    with pytest.raises(ValueError, match=r"^(beta2|second_moment_eps) must be a finite number"):
        NorMuon(named_params(), **{"beta2" if "beta2" in kw else "second_moment_eps": next(iter(kw.values()))})


def test_the_config_reads_checks_and_records_optim_normuon() -> None:
    cfg = load_config(TINY, ["optim.name=normuon", "optim.normuon.beta2=0.9"])
    assert cfg.optim.own(NorMuonOptions) == NorMuonOptions(beta2=0.9)
    assert to_dict(cfg)["optim"]["normuon"] == {"beta2": 0.9, "eps": 1e-10}  # config.yaml's record
    assert "normuon" not in to_dict(load_config(TINY, []))["optim"]  # only a run that reads it
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 2))
    opt = build_optimizers(model, cfg.optim)[0]
    assert type(opt) is NorMuon and opt.beta2 == 0.9 and opt.param_groups[0]["shape"] == "moonlight"
    for override in ("optim.normuon.beta2=1.5", "optim.normuon.gamma=1"):
        with pytest.raises(ConfigError) as err:
            load_config(TINY, ["optim.name=normuon", override])
        assert "optim.normuon." in str(err.value) and "\n" not in str(err.value)
    assert OptimConfig(name="normuon").own(NorMuonOptions) == NorMuonOptions()  # a section left out: defaults


@pytest.mark.slow
@pytest.mark.distributed
def test_a_zero2_checkpoint_of_two_ranks_resumes_on_one_process(tmp_path) -> None:
    """Steps 1-2 under ZeRO-2 on 2 ranks (v at each matrix's owner, saved by name), steps 3-4 on one
    process from that checkpoint: the same losses as 4 steps on one process."""
    common = ["optim.name=normuon", "train.eval_every=0", "train.ckpt_every=2", "optim.warmup_steps=1"]
    run_many([[*common, f"run.dir={tmp_path / 'moved'}", "parallel.backend=zero2", "train.max_steps=2"]], 2)
    run_many([[*common, f"run.dir={tmp_path / d}", "train.max_steps=4"] for d in ("moved", "straight")])
    got, want = train_losses(tmp_path / "moved"), train_losses(tmp_path / "straight")
    for step in (3, 4):  # 3: the weights came through; 4: the optimizer state (momentum and v) too
        assert got[step] == pytest.approx(want[step], rel=1e-5), (step, got, want)
