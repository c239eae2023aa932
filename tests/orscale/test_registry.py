"""The optimizer table (orscale/registry.py) and the schedule table (orscale/schedule.py): what they
hold, what a record must say, and that the config checks, routing, builds and report read them."""

from __future__ import annotations

import pickle
from importlib import import_module

import pytest
import torch
from torch import nn

from launch.errors import ConfigError
from launch.plan import load_config
from orscale import (
    OPTIMIZER_NAMES,
    PLACEMENTS,
    VARIANTS,
    OptimConfig,
    OptimConfigError,
    build_optimizers,
    registry,
    schedule,
)
from orscale.cbp import CBP
from orscale.cbp_spec import CBPOptions
from orscale.distributed.elementwise import sharded_class
from orscale.lamb_lars import LAMB, LARSOptions
from orscale.optimizer_spec import ALL_PLACEMENTS, ZERO, OptimizerSpec
from tests.helpers import TINY

pytestmark = pytest.mark.usefixtures("one_thread")


def test_every_name_has_one_record_in_the_tables_order() -> None:
    in_order = [name for module in registry.FAMILIES for s in import_module(module).SPECS for name in s.names]
    assert list(OPTIMIZER_NAMES) == in_order  # the families' order, each one's names together
    assert {registry.optimizer_spec(n).routing for n in VARIANTS} == {"matrices"}
    assert registry.optimizer_spec("adamw").routing == "adamw"
    assert registry.optimizer_spec("cbp").routing == "elementwise"
    assert registry.find_optimizer("sgd") is None
    assert len(registry.SPECS) == len({id(s) for s in registry.OPTIMIZERS.values()})
    for spec in registry.SPECS:  # every family runs on every placement, ZeRO's owners included
        assert set(spec.build) == set(ALL_PLACEMENTS), spec.names
    assert registry.names_on(ZERO) == OPTIMIZER_NAMES


def test_the_reports_labels_come_from_the_table_in_its_order() -> None:
    from report.fmt import OPT_NAMES, opt_name, order

    labelled = list(registry.report_labels())  # the table's labelled names, in its order
    assert [n for n in OPT_NAMES if n in labelled] == labelled
    assert list(OPT_NAMES).index("orscale_lm_transfer") == list(OPT_NAMES).index("orscale_lm") + 1  # report-only
    assert opt_name("muon_moonlight#ab12") == "Muon+Moonlight #ab12" and opt_name("mutrust") == "mutrust"
    assert order(["lars", "zeta", "adamw", "orscale_lm_transfer"]) == ["adamw", "orscale_lm_transfer", "lars", "zeta"]


def test_the_reports_hyperparameter_rows_follow_the_routing() -> None:
    from report.markdown import _applies

    assert all(_applies(n, "") for n in ("adamw", "cbp", "muon"))
    assert not _applies("adamw", "muon") and not _applies("lamb", "trust")
    assert _applies("muon", "muon") and not _applies("muon_moonlight#x", "trust")  # no trust ratio
    assert _applies("orscale_lm", "trust") and _applies("orscale_lm_transfer", "trust")  # a report-only name


def test_a_name_registered_twice_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(registry, "FAMILIES", (*registry.FAMILIES, "orscale.cbp_spec"))
    with pytest.raises(ValueError, match="'cbp' is registered twice"):
        registry._table()


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(routing="everything"), "routing must be one of adamw, matrices, elementwise"),
        (dict(routing="elementwise"), "`groups` is given exactly for the elementwise routing"),
        (dict(routing="adamw", build={"tpu": None}), "unknown placements"),
    ],
)
def test_a_record_says_what_it_must(kw, message) -> None:
    with pytest.raises(ValueError, match=message):
        OptimizerSpec(**{"names": ("x",), "build": {}, **kw})


def test_each_section_checks_its_own_keys() -> None:
    with pytest.raises(OptimConfigError, match=r"^optim\.eps must be > 0"):  # the shared section's
        OptimConfig(eps=0.0)
    with pytest.raises(OptimConfigError, match=r"^optim\.cbp\.rho must be in \[0, 1\)"):
        CBPOptions(rho=1.0)  # checked whatever optim.name says
    with pytest.raises(OptimConfigError, match=r"^optim\.lars\.trust_coefficient must be > 0"):
        LARSOptions(trust_coefficient=0.0)


def test_build_optimizers_takes_the_placement_by_position_or_as_backend() -> None:
    def build(*args, **kw) -> list[str]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))  # a hidden layer, then the output
        return [type(o).__name__ for o in build_optimizers(model, OptimConfig(name="orscale_lm"), *args, **kw)]

    assert build("none") == build(backend="none") == build() == ["MuonFamily", "AdamW"]
    with pytest.raises(OptimConfigError, match=r"^backend must be one of none, ddp, fsdp for build_optimizers"):
        build(backend="zero")
    assert PLACEMENTS == ("none", "ddp", "fsdp")


def test_the_sharded_class_of_an_elementwise_optimizer_is_one_named_class() -> None:
    sharded = sharded_class(CBP)
    assert sharded is sharded_class(CBP) and sharded.__name__ == "ShardedCBP" and issubclass(sharded, CBP)
    assert sharded_class(LAMB) is not sharded and pickle.loads(pickle.dumps(sharded)) is sharded
    p = nn.Parameter(torch.ones(3, 2))
    p.grad = torch.ones(3, 2)
    opt = sharded([p], lr=0.1)  # on plain tensors (one process) it is the class itself
    twin = nn.Parameter(torch.ones(3, 2))
    twin.grad = torch.ones(3, 2)
    CBP([twin], lr=0.1).step()
    opt.step()
    assert torch.equal(p, twin)


# ---------------------------------------------------------------- the schedule table
def test_the_schedule_table_names_the_valid_schedules(monkeypatch) -> None:
    with pytest.raises(OptimConfigError, match=r"^optim\.schedule must be one of cosine, wsd"):
        registry.schedule_of("step")
    step = schedule.Schedule(lambda optim, step, total: optim.lr * 0.5 ** (step // 10))
    monkeypatch.setitem(registry.SCHEDULES, "halving", step)  # a new schedule: one line in the table
    cfg = OptimConfig(schedule="halving", lr=1.0)
    assert [registry.scheduled_lr(cfg, s, 100) for s in (0, 9, 10, 25)] == [1.0, 1.0, 0.5, 0.25]
    registry.check_schedule(cfg, 1)  # no check of its own against the run's length
    with pytest.raises(ConfigError, match="set optim.schedule=wsd"):  # wsd's keys stay wsd's
        load_config(TINY, ["optim.schedule=halving", "optim.wsd.decay_steps=3"])
