"""2 ranks (gloo, CPU) under torchrun give the same numbers as one process; launch errors are clean."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from launch.checkpoint import latest_checkpoint, load_model_weights
from models import GPT, get_preset
from tests.helpers import ROOT, TINY, SMALL, env, free_port, run_train, train_cmd, train_losses

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

# Accumulation on: 8 sequences per step in micro-batches of 2 -> 4 micro-batches on 1 rank, 2 on 2.
# vocab 50257 (odd): the embedding's shards are uneven on 2 ranks.
EQUAL = ["train.micro_batch_size=2", "train.max_steps=5", "train.eval_every=5", "model.vocab_size=50257",
         "parallel.meta_init=false", "optim.warmup_steps=2"]


def final_weights(run_dir) -> dict[str, torch.Tensor]:
    model = GPT(get_preset("tiny", n_layer=2, d_model=64, max_seq_len=64, vocab_size=50257))
    load_model_weights(latest_checkpoint(run_dir / "checkpoints"), model)
    return model.state_dict()


def assert_close_runs(a, b, rtol=1e-5) -> None:
    la, lb = train_losses(a), train_losses(b)
    assert la.keys() == lb.keys()
    for step in la:
        assert abs(la[step] - lb[step]) <= rtol * abs(la[step]), (step, la[step], lb[step])
    wa, wb = final_weights(a), final_weights(b)
    for name in wa:
        rel = (wa[name] - wb[name]).norm() / wa[name].norm()
        assert rel <= rtol, (name, rel.item())


@pytest.fixture(scope="module")
def single_runs(tmp_path_factory):
    return {}


CASES = [(b, o) for b in ("ddp", "fsdp") for o in ("adamw", "muon_moonlight", "orscale_lm")]
CASES += [("zero1", "orscale_lm"), ("zero2", "orscale_lm"), ("zero2", "adamw")]


@pytest.mark.parametrize("backend, optim", CASES)
def test_two_ranks_match_one_process(tmp_path_factory, single_runs, optim, backend):
    if optim not in single_runs:
        single = tmp_path_factory.mktemp(f"single-{optim}")
        run_train([f"run.dir={single}", f"optim.name={optim}", *EQUAL])
        single_runs[optim] = single
    two = tmp_path_factory.mktemp(f"{backend}-{optim}")
    run_train([f"run.dir={two}", f"optim.name={optim}", f"parallel.backend={backend}", *EQUAL], nproc=2)
    assert_close_runs(single_runs[optim], two)


def test_accelerate_launch_runs_fsdp_on_two_cpu_processes(tmp_path):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "launch/configs/accelerate_fsdp.yaml"), "--num_processes", "2", "--mixed_precision", "no",
           "--main_process_port", str(free_port()), str(ROOT / "train.py"), "--config", TINY, *SMALL,
           f"run.dir={tmp_path}", "optim.name=adamw", "parallel.backend=fsdp", "train.max_steps=2"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\"world_size\": 2" in (tmp_path / "run.log").read_text()
    assert sorted(train_losses(tmp_path)) == [1, 2]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["parallel.backend=ddp", "train.micro_batch_size=3"], "not a multiple"),
        (["parallel.backend=none"], "parallel.backend=none"),
        (["parallel.backend=fsdp", "data.logical_shards=1"], "multiple of the world size"),
        (["parallel.backend=ddp", "train.device=cuda"], "no CUDA device"),
    ],
)
def test_launch_errors_are_one_line_from_rank_zero_and_no_rank_hangs(tmp_path, overrides, message):
    start = time.time()
    proc = subprocess.run(train_cmd([f"run.dir={tmp_path / 'run'}", *overrides], nproc=2), cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-2000:]
    assert time.time() - start < 120
    assert not (tmp_path / "run").exists()
