"""The loop features' registry (launch/features/registry.py), the trainer's hook calls
(launch/trainer.py) and CBP's centring step as the engine calls it (orscale/centring.py)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from launch.config import to_dict
from launch.errors import ConfigError
from launch.features import FEATURES, Feature, build_features
from launch.features.checkpointing import Checkpointing
from launch.features.downstream import Downstream
from launch.features.registry import feature_options
from launch.features.sample import SampleConfig
from launch.features.window_audit import WindowAuditing
from launch.plan import load_config
from launch.run.resume import QUIET
from launch.trainer import Trainer
from models import GPT, GPTConfig
from models.centered_linear import update_means
from orscale.centring import Centring
from tests.helpers import SMALL, TINY


def _names(*overrides: str) -> list[str]:
    cfg = load_config(TINY, [*SMALL, *overrides])
    kinds = {kind: name for name, kind in FEATURES}
    return [kinds[type(f)] for f in build_features(cfg)]


def test_the_registry_builds_the_features_a_config_enables_in_its_order():
    default = _names()
    assert default == [name for name, _ in FEATURES if name in default]  # the registry's order
    assert {"preemption", "divergence", "metrics", "validation", "checkpointing"} <= set(default)
    assert "window_audit" not in default and "downstream" not in default  # off unless asked for
    assert "stall_watch" not in _names("train.stall_dump_s=0")
    with_audit = _names("train.record_windows=true")
    assert with_audit.index("window_audit") == with_audit.index("reader_failure") + 1
    # the order of effects: the divergence check before the progress line, profiling before metrics,
    # validation before the downstream tasks, the checkpoint last
    order = [name for name, _ in FEATURES]
    assert order.index("divergence") < order.index("progress") < order.index("metrics")
    assert order.index("profiling") < order.index("metrics") < order.index("validation") < order.index("downstream")
    assert order[-1] == "checkpointing"


def test_a_feature_owns_its_config_section_read_checked_recorded_and_quiet_on_resume():
    assert SampleConfig in feature_options()  # from the feature's own file, under its registry line
    cfg = load_config(TINY, [*SMALL, "train.sample.every=2", "train.sample.prompt=Once"])
    assert cfg.train.own(SampleConfig) == SampleConfig(every=2, prompt="Once")
    assert to_dict(cfg)["train"]["sample"]["prompt"] == "Once"  # config.yaml records it
    assert to_dict(load_config(TINY, SMALL))["train"]["sample"] == dataclasses.asdict(SampleConfig())
    with pytest.raises(
        ConfigError, match=r"^unknown config key 'train.sample.evry'; did you mean 'train.sample.every'"
    ):
        load_config(TINY, [*SMALL, "train.sample.evry=2"])
    with pytest.raises(ConfigError, match=r"^train.sample.max_new_tokens must be >= 1, got 0$"):
        load_config(TINY, [*SMALL, "train.sample.max_new_tokens=0"])
    assert "config.train.sample." in QUIET  # it only observes: a resume that changes it is routine
    assert "config.train.divergence." not in QUIET


class _Recorder(Feature):
    def __init__(self, cfg, name: str, calls: list) -> None:
        super().__init__(cfg)
        self.name, self.calls = name, calls

    def end_step(self, trainer, step):
        self.calls.append((self.name, step))

    def should_stop(self, trainer, step):
        return self.name == "b"


def test_the_trainer_calls_every_feature_in_order_and_finds_one_by_class():
    cfg = load_config(TINY, SMALL)
    calls: list = []
    trainer = Trainer.__new__(Trainer)
    trainer.features = [_Recorder(cfg, "a", calls), _Recorder(cfg, "b", calls), Checkpointing(cfg)]
    trainer.each("end_step", 3)
    assert calls == [("a", 3), ("b", 3)]
    assert trainer.each("should_stop", 3) == [False, True, False]  # every feature asked: collectives
    assert trainer.feature(Checkpointing) is trainer.features[2]
    with pytest.raises(LookupError, match="no Downstream feature"):
        trainer.feature(Downstream)
    assert isinstance(build_features(load_config(TINY, [*SMALL, "train.record_windows=true"]))[5], WindowAuditing)


def test_the_centring_step_is_m2_on_every_centred_layer_and_none_without_one():
    cfg = GPTConfig(n_layer=2, d_model=32, n_head=2, max_seq_len=16, vocab_size=64, center_mlp=True)
    model = GPT(cfg, seed=0)
    x = torch.randint(0, 64, (2, 16))
    model(x[:, :-1], x[:, 1:]).backward()
    reference = copy.deepcopy(model)
    update_means(reference)
    centring = Centring.of(model, average=None, local=lambda t: t)
    assert centring is not None and centring.biases == {f"blocks.{i}.mlp.down.bias" for i in range(2)}
    centring.after_step()
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert any(b.abs().sum() > 0 for n, b in model.state_dict().items() if n.endswith(".mu"))
    plain = GPT(GPTConfig(n_layer=1, d_model=32, n_head=2, max_seq_len=16, vocab_size=64), seed=0)
    assert Centring.of(plain, average=None, local=lambda t: t) is None
