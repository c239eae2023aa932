"""Lion (orscale/lion.py) against a reference written from its paper's Algorithm 2 (float64), its
first step by hand, low-precision weights, checkpoints, and `optim.name=lion` in the trainer: it
trains and resumes bit-exactly on the tiny config, and 2 FSDP2 ranks equal one process."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from launch.loop import main as train_main
from orscale import OptimConfig, build_optimizers, set_lr
from orscale.lion import Lion
from tests.helpers import SMALL, TINY, train_losses
from tests.orscale.optim_helpers import assert_close_lists, grad_seq, make_params, run

pytestmark = pytest.mark.usefixtures("one_thread")


def ref_lion(theta, grads, lr, wd, betas=(0.9, 0.99)):
    """Chen et al. 2023, Algorithm 2, per tensor, in float64: wd[i] is tensor i's decay."""
    b1, b2 = betas
    th = [t.double().clone() for t in theta]
    m = [torch.zeros_like(t) for t in th]
    for gs in grads:
        for i, g in enumerate(gs):
            g = g.double()
            u = torch.sign(b1 * m[i] + (1 - b1) * g)
            th[i] = th[i] - lr * (u + wd[i] * th[i])
            m[i] = b2 * m[i] + (1 - b2) * g
    return th


def _groups(params, wd=0.1):
    """Decay on the tensors of 2 or more dims, none on 1-D ones (the trainer's routing)."""
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": wd},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


def test_lion_matches_its_reference_step_by_step() -> None:
    params = make_params()
    theta0 = [p.detach().clone() for p in params]
    grads = grad_seq(8)
    run(Lion(_groups(params), lr=0.01), params, grads)
    ref = ref_lion(theta0, grads, lr=0.01, wd=[0.1 if p.ndim >= 2 else 0.0 for p in params])
    assert_close_lists([p.detach() for p in params], ref, rtol=1e-5, atol=1e-6)
    moved = [(p.detach() - t0).abs().max().item() for p, t0 in zip(params, theta0, strict=True)]
    assert min(moved) >= 0.01 - 1e-6  # every tensor moved by at least one step of ±lr


def test_first_step_by_hand_is_the_sign_of_the_gradient() -> None:
    p = nn.Parameter(torch.tensor([[1.0, -2.0], [0.5, 3.0]]))
    p.grad = torch.tensor([[0.3, -1e-4], [0.0, 5.0]])
    opt = Lion([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.5)
    opt.step()
    # m = 0: u = sign(0.1·g); p ← p·(1 − 0.1·0.5) − 0.1·u (sign(0) = 0)
    want = torch.tensor([[1.0 * 0.95 - 0.1, -2.0 * 0.95 + 0.1], [0.5 * 0.95, 3.0 * 0.95 - 0.1]])
    torch.testing.assert_close(p.detach(), want, rtol=0, atol=1e-7)
    torch.testing.assert_close(opt.state[p]["exp_avg"], 0.01 * p.grad, rtol=1e-6, atol=0)


def test_low_precision_weights_keep_fp32_momentum_and_round_once() -> None:
    gen = torch.Generator().manual_seed(3)
    low = nn.Parameter(torch.randn(6, 4, generator=gen).to(torch.bfloat16))
    wide = nn.Parameter(low.detach().float())
    opts = [Lion([q], lr=0.01, weight_decay=0.1) for q in (low, wide)]
    for _ in range(3):
        g = torch.randn(6, 4, generator=gen).to(torch.bfloat16)
        low.grad, wide.grad = g, g.float()
        for opt in opts:
            opt.step()
        assert opts[0].state[low]["exp_avg"].dtype == torch.float32
        torch.testing.assert_close(opts[0].state[low]["exp_avg"], opts[1].state[wide]["exp_avg"], rtol=0, atol=0)
    # the same fp32 step rounded once per step: within bf16's rounding of the fp32 run
    torch.testing.assert_close(low.detach().float(), wide.detach(), rtol=2e-2, atol=1e-2)


def test_an_lr_zero_group_is_skipped_and_a_checkpoint_continues_bit_exactly() -> None:
    params = make_params()
    frozen = params[1].detach().clone()
    groups = [{"params": [params[0], params[2]]}, {"params": [params[1]], "lr": 0.0}]
    opt = Lion(groups, lr=0.01, weight_decay=0.1)
    grads = grad_seq(6, shapes=[tuple(p.shape) for p in params])
    ps = [params[0], params[1], params[2]]
    run(opt, ps, [[g[0], g[1], g[2]] for g in grads[:3]])
    assert torch.equal(params[1], frozen) and torch.count_nonzero(opt.state[params[1]]["exp_avg"]) == 0
    twin = [nn.Parameter(p.detach().clone()) for p in ps]
    again = Lion([{"params": [twin[0], twin[2]]}, {"params": [twin[1]], "lr": 0.0}], lr=0.01, weight_decay=0.1)
    again.load_state_dict(copy.deepcopy(opt.state_dict()))
    rest = [[g[0], g[1], g[2]] for g in grads[3:]]
    assert all(torch.equal(a, b) for a, b in zip(run(opt, ps, rest)[-1], run(again, twin, rest)[-1], strict=True))


def test_optim_name_lion_routes_every_parameter_to_one_lion() -> None:
    from models import GPT, get_preset

    model = GPT(get_preset("tiny", n_layer=2, d_model=32, n_head=2, max_seq_len=16, vocab_size=128), seed=0)
    (opt,) = build_optimizers(model, OptimConfig(name="lion", betas=[0.9, 0.99], weight_decay=0.2))
    assert isinstance(opt, Lion) and [g["role"] for g in opt.param_groups] == ["matrices", "vectors"]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.2, 0.0]
    assert opt.param_groups[0]["betas"] == (0.9, 0.99)
    named = {n for g in opt.param_groups for n in g["param_names"]}
    assert named == {n for n, _ in model.named_parameters()}


