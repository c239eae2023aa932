"""What every metrics.jsonl line carries (issue 11's comparable metrics) and the TensorBoard mirror."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from launch.checkpoint import Checkpointer
from launch.config import read_config
from launch.errors import ConfigError
from launch.loop import main as train_main
from launch.run.meter import StepMeter
from launch.run.run_dir import check_mirrors_available
from launch.run.train_state import TrainState
from launch.runtime.process_group import DistEnv
from launch.train_config import TrainConfig
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
    cfg = read_config(TINY, ["train.wandb=true"])  # read, not planned: a plan would refuse it here
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="train.wandb=true needs the wandb package: pip install wandb"):
        check_mirrors_available(cfg.train)


def test_a_resumed_run_writes_the_records_of_the_uninterrupted_run(tmp_path):
    """Resumed between two logging steps (checkpoint at step 4, a record every 3), a run writes the
    records the uninterrupted run writes: the same steps, each the mean of the same window, bit-equal
    (it used to log step 5, the first it ran, and then step 6 alone). Issue 32."""
    base = ["--config", TINY, *SMALL, "optim.name=adamw", "train.eval_every=0", "train.max_steps=6"]
    base += ["train.log_every=3", "train.ckpt_every=2"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert train_main([*base, f"run.dir={straight}"]) == 0
    assert train_main([*base, f"run.dir={resumed}", f"run.resume={straight}/checkpoints/step_00000004"]) == 0
    want = {m["step"]: m["train_loss"] for m in metrics(straight) if "train_loss" in m}
    got = {m["step"]: m["train_loss"] for m in metrics(resumed) if "train_loss" in m}
    assert sorted(want) == [1, 3, 6] and got == {6: want[6]}, (got, want)


def _meter(world_size: int = 1, rank: int = 0) -> StepMeter:
    env = DistEnv(rank=rank, world_size=world_size, local_rank=rank, device=torch.device("cpu"), backend="none")
    return StepMeter(env, (1.0, 1.0), params=10, non_embedding_params=5)


def test_the_meters_window_resumes_on_another_world_size():
    """Saved on 2 ranks after 2 steps of a window (per-rank loss sums 6 and 10: a mean of 4 per step),
    resumed on 1 process for one more step of loss 1: the record is the mean of the 3 steps, 3."""
    meter = _meter()
    meter.load_rank_states([{"steps": 2, "loss_sum": torch.tensor(6.0)}, {"steps": 2, "loss_sum": torch.tensor(10.0)}])
    meter.add_micro_batch(torch.tensor(1.0))
    meter.end_step(3, torch.tensor(1.0), tokens=8, data_wait_s=0.0)
    assert meter.read(tokens_seen=24)["train_loss"] == 3.0
    same = _meter()  # the same world size: this rank's own sum, as it was
    same.load_rank_states([same.state_dict() | {"steps": 1, "loss_sum": torch.tensor(2.5)}])
    assert same.read(tokens_seen=8)["train_loss"] == 2.5


def test_a_checkpoint_without_the_meter_still_loads(tmp_path):
    """Checkpoints written before the meter was a part (format 3 all the same) load; the meter keeps
    its fresh window. A part that is not optional and missing is still an error."""
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="none")
    state = TrainState(0, 1)
    state.step = 7
    Checkpointer(tmp_path, env, [], {"train_state": state}).save(7, {})
    fresh, meter = TrainState(0, 1), _meter()
    Checkpointer(tmp_path, env, [], {"train_state": fresh, "meter": meter}, optional=("meter",)).load(
        tmp_path / "step_00000007"
    )
    assert fresh.step == 7 and meter.state_dict()["steps"] == 0
    with pytest.raises(KeyError):
        Checkpointer(tmp_path, env, [], {"train_state": fresh, "meter": meter}).load(tmp_path / "step_00000007")


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")
def test_a_features_own_record_is_mirrored_under_its_kind(tmp_path):
    """A loop feature's record (`trainer.record("probe", ...)`) keeps its keys apart from the training
    line's in TensorBoard: `probe/tokens`, not a second `tokens`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from launch.run.run_dir import RunDir

    run = RunDir(str(tmp_path), active=True)
    run.open({"train": {"tensorboard": True}}, TrainConfig(tensorboard=True), extra={})
    run.write({"kind": "train", "step": 1, "tokens": 64, "train_loss": 3.0})
    run.write({"kind": "probe", "step": 1, "tokens": 64, "all": 1.5})
    run.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["probe/all", "probe/tokens", "tokens", "train_loss"]
