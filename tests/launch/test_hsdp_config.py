"""HSDP's config, in-process: parallel.dp_replicate / dp_shard resolved against the launched
world size, each bad combination refused in one line naming the key and the fix; the FSDP2 mesh
(None, the default 1-D world, unless dp_replicate > 1); reshard_after_forward's auto rule follows
the shard group."""

from __future__ import annotations

import pytest

from launch.config import ParallelConfig
from launch.engine.parallelize import reshard_after_forward
from launch.errors import ConfigError
from launch.plan import load_config


def _parallel(monkeypatch: pytest.MonkeyPatch, world: int, *overrides: str) -> ParallelConfig:
    monkeypatch.setenv("WORLD_SIZE", str(world))
    return load_config(None, list(overrides)).parallel


def test_dp_shard_defaults_to_the_rest_of_the_world(monkeypatch: pytest.MonkeyPatch) -> None:
    p = _parallel(monkeypatch, 16, "parallel.dp_replicate=2")
    assert (p.backend, p.dp_replicate, p.dp_shard) == ("fsdp", 2, 8)
    assert _parallel(monkeypatch, 16).dp_shard == 16  # plain FSDP2: one shard group of everyone
    assert _parallel(monkeypatch, 16, "parallel.dp_replicate=4", "parallel.dp_shard=4").dp_shard == 4
    assert _parallel(monkeypatch, 1).dp_shard == 1  # one process


@pytest.mark.parametrize(
    "world, overrides, message",
    [
        (4, ["parallel.dp_replicate=3"], "parallel.dp_replicate (3) must divide the world size (4)"),
        (4, ["parallel.dp_replicate=2", "parallel.backend=ddp"], "needs parallel.backend=fsdp (got ddp)"),
        (4, ["parallel.dp_replicate=2", "parallel.backend=zero2"], "needs parallel.backend=fsdp (got zero2)"),
        (16, ["parallel.dp_shard=8"], "set parallel.dp_replicate=2 or leave parallel.dp_shard unset"),
        (16, ["parallel.dp_replicate=2", "parallel.dp_shard=4"], "must equal the world size (16)"),
        (4, ["parallel.dp_replicate=0"], "parallel.dp_replicate must be >= 1"),
        (4, ["parallel.dp_shard=0"], "parallel.dp_shard must be >= 1, or -1"),
        (4, ["parallel.muon_replica_split=true"], "needs parallel.dp_replicate > 1 (got 1)"),
        (
            4,
            ["parallel.dp_replicate=2", "parallel.muon_replica_split=true", "parallel.muon_mode=replicate"],
            "parallel.muon_mode=owner (got replicate)",
        ),
        (4, ["parallel.muon_bucket_numel=0"], "parallel.muon_bucket_numel must be >= 1"),
    ],
)
def test_bad_meshes_are_one_line_naming_the_key(
    monkeypatch: pytest.MonkeyPatch, world: int, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _parallel(monkeypatch, world, *overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "world, local, shard, expected",
    [(16, 8, None, True), (16, 8, 8, False), (16, 8, 16, True), (8, 8, 8, False), (16, 4, 8, True)],
)
def test_reshard_auto_follows_the_shard_group(
    monkeypatch: pytest.MonkeyPatch, world: int, local: int, shard: int | None, expected: bool
) -> None:
    # HSDP with a node per shard group all-gathers over NVLink only: keep the params for backward.
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    assert reshard_after_forward("auto", shard) is expected
    assert reshard_after_forward("false", shard) is False
