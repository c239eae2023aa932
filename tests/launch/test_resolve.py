"""The config resolved once, purely (launch.plan.resolve): the launch's facts come in one
`EnvFacts`, the derived values (backend auto, dp_shard -1, the device's defaults, a micro-batch
fitted to a rank's share) are computed from them into a new Config, which is what config.yaml
records; the config classes read no environment and the config given is left as it was."""

from __future__ import annotations

import dataclasses

import pytest

from launch.config import Config, ParallelConfig, TrainConfig, to_dict
from launch.environment import EnvFacts
from launch.errors import ConfigError
from launch.plan import fit_micro_batch, load_config, resolve
from tests.conftest import ROOT

TINY = str(ROOT / "configs/tiny.yaml")


def _old_fit(train: TrainConfig, seq_len: int, world_size: int) -> int:
    """The micro-batch launch/run/setup.py set before resolve existed (it mutated the config)."""
    share = train.tokens_per_step // seq_len // world_size
    return share if train.micro_batch_size > share >= 1 else train.micro_batch_size


@pytest.mark.parametrize("world", [1, 2, 4, 8, 16, 32])
@pytest.mark.parametrize("micro", [1, 3, 4, 16, 64])
def test_the_micro_batch_is_the_one_the_old_setup_chose(world: int, micro: int) -> None:
    cfg = Config()  # as read, before resolve: parallel.backend auto, parallel.dp_shard -1
    cfg.train.micro_batch_size = micro
    fitted, _ = fit_micro_batch(cfg.train, cfg.data.seq_len, world)  # what resolve sets (where it plans a launch)
    assert fitted == _old_fit(cfg.train, cfg.data.seq_len, world)
    assert cfg.train.micro_batch_size == micro  # the config given is not touched


def test_a_fitted_micro_batch_is_said_and_recorded() -> None:
    cfg = load_config(TINY, facts=EnvFacts(world_size=4, local_world_size=4))
    assert cfg.train.micro_batch_size == 4 and to_dict(cfg)["train"]["micro_batch_size"] == 4
    assert cfg.notes == (
        "train.micro_batch_size 16 is more than a rank's share of a step (4 sequences on 4 ranks): using 4",
    )
    assert load_config(TINY, ["train.micro_batch_size=2"], EnvFacts(world_size=4)).notes == ()
    assert "notes" not in to_dict(cfg)  # not a setting: config.yaml does not record it
    with pytest.raises(ConfigError, match="unknown config key 'notes'"):
        load_config(TINY, ["notes=x"])


def test_config_classes_read_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    alone = (to_dict(Config()), ParallelConfig(dp_replicate=2))
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert (to_dict(Config()), ParallelConfig(dp_replicate=2)) == alone
    p = Config().parallel
    assert (p.backend, p.dp_shard) == ("auto", -1)  # resolved by resolve, against the facts it is given


def test_resolve_is_pure_and_idempotent() -> None:
    cfg = Config()  # 32 sequences of 256 tokens a step
    cfg.train.micro_batch_size = 64
    before = to_dict(cfg)
    facts = EnvFacts(world_size=8, local_world_size=8)
    once = resolve(cfg, facts).cfg
    assert to_dict(cfg) == before  # the config given is left as it was
    assert to_dict(resolve(cfg, facts).cfg) == to_dict(once)  # the same facts, the same config
    assert to_dict(resolve(once, facts).cfg) == to_dict(once)  # a resolved config (config.yaml) stays what it is
    assert (once.parallel.backend, once.parallel.dp_shard, once.parallel.compile) == ("fsdp", 8, "none")
    assert once.train.micro_batch_size == 4  # a rank's share: 32 sequences on 8 ranks


def test_explicit_facts_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "16")
    assert load_config(TINY, facts=EnvFacts(world_size=1)).parallel.backend == "none"
    assert load_config(TINY).parallel.backend == "fsdp"  # default: this process's facts
    cuda = load_config(TINY, ["parallel.backend=none"], EnvFacts(cuda=True, device_name="NVIDIA H100 80GB HBM3"))
    assert (cuda.parallel.compile, cuda.optim.fused) == ("blocks", "fused")
    assert dataclasses.replace(EnvFacts(), world_size=2).world_size == 2


def test_env_facts_are_read_in_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    import launch.environment as environment

    for key, value in {"WORLD_SIZE": "16", "RANK": "9", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    asked = []
    monkeypatch.setattr(environment, "_cuda_device_name", lambda: asked.append(1) or "NVIDIA H200")
    monkeypatch.setattr(environment, "_cuda_available", lambda: True)
    assert EnvFacts.from_env() == EnvFacts(16, 16, 9, 1)  # one node holds the world unless torchrun says
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert EnvFacts.from_env(TrainConfig(attention="flash")) == EnvFacts(16, 8, 9, 1, cuda=True)
    assert asked == []  # the board's name (which starts CUDA) is read only where the config needs it
    assert EnvFacts.from_env(TrainConfig()).device_name == "NVIDIA H200" and asked == [1]
    assert EnvFacts.from_env(TrainConfig(device="cpu")) == EnvFacts(16, 8, 9, 1)
