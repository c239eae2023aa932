"""The optimizer and schedule tables: every optimizer family the trainer runs, by `optim.name`, and
every LR schedule, by `optim.schedule`.

Each family's module defines ``SPECS``, its ``orscale.optimizer_spec.OptimizerSpec`` records (its
names, routing, options, builds per placement, owner hooks, report labels); ``FAMILIES`` lists those
modules, one line each, in the order `optim.name`'s valid values and the report's columns follow.
Adding an optimizer is its module plus its line here; adding a schedule is a ``Schedule`` and its line
in ``SCHEDULES``. Nothing else compares an optimizer's or a schedule's name: it asks these tables.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from orscale.errors import Checks, OptimConfigError
from orscale.optimizer_spec import OptimizerSpec
from orscale.schedule import CONSTANT, COSINE, WSD, Schedule

if TYPE_CHECKING:
    from orscale.optim_config import OptimConfig

FAMILIES: tuple[str, ...] = (
    "orscale.adamw",
    "orscale.muon_spec",  # every orscale.variants row
    "orscale.normuon",
    "orscale.cbp_spec",
    "orscale.lamb_lars",
    "orscale.lion",
)

# `optim.schedule` (orscale/schedule.py)
SCHEDULES: dict[str, Schedule] = {
    "cosine": COSINE,
    "wsd": WSD,
    "constant": CONSTANT,
}


def _table() -> dict[str, OptimizerSpec]:
    table: dict[str, OptimizerSpec] = {}
    for module in FAMILIES:
        for spec in importlib.import_module(module).SPECS:
            for name in spec.names:
                if name in table:
                    raise ValueError(f"optimizer name {name!r} is registered twice (again by {module})")
                table[name] = spec
    return table


OPTIMIZERS: dict[str, OptimizerSpec] = _table()
OPTIMIZER_NAMES: tuple[str, ...] = tuple(OPTIMIZERS)
SPECS: tuple[OptimizerSpec, ...] = tuple({id(s): s for s in OPTIMIZERS.values()}.values())  # each family once


def optimizer_spec(name: str) -> OptimizerSpec:
    """The record of optimizer `name`; a one-line OptimConfigError naming the known ones for any other."""
    if name not in OPTIMIZERS:
        raise OptimConfigError(f"optim.name {name!r} is not a known optimizer; valid: {', '.join(OPTIMIZER_NAMES)}")
    return OPTIMIZERS[name]


def find_optimizer(name: str) -> OptimizerSpec | None:
    """The record of `name`, or None (a name in a report that no family registers)."""
    return OPTIMIZERS.get(name)


def schedule_of(name: str) -> Schedule:
    """The schedule `name`; a one-line OptimConfigError naming the known ones for any other."""
    if name not in SCHEDULES:
        raise OptimConfigError(f"optim.schedule must be one of {', '.join(SCHEDULES)}, got {name!r}")
    return SCHEDULES[name]


def optim_options() -> list[type[Any]]:
    """The options class of every `optim.<section>` a family or schedule owns, each once."""
    found = [o for spec in SPECS for o in spec.options] + [o for s in SCHEDULES.values() for o in s.options]
    return list(dict.fromkeys(found))


def optimizer_checks(cfg: OptimConfig) -> Checks:
    """The checks `cfg`'s optimizer makes of the shared keys."""
    return optimizer_spec(cfg.name).checks(cfg)


def names_on(placement: str) -> tuple[str, ...]:
    """The optimizer names that can be built on `placement` (``orscale.optimizer_spec.ALL_PLACEMENTS``)."""
    return tuple(name for name, spec in OPTIMIZERS.items() if placement in spec.build)


def report_labels() -> dict[str, str]:
    """name -> the report's label, in the report's order (the table's)."""
    return {name: label for spec in SPECS for name, label in spec.labels.items()}


def check_schedule(optim: OptimConfig, total: int) -> None:
    """OptimConfigError (one line) for a schedule a run of `total` steps cannot follow."""
    schedule_of(optim.schedule).fits(optim, total)


def scheduled_lr(optim: OptimConfig, step: int, total: int) -> float:
    """optim.lr's value at 0-based step `step` of a run of `total` steps, by `optim.schedule`."""
    return schedule_of(optim.schedule).lr(optim, step, total)
