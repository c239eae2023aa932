"""Checkpoints move between backends: a checkpoint saved under any of none / DDP / FSDP2 / ZeRO-2 (on
1 or 2 ranks) and HSDP (4 ranks as 2 x 2) resumes under every other; the steps after the resume equal
an uninterrupted run and OrScale-LM's calibration constants come through bit-equal (issue 25's
portability matrix, HSDP from issue 30), as do the clip counters."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from launch.checkpoint.portable import calibration_constants, read_optimizer_state
from models import GPT, get_preset
from orscale.diagnostics import CLIP_COUNTS
from tests.helpers import backend_args, run_many, train_losses

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

RANKS = {"none": 1, "ddp": 2, "fsdp": 2, "zero2": 2, "hsdp": 4}  # hsdp: 2 replica groups x 2 shards
COMMON = ["optim.name=orscale_lm", "train.eval_every=0", "train.ckpt_every=2"]
PAIRS = [(src, dst) for src in RANKS for dst in RANKS if src != dst]


def _shapes() -> dict[str, torch.Size]:
    with torch.device("meta"):
        model = GPT(get_preset("tiny", n_layer=2, d_model=64, max_seq_len=64, vocab_size=4096))
    return {n: p.shape for n, p in model.named_parameters()}


def _clip_counts(run_dir: Path, shapes: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """Each matrix's clip counters in the run's step-4 checkpoint."""
    state = read_optimizer_state(run_dir / "checkpoints/step_00000004", shapes)
    return {name: st[CLIP_COUNTS] for name, st in state.items() if CLIP_COUNTS in st}


def _args(backend: str, run_dir, steps: int) -> list[str]:
    return [*COMMON, f"train.max_steps={steps}", f"run.dir={run_dir}", *backend_args(backend)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each backend's run saved at step 2, and one uninterrupted 4-step run (one process); one
    launch per world size."""
    root = tmp_path_factory.mktemp("portable")
    for nproc in sorted(set(RANKS.values())):
        runs = [_args(b, root / f"from_{b}", 2) for b, n in RANKS.items() if n == nproc]
        run_many(runs + ([_args("none", root / "straight", 4)] if nproc == 1 else []), nproc)
    return root


@pytest.fixture(scope="module")
def resumed(saved, tmp_path_factory):
    """dst -> {src: a copy of src's run resumed under dst to step 4}, each dst's resumes in one launch."""
    out: dict[str, dict[str, Path]] = {}

    def get(src: str, dst: str) -> Path:
        if dst not in out:
            root = tmp_path_factory.mktemp(f"to_{dst}")
            out[dst] = {s: root / f"from_{s}" for s in RANKS if s != dst}
            for s, run_dir in out[dst].items():
                shutil.copytree(saved / f"from_{s}", run_dir)
            run_many([_args(dst, run_dir, 4) for run_dir in out[dst].values()], RANKS[dst])
        return out[dst][src]

    return get


@pytest.mark.parametrize("src, dst", PAIRS, ids=[f"{s}-to-{d}" for s, d in PAIRS])
def test_a_checkpoint_resumes_under_every_other_backend(saved, resumed, src, dst):
    run_dir = resumed(src, dst)
    got, want = train_losses(run_dir), train_losses(saved / "straight")
    for step in (3, 4):  # 3: the weights and data position came through; 4: the optimizer state too
        assert got[step] == pytest.approx(want[step], rel=1e-5), (step, got, want)
    shapes = _shapes()
    before = calibration_constants(saved / f"from_{src}" / "checkpoints/step_00000002", shapes)
    after = calibration_constants(run_dir / "checkpoints/step_00000004", shapes)
    assert before and set(before) == set(after)
    assert all(torch.equal(before[k], after[k]) for k in before), "calibration constants changed"
    # the clip counters (steps, at r_min, at r_max per matrix) continue: those of the uninterrupted run
    want_counts, got_counts = _clip_counts(saved / "straight", shapes), _clip_counts(run_dir, shapes)
    assert want_counts and set(got_counts) == set(want_counts)
    assert all(torch.equal(got_counts[k], want_counts[k]) for k in want_counts), "clip counters restarted"
