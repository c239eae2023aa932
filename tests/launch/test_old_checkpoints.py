"""Checkpoints written by the code before `launch/` was split into rooms resume bit-exactly after it.

The old trainer is taken from git history (the last commit before the move), run for two steps in a
directory of its own, and its checkpoint is resumed by today's trainer; the continuation must equal
an uninterrupted run of today's trainer, loss for loss and weight for weight. The old tree runs with
today's `models/` (the pure model, no checkpoint code): the loss was re-implemented after the move
(chunked, never materialising the logits), which moves step 1's loss by one float32 ulp, and what is
under test here is the checkpoint written by the old `launch/`, not the model's arithmetic.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

from launch.checkpoint import load_model_weights
from models import GPT, get_preset
from tests.helpers import ROOT, SMALL, env, train_in_pool, train_losses

BEFORE_ROOMS = "f884933"  # "pyproject: pin deepspeed to the tested 0.19.x": the flat launch/ layout

pytestmark = pytest.mark.slow


def _old_tree(tmp_path) -> str:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the old trainer cannot be taken from history")
    probe = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{BEFORE_ROOMS}^{{commit}}"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"commit {BEFORE_ROOMS} is not in this clone (a shallow clone?)")
    out = tmp_path / "old"
    out.mkdir()
    archive = subprocess.run(
        [
            "git",
            "-C",
            str(ROOT),
            "archive",
            BEFORE_ROOMS,
            "train.py",
            "launch",
            "data",
            "orscale",
            "configs",
            "assets",
        ],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    shutil.copytree(ROOT / "models", out / "models", ignore=shutil.ignore_patterns("__pycache__"))
    return str(out)


def test_a_checkpoint_of_the_flat_layout_resumes_bit_exactly(tmp_path):
    old = _old_tree(tmp_path)
    common = ["optim.name=orscale_lm", "train.ckpt_every=2", "train.eval_every=0"]
    old_env = dict(env(), PYTHONPATH=old)  # the old packages, not this checkout's
    old_run = tmp_path / "resumed"
    proc = subprocess.run(
        [
            sys.executable,
            f"{old}/train.py",
            "--config",
            f"{old}/configs/tiny.yaml",
            *(o.replace("optim.muon.", "optim.") for o in SMALL),  # the keys where that trainer read them
            *common,
            "train.max_steps=2",
            f"run.dir={old_run}",
        ],
        cwd=old,
        env=old_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (old_run / "checkpoints/step_00000002/meta.json").is_file()

    train_in_pool([*common, "train.max_steps=4", f"run.dir={old_run}"])  # today's trainer resumes it
    straight = tmp_path / "straight"
    train_in_pool([*common, "train.max_steps=4", f"run.dir={straight}"])

    resumed, want = train_losses(old_run), train_losses(straight)
    assert [resumed[s] for s in (3, 4)] == [want[s] for s in (3, 4)]
    cfg = get_preset("tiny", n_layer=2, d_model=64, max_seq_len=64, vocab_size=4096)
    a, b = GPT(cfg), GPT(cfg)
    load_model_weights(old_run / "checkpoints/step_00000004", a)
    load_model_weights(straight / "checkpoints/step_00000004", b)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
