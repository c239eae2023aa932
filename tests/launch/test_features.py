"""The loop features' registry (launch/features/registry.py: which a config enables, the order their
declarations give), the trainer's hook calls and records (launch/trainer.py), and CBP's centring step as
the engine calls it (orscale/centring.py)."""

from __future__ import annotations

import copy
import dataclasses
import logging
import math

import pytest
import torch

from launch.config import to_dict
from launch.errors import ConfigError
from launch.features import FEATURES, Feature, build_features
from launch.features.checkpointing import Checkpointing
from launch.features.divergence import DivergenceError
from launch.features.downstream import Downstream
from launch.features.progress import ProgressReport
from launch.features.registry import ORDER, FeatureOrderError, feature_options, in_order
from launch.features.sample import SampleConfig
from launch.plan import load_config, load_plan
from launch.run.build import build_trainer
from launch.run.resume import QUIET
from launch.trainer import Trainer
from models import GPT, GPTConfig
from models.centered_linear import update_means
from orscale.centring import Centring
from records.read import read_run
from tests.helpers import SMALL, TINY, metrics


def _names(*overrides: str) -> set[str]:
    return {f.name for f in build_features(load_config(TINY, [*SMALL, *overrides]))}


def test_a_run_has_the_features_its_config_enables():
    default = _names()
    assert {"preemption", "divergence", "metrics", "validation", "checkpointing"} <= default
    assert "window_audit" not in default and "downstream" not in default  # off unless asked for
    assert "window_audit" in _names("train.record_windows=true")
    assert "stall_watch" in default and "stall_watch" not in _names("train.stall_dump_s=0")


def _feature(name: str, after: tuple[str, ...] = (), before: tuple[str, ...] = ()) -> type[Feature]:
    return type(f"Probe_{name}", (Feature,), {"name": name, "after": after, "before": before})


def test_the_order_keeps_every_declaration_and_nothing_else_decides_it():
    names = [f.name for f in ORDER]
    for feature in ORDER:
        assert all(names.index(other) < names.index(feature.name) for other in feature.after), feature.name
        assert all(names.index(other) > names.index(feature.name) for other in feature.before), feature.name
    assert in_order(reversed(FEATURES)) == ORDER  # the table's order decides nothing
    a, b, c = _feature("a", after=("c",)), _feature("b", before=("a",)), _feature("c")
    assert [f.name for f in in_order((a, b, c))] == ["b", "c", "a"]  # b and c are free: by name


def test_a_cycle_an_unknown_name_or_a_name_twice_is_one_line():
    a, b, c = _feature("a", after=("b",)), _feature("b", after=("c",)), _feature("c", after=("a",))
    cycle = r"^the loop features' after/before declarations form a cycle: a after b after c after a$"
    with pytest.raises(FeatureOrderError, match=cycle):
        in_order((a, b, c, _feature("d")))
    with pytest.raises(FeatureOrderError, match=cycle):  # d waits for the cycle, and is not in it
        in_order((_feature("d", after=("a",)), c, b, a))
    with pytest.raises(FeatureOrderError, match=r"^loop feature 'x' declares after=\('metrix',\), but no feature"):
        in_order((*FEATURES, _feature("x", after=("metrix",))))
    with pytest.raises(FeatureOrderError, match="both named 'metrics'"):
        in_order((*FEATURES, _feature("metrics")))


class _SeesTheTrainingLine(Feature):
    """Declared after metrics: the step's training record, the step it is written. (Each probe's name
    sorts on the other side of "metrics": its declaration, not its name, places it.)"""

    name, after = "a_sees", ("metrics",)

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.seen: list[tuple[int, int | None]] = []

    def after_step(self, trainer, step):
        line = trainer.last("train")
        self.seen.append((step, line and line["step"]))

    def end_step(self, trainer, step):  # its own record, after the step's evaluation: the file's last line
        trainer.record(self.name, {"seen": step})


class _BeforeTheTrainingLine(_SeesTheTrainingLine):
    name, after, before = "z_early", (), ("metrics",)

    def end_step(self, trainer, step):
        pass


class _Diverges(Feature):
    """Makes step 1's loss non-finite (a weight set to NaN before its forward)."""

    name = "diverges"

    def batch(self, trainer, step, windows):
        next(trainer.engine.model.parameters()).data.fill_(math.nan)


def _fit(tmp_path, table, *overrides: str) -> Trainer:
    plan = load_plan(TINY, [*SMALL, f"run.dir={tmp_path}", "optim.name=adamw", *overrides])
    trainer = build_trainer(plan)
    trainer.features = build_features(plan.cfg, table)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return trainer


def test_a_feature_declared_after_metrics_sees_the_record_and_its_own_kind_is_read_apart(tmp_path):
    trainer = _fit(tmp_path, (*FEATURES, _SeesTheTrainingLine, _BeforeTheTrainingLine), "train.max_steps=2")
    sees, early = (next(f for f in trainer.features if f.name == n) for n in ("a_sees", "z_early"))
    assert sees.seen == [(1, 1), (2, 2)] and early.seen == [(1, None), (2, 1)]
    lines = metrics(tmp_path)
    kinds = [(m["kind"], m["step"]) for m in lines]
    assert kinds == [("train", 1), ("a_sees", 1), ("train", 2), ("val", 2), ("a_sees", 2)]
    assert lines[-1] == {"kind": "a_sees", "step": 2, "tokens": 1024, "seen": 2} == trainer.last("a_sees")
    run = read_run(tmp_path)  # the report's reader: the feature's line is not the last training line
    assert run.finished and [e["step"] for e in run.evals] == [2] and run.last_train is not None
    assert run.last_train["step"] == 2 and run.last_train["params"] > 0 and run.last_train["tokens_per_s"] > 0
    assert [t["step"] for t in run.train] == [1, 2] and run.other_kinds["a_sees"]["seen"] == 2
    with pytest.raises(ValueError, match="kind is a plain name"):
        trainer.record("Not a kind", {})
    with pytest.raises(ValueError, match=r"hold \['step'\], which the trainer writes itself"):
        trainer.record("a_sees", {"step": 3})


def test_the_progress_line_of_a_step_the_divergence_check_stops_is_never_printed(tmp_path, caplog):
    progress = type("Progress", (ProgressReport,), {"name": "a_progress"})  # sorts first: placed by `after`
    table = (*(f for f in FEATURES if f is not ProgressReport), progress, _Diverges)
    with caplog.at_level(logging.INFO, logger="orscale"), pytest.raises(DivergenceError, match="at step 1;"):
        _fit(tmp_path, table, "train.max_steps=2")
    assert metrics(tmp_path)[-1]["train_loss"] is None  # the record is written, then checked
    assert "step 1/2" not in caplog.text


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
