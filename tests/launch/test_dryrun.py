"""The dry run (`python -m launch.dryrun`, docs/scaling.md "The dry run"): one rank of a world of
any size set up and stepped in this process on a fake process group and fake tensors. Fast: it
runs at small worlds under each layout and its per-rank accounts add up; the command line's
refusals. Slow (pool of ranks): its figures equal those of the same measurement on real gloo
ranks with real tensors: parameter, gradient and optimizer-state bytes, collective bytes, the
optimizer's counters, activations and peak."""

from __future__ import annotations

import dataclasses

import pytest

from launch.dryrun.__main__ import main
from launch.dryrun.measure import dry_run
from launch.dryrun.report import batch_for
from tests.launch.dryrun_worker import real_step

CONFIG = "configs/tiny.yaml"
# Small and exact: fp32 everywhere (a CPU run's `auto`), so real and fake runs take the same path.
SMALL = [
    "model.n_layer=2",
    "model.d_model=64",
    "model.n_head=4",
    "model.vocab_size=512",
    "train.micro_batch_size=4",
    "train.tokens_per_step=1024",
    "data.logical_shards=8",
    "train.dtype=fp32",
    "optim.ns_dtype=fp32",
]


@pytest.mark.parametrize("backend, world, replicate", [("fsdp", 4, 1), ("fsdp", 4, 2), ("ddp", 4, 1), ("fsdp", 1, 1)])
def test_dry_run_accounts_add_up(backend: str, world: int, replicate: int) -> None:
    run = dry_run(CONFIG, world, replicate=replicate, backend=backend, rank=world - 1, overrides=SMALL)
    assert run.exchange_measured == run.exchange[run.rank]  # the real step's counter = the plan
    assert run.opt_state_measured == run.opt_state[run.rank]
    groups = replicate if backend == "fsdp" else 1  # HSDP: each replica group runs every NS once
    matrices = 2 * 4  # qkv, out, up, down per block
    assert len(run.ns_flops) == world and sum(run.ns_flops) > 0
    if world > 1:
        assert run.ns_calls < matrices and run.gather + run.reduce > 0
        one = dry_run(CONFIG, 1, backend=backend, overrides=SMALL)  # every NS on the one rank
        assert sum(run.ns_flops) == pytest.approx(groups * one.ns_flops[0])
        if backend == "fsdp":  # each replica group's shards of every state tensor add up to the whole
            assert sum(run.opt_state) == pytest.approx(replicate * one.opt_state[0], rel=1e-3)
    else:
        assert run.ns_calls == matrices and run.exchange == [0] and run.gather == run.reduce == 0
    assert 0 < run.activations < run.peak


def test_batch_for_fits_the_step_to_the_world() -> None:
    assert batch_for("configs/1.1b.yaml", 8) == ["train.micro_batch_size=4"]  # 48 sequences a rank
    assert batch_for("configs/1.1b.yaml", 64) == ["train.micro_batch_size=3"]  # 6 a rank
    assert batch_for("configs/1.1b.yaml", 256) == [  # 384 sequences: 2 a rank, 512 in all
        "train.micro_batch_size=2",
        "train.tokens_per_step=2097152",
        "data.logical_shards=256",
    ]
    assert batch_for("configs/1.1b.yaml", 512) == [
        "train.micro_batch_size=1",
        "train.tokens_per_step=2097152",
        "data.logical_shards=512",
    ]
    assert batch_for("configs/125m.yaml", 64) == ["train.micro_batch_size=4"]  # 16 in the config


def test_command_line_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", CONFIG, "--world", "2", "--backend", "zero2"]) == 2
    assert "cannot run parallel.backend=zero2" in capsys.readouterr().err
    assert main(["--config", "configs/1.1b.yaml", "--world", "64"]) == 2  # 384 sequences, 4 x 64 per micro-batch
    assert "not a multiple of train.micro_batch_size x world size" in capsys.readouterr().err
    assert main(["--config", CONFIG, "--world", "4", "--replicate", "3"]) == 2
    assert main(["--world", "4"]) == 2
    assert main(["--config", CONFIG, "--world", "4", "--replicate", "2", "--rank", "1", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "rank 1 set up and stepped" in out and "(equal)" in out
    # What was run: the layout's factors, the accumulation, the step's tokens; what memory leaves out.
    # tiny's sequences are 128 tokens (configs/tiny.yaml): 1024 tokens a step are 2 sequences a rank.
    assert "HSDP 2 × 2 ranks (2 replica groups × 2 ranks each parameter is sharded over)" in out
    assert "micro-batch 2 × 128 tokens, 1 micro-batch per step on each rank (gradient accumulation)" in out
    assert "1,024 tokens per step over all 4 ranks" in out
    assert "not counted: the CUDA context, NCCL's buffers" in out


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--world", "0"], "--world must be >= 1"),
        (["--world", "-1", "--rank", "0"], "--world must be >= 1"),
        (["--world", "4", "--replicate", "0"], "--replicate must be >= 1"),
        (["--world", "4", "--replicate", "-2"], "--replicate must be >= 1"),
        (["--world", "4", "--gpus-per-node", "0"], "--gpus-per-node must be >= 1"),
        (["--world", "4", "--rank", "4"], "--rank must be in 0..3"),
        (["--table", "--sizes", "tiny", "--worlds", "2", "0", "--rank", "0"], "--worlds must be >= 1"),
        (["--table", "--sizes", "tiny", "--worlds", "2", "--gpus-per-node", "0"], "--gpus-per-node must be >= 1"),
    ],
)
def test_a_world_that_cannot_be_is_refused_in_one_line_naming_its_flag(argv, flag, capsys) -> None:
    assert main(["--config", CONFIG, *argv, *SMALL]) == 2
    cap = capsys.readouterr()
    assert cap.err.startswith(f"error: {flag}") and cap.err.count("\n") == 1, cap.err
    assert "got" in cap.err and cap.out == ""  # what was given; nothing run, no table started


def test_the_ranks_per_node_decide_fsdp2s_resharding_as_on_the_cluster() -> None:
    """`reshard_after_forward=auto`: a shard group within one node keeps the gathered parameters; one
    spanning nodes reshards them (--gpus-per-node, as torchrun's LOCAL_WORLD_SIZE tells the run)."""
    one_node = dry_run(CONFIG, 2, backend="fsdp", overrides=SMALL, gpus_per_node=2, memory=False)
    two_nodes = dry_run(CONFIG, 2, backend="fsdp", overrides=SMALL, gpus_per_node=1, memory=False)
    assert not one_node.reshard and two_nodes.reshard


FIELDS = ("params", "grads", "opt_state", "exchange", "gather", "reduce", "step_other", "ns_calls")
MEASURED = ("exchange_measured", "opt_state_measured", "activations", "peak")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("backend, world, replicate", [("fsdp", 2, 1), ("ddp", 2, 1), ("fsdp", 4, 2)])
def test_dry_run_equals_real_ranks(backend: str, world: int, replicate: int) -> None:
    from tests.pool import rank_pool

    real = rank_pool(world).run(real_step, CONFIG, SMALL, backend, replicate)
    for rank, mine in enumerate(real):
        fake = dataclasses.asdict(
            dry_run(CONFIG, world, replicate=replicate, backend=backend, rank=rank, overrides=SMALL)
        )
        assert {k: fake[k] for k in FIELDS + MEASURED} == {k: mine[k] for k in FIELDS + MEASURED}, rank