def test_trains_and_resumes_bit_exactly_under_optim_name_lion(tmp_path) -> None:
    base = ["--config", TINY, *SMALL, "train.eval_every=0", "optim.warmup_steps=2", "optim.name=lion"]
    base += ["optim.lr=0.0005", "optim.betas=[0.9,0.99]"]
    assert train_main([*base, f"run.dir={tmp_path / 'straight'}", "train.max_steps=6"]) == 0
    assert train_main([*base, f"run.dir={tmp_path / 'resumed'}", "train.max_steps=3"]) == 0
    assert train_main([*base, f"run.dir={tmp_path / 'resumed'}", "train.max_steps=6"]) == 0
    straight = train_losses(tmp_path / "straight")
    assert train_losses(tmp_path / "resumed") == straight
    assert straight[6] < straight[1]


# ---------------------------------------------------------------- FSDP2: 2 ranks of the pool
def fsdp_job() -> float:
    """Lion on the toy model (a 1-row matrix: rank 1's shard is empty) sharded by FSDP2 over this
    rank of 2, against the single-process run: the worst relative error of any weight at any step."""
    from tests.orscale.sharded_worker import LRS, _NoHostSync, full, make_model, rel, set_grads, shard
    from tests.orscale.sharded_worker import synthetic_grads as grads_at

    torch.set_num_threads(1)
    cfg = OptimConfig(name="lion", lr=0.01, weight_decay=0.1)
    ref = make_model("toy")
    model = shard(make_model("toy"), "fsdp")
    pairs = [(build_optimizers(ref, cfg), ref), (build_optimizers(model, cfg, "fsdp"), model)]
    assert type(pairs[1][0][0]).__name__ == "ShardedLion"
    worst = 0.0
    for t, lr in enumerate(LRS):
        for opts, m in pairs:
            set_grads(m, grads_at(m, "toy", t))
            set_lr(opts, lr)
            with _NoHostSync():
                opts[0].step()
        for a, b in zip(model.parameters(), ref.parameters(), strict=True):
            worst = max(worst, rel(full(a), b.detach()))
    return worst


@pytest.mark.slow
@pytest.mark.distributed
def test_two_fsdp2_ranks_equal_one_process() -> None:
    from tests.pool import rank_pool

    assert max(rank_pool(2).run(fsdp_job)) <= 1e-6


@pytest.mark.slow
@pytest.mark.distributed
def test_ddp_and_zero2_on_two_ranks_follow_one_process(tmp_path) -> None:
    """The same registration on DDP (the plain class, averaged gradients) and on ZeRO-2's owner
    ranks (whole tensors): the losses of one process. Lion's sign turns the ~1e-7 summation-order
    noise of a 2-rank reduction into a full ±lr step on the rare element whose c is that near 0, so
    the losses agree to 1e-4, not bit for bit."""
    from tests.helpers import run_many

    common = ["optim.name=lion", "optim.lr=0.0005", "train.micro_batch_size=2", "train.max_steps=4"]
    common += ["train.eval_every=0", "optim.warmup_steps=2"]
    run_many([[f"run.dir={tmp_path / 'one'}", *common]])
    two = {backend: tmp_path / backend for backend in ("ddp", "zero2")}
    run_many([[f"run.dir={d}", *common, f"parallel.backend={b}"] for b, d in two.items()], 2)
    want = train_losses(tmp_path / "one")
    for backend, run_dir in two.items():
        got = train_losses(run_dir)
        assert got.keys() == want.keys() == {1, 2, 3, 4}, backend
        for step, loss in want.items():
            assert abs(got[step] - loss) <= 1e-4 * loss, (backend, step, got[step], loss)
