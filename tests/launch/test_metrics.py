"""What every metrics.jsonl line carries (issue 11's comparable metrics) and the TensorBoard mirror."""

from __future__ import annotations

import importlib.util
import math

import pytest

from launch.config import load_config
from launch.errors import ConfigError
from launch.loop import main as train_main
from launch.run.run_dir import check_mirrors_available
from models import GPT, get_preset
from tests.helpers import SMALL, TINY, metrics


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("metrics")
    mirror = ["train.tensorboard=true"] if importlib.util.find_spec("tensorboard") else []
    assert (
        train_main(
            [
                "--config",
                TINY,
                *SMALL,
                f"run.dir={out}",
                "train.max_steps=3",
                "train.eval_every=3",
                "optim.name=orscale_lm",
                *mirror,
            ]
        )
        == 0
    )
    return out


def test_training_lines_carry_the_comparable_metrics(run_dir):
    lines = metrics(run_dir)
    train_lines = [m for m in lines if "train_loss" in m]
    last = train_lines[-1]
    model = GPT(get_preset("tiny", n_layer=2, d_model=64, max_seq_len=64, vocab_size=4096))
    assert last["params"] == model.num_params()
    assert last["non_embedding_params"] == model.num_params() - 4096 * 64
    assert last["chinchilla_multiple"] == pytest.approx(last["tokens"] / (20 * last["non_embedding_params"]))
    assert last["mfu"] is None and last["peak_mem_gib"] is None  # CPU: no peak table, no device memory
    assert 0 <= last["data_wait_frac"] <= 1 and last["tokens_per_s"] > 0 and last["peak_rss_gib"] > 0
    assert any(k.startswith("diag/") for k in last)
    evals = [m for m in lines if "val_loss" in m]
    assert evals[-1]["val_tokens"] == 1024 and math.isfinite(evals[-1]["val_loss"])


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")
def test_tensorboard_mirrors_the_same_records(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    logged = {m["step"]: m["train_loss"] for m in metrics(run_dir) if "train_loss" in m}
    mirrored = {e.step: e.value for e in acc.Scalars("train_loss")}
    assert mirrored.keys() == logged.keys()
    assert all(mirrored[s] == pytest.approx(logged[s], rel=1e-6) for s in logged)
    assert [e.step for e in acc.Scalars("val_loss")] == [3]


def test_a_missing_mirror_package_is_one_line(monkeypatch):
    cfg = load_config(TINY, ["train.wandb=true"])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="train.wandb=true needs the wandb package: pip install wandb"):
        check_mirrors_available(cfg.train)
