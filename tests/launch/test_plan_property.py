"""`resolve(cfg, facts)` accepts a config exactly when its launch starts (launch/plan.py): over a grid of
configs x facts (world sizes 1-8, every backend, micro-batches, logical shards, schedules) it answers
every one with a plan or one ConfigError line; a seeded sample of the accepted ones starts and steps
(real ranks of the pool at 1, 2 and 4 processes; the dry run's fake world at the sizes the pool has
not), and of the refused ones stops with that same line on every rank before it writes anything."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from launch.config import read_config
from launch.dryrun.measure import dry_run
from launch.environment import EnvFacts
from launch.errors import ConfigError
from launch.plan import resolve
from tests.helpers import SMALL, TINY

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

WORLDS = range(1, 9)
BACKENDS = ("auto", "none", "ddp", "fsdp", "zero2")
MICRO = (1, 3, 8)
SHARDS = (1, 3, 8)
# warmup 0 and 2 steps: a wsd cooldown of 1 step fits the run, one of 3 does not
SCHEDULES = (("optim.schedule=cosine",), ("optim.schedule=wsd", "optim.wsd.decay_steps=1"))
SCHEDULES += (("optim.schedule=wsd", "optim.wsd.decay_steps=3"),)


def _overrides(backend: str, micro: int, shards: int, schedule: tuple[str, ...], run_dir: Path) -> list[str]:
    return [
        *SMALL,  # 8 windows of 64 tokens a step
        f"parallel.backend={backend}",
        f"train.micro_batch_size={micro}",
        f"data.logical_shards={shards}",
        *schedule,
        "optim.warmup_steps=0",
        "train.max_steps=2",
        "train.eval_every=0",
        f"run.dir={run_dir}",
    ]


def _verdict(world: int, overrides: list[str]) -> str | None:
    """None when resolve plans the launch, else its one-line refusal."""
    try:
        resolve(read_config(TINY, overrides), EnvFacts(world_size=world, local_world_size=world))
    except ConfigError as err:
        return str(err)
    return None


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> list[tuple[int, list[str], str | None]]:
    root = tmp_path_factory.mktemp("plans")
    cases = []
    for i, (world, backend, micro, shards, schedule) in enumerate(
        itertools.product(WORLDS, BACKENDS, MICRO, SHARDS, SCHEDULES)
    ):
        overrides = _overrides(backend, micro, shards, schedule, root / f"run{i}")
        cases.append((world, overrides, _verdict(world, overrides)))
    return cases


def test_every_config_of_the_grid_gets_a_plan_or_one_line(grid) -> None:
    refused = [why for _, _, why in grid if why is not None]
    assert 0 < len(refused) < len(grid)
    assert all("\n" not in why for why in refused)
    kinds = {why.split(" ")[0] for why in refused}  # the grid reaches the plan's different refusals
    assert len(kinds) >= 4, kinds


def test_an_accepted_config_starts_and_steps_on_real_ranks(grid) -> None:
    from tests.pool import rank_pool
    from tests.pool_jobs import train_runs

    pick = random.Random(0)
    for world in (1, 2, 4):
        accepted = [o for w, o, why in grid if w == world and why is None]
        for overrides in pick.sample(accepted, 1):
            (result,) = rank_pool(world).run(train_runs, [["--config", TINY, *overrides]], group=world > 1)[0]
            assert result["step"] == 2, overrides


def test_an_accepted_config_starts_in_a_world_the_pool_has_not(grid) -> None:
    pick = random.Random(1)
    fake = [(w, o) for w, o, why in grid if w in (3, 5, 6, 7, 8) and why is None and "parallel.backend=zero2" not in o]
    for world, overrides in pick.sample(fake, 2):
        run = dry_run(TINY, world, overrides=overrides, memory=False)
        assert run.world == world and run.seconds > 0, overrides


def test_a_refused_config_stops_with_its_line_on_every_rank_before_it_writes(grid) -> None:
    from tests.pool import rank_pool
    from tests.pool_jobs import train_error

    pick = random.Random(2)
    for world in (2, 4):
        refused = [(o, why) for w, o, why in grid if w == world and why is not None]
        for overrides, why in pick.sample(refused, 1):
            said = rank_pool(world).run(train_error, ["--config", TINY, *overrides], group=world > 1)
            assert said == [why] * world
            run_dir = Path(next(o for o in overrides if o.startswith("run.dir=")).split("=", 1)[1])
            assert not run_dir.exists()
