"""The backend registry (launch/backends/): one class per `parallel.backend`, each answering for its
process group, engine, optimizer placement, checkpoint layout and config checks, with the one-line
errors the launch gave before it existed; and no backend name compared anywhere else in launch/."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from launch.backends.registry import BACKENDS, backend_for, resolve_auto
from launch.backends.torch_native import DDPBackend, FSDPBackend, FSDPOptions, NoBackend
from launch.backends.zero import ZeroBackend
from launch.config import ParallelConfig, read_config
from launch.engine.parallelize import reshard_after_forward
from launch.environment import EnvFacts
from launch.errors import ConfigError
from launch.plan import load_config, resolve
from orscale import PLACEMENTS
from tests.conftest import ROOT

TINY = str(ROOT / "configs/tiny.yaml")


def test_every_name_has_one_class_that_knows_its_name() -> None:
    assert list(BACKENDS) == ["none", "ddp", "fsdp", "zero1", "zero2"]
    for name, cls in BACKENDS.items():
        backend = backend_for(name)
        assert type(backend) is cls and backend.name == name and backend.label
    with pytest.raises(ConfigError, match=r"parallel.backend must be one of none, ddp, fsdp, zero1, zero2; got 'auto'"):
        backend_for("auto")  # auto is resolved before anything asks for a backend


def test_engines_placements_and_layouts() -> None:
    from launch.engine.deepspeed_engine import DeepSpeedEngine
    from launch.engine.torch_engine import TorchEngine

    engines = {name: backend_for(name).engine_class() for name in BACKENDS}
    assert engines == {
        "none": TorchEngine,
        "ddp": TorchEngine,
        "fsdp": TorchEngine,
        "zero1": DeepSpeedEngine,
        "zero2": DeepSpeedEngine,
    }
    placements = {name: cls.optimizer_placement for name, cls in BACKENDS.items()}
    assert placements == {"none": "none", "ddp": "ddp", "fsdp": "fsdp", "zero1": None, "zero2": None}
    assert {p for p in placements.values() if p is not None} == set(PLACEMENTS)  # what orscale.build_optimizers takes
    assert {name: cls.checkpoint_layout for name, cls in BACKENDS.items()} == {
        "none": "dcp",
        "ddp": "dcp",
        "fsdp": "dcp",
        "zero1": "zero",
        "zero2": "zero",
    }
    assert [cls.zero_stage for cls in BACKENDS.values()] == [None, None, None, 1, 2]
    assert [name for name, cls in BACKENDS.items() if not cls.process_group] == ["none"]
    assert issubclass(BACKENDS["zero1"], ZeroBackend) and not issubclass(BACKENDS["fsdp"], ZeroBackend)


def test_auto_is_none_on_one_process_and_fsdp_on_several() -> None:
    assert [resolve_auto("auto", world) for world in (1, 2, 8)] == ["none", "fsdp", "fsdp"]
    assert resolve_auto("ddp", 1) == "ddp" and resolve_auto("none", 4) == "none"  # an explicit choice stays


def check_backend(name: str, world: int) -> None:
    """A launch of `world` processes planned with parallel.backend=`name` (and this process's
    `accelerate launch` facts)."""
    facts = dataclasses.replace(EnvFacts.from_env(), world_size=world, local_world_size=world)
    resolve(read_config(TINY, [f"parallel.backend={name}", "train.micro_batch_size=1"]), facts)


def test_launch_errors_are_the_same_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as err:
        check_backend("none", 4)
    assert str(err.value) == (
        "launched with 4 processes but parallel.backend=none; set parallel.backend to ddp, fsdp, zero1 or zero2"
    )
    for name in ("ddp", "fsdp"):
        check_backend(name, 4)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ConfigError) as err:
        check_backend("ddp", 2)
    assert str(err.value) == (
        "launched by accelerate with an FSDP config but parallel.backend=ddp; pass parallel.backend=fsdp"
    )
    check_backend("fsdp", 2)
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "TRUE")
    with pytest.raises(ConfigError) as err:
        check_backend("fsdp", 2)
    assert str(err.value) == (
        "launched by accelerate with a DeepSpeed config but parallel.backend=fsdp; pass parallel.backend=zero1 or zero2"
    )


def test_zero_without_deepspeed_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^parallel.backend=zero2 needs DeepSpeed: pip install deepspeed$"):
        check_backend("zero2", 2)


def test_config_checks_belong_to_the_backend() -> None:
    """HSDP and FSDP2's parameter dtype are fsdp's settings; every other backend refuses them."""
    for name in ("none", "ddp", "zero1"):
        with pytest.raises(ConfigError, match=f"needs parallel.backend=fsdp \\(got {name}\\)"):
            load_config(None, [f"parallel.backend={name}", "parallel.fsdp.param_dtype=bf16"])
        with pytest.raises(ConfigError, match=f"needs parallel.backend=fsdp \\(got {name}\\)"):
            backend_for(name).check_layout(ParallelConfig(dp_replicate=2))
    fsdp = FSDPBackend()
    fsdp.check_layout(ParallelConfig(dp_replicate=2))
    assert load_config(None, ["parallel.backend=fsdp", "parallel.fsdp.param_dtype=bf16"], EnvFacts(world_size=2))
    no_meta = ParallelConfig(sections={"fsdp": FSDPOptions(meta_init=False)})
    assert fsdp.meta_init(ParallelConfig()) and not fsdp.meta_init(no_meta)
    assert not NoBackend().meta_init(ParallelConfig()) and not DDPBackend().meta_init(ParallelConfig())


def test_the_model_is_wrapped_only_by_ddp() -> None:
    model = torch.nn.Linear(2, 2)
    for name in ("none", "fsdp", "zero1"):
        assert backend_for(name).wrap(model, None) is model  # type: ignore[arg-type]  # the env is unused there


@pytest.mark.parametrize(
    "world, local, shard, expected",
    [
        (16, 8, None, True),
        (16, 8, 8, False),
        (16, 8, 16, True),
        (8, 8, 8, False),
        (16, 4, 8, True),
        (1, 1, None, False),
    ],
)
def test_reshard_auto_takes_the_world_it_is_given(
    monkeypatch: pytest.MonkeyPatch, world: int, local: int, shard: int | None, expected: bool
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "64")  # the launch's world is not read when the engine gives its own
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert reshard_after_forward("auto", shard, world, local) is expected


# A backend's name compared: `parallel.backend` with a name (==, !=, in, not in), anything with the name
# of a parallel backend, a backend read from a config file, or a ZeRO name written out.
_COMPARED = re.compile(
    r"""backend\W*\s*(==|!=|\bnot in\b|\bin\b)\s*[(\[]?\s*["'](none|ddp|fsdp|zero1|zero2)["']"""
    r"""|(==|!=)\s*["'](ddp|fsdp|zero1|zero2)["']"""
    r"""|\.backend["'],[^)]*\)\s*(==|!=)"""
    r"""|["']zero[12]["']"""
)


def test_no_backend_name_is_compared_outside_the_registry() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for path in sorted((ROOT / "launch").rglob("*.py"))
        if "backends" not in path.relative_to(ROOT).parts
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if _COMPARED.search(line)
    ]
    assert found == []
