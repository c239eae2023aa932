"""The optimizer table: every optimizer family the trainer runs, by `optim.name`.

Each family's module defines ``SPECS``, its ``orscale.optimizer_spec.OptimizerSpec`` records (its
names, routing, builds per placement, config checks, owner hooks, report labels); ``FAMILIES``
lists those modules, one line each, in the order `optim.name`'s valid values, the config checks and
the report's columns follow. Adding an optimizer is its module plus its line here. Everything else
(config checks, routing, ``orscale.build_optimizers``, ZeRO's client, the report) asks this table;
none compares an optimizer name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from orscale.optimizer_spec import Checks, OptimizerSpec

if TYPE_CHECKING:
    from orscale.optim_config import OptimConfig

FAMILIES: tuple[str, ...] = (
    "orscale.factories",  # AdamW, then the Muon family (orscale.variants)
    "orscale.cbp_spec",
    "orscale.trust_ratio",  # LAMB, LARS
    "orscale.lion",
)


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
    """The record of optimizer `name` (KeyError for a name no family registers; ``OptimConfig``
    refuses those first, with a one-line error)."""
    return OPTIMIZERS[name]


def find_optimizer(name: str) -> OptimizerSpec | None:
    """The record of `name`, or None (a name in a report that no family registers)."""
    return OPTIMIZERS.get(name)


def optimizer_checks(cfg: OptimConfig) -> Checks:
    """Every family's checks of its own `optim:` keys, in the table's order."""
    return [check for spec in SPECS for check in spec.checks(cfg)]


def names_on(placement: str) -> tuple[str, ...]:
    """The optimizer names that can be built on `placement` (``orscale.optimizer_spec.ALL_PLACEMENTS``)."""
    return tuple(name for name, spec in OPTIMIZERS.items() if placement in spec.build)


def report_labels() -> dict[str, str]:
    """name -> the report's label, in the report's order (the table's)."""
    return {name: label for spec in SPECS for name, label in spec.labels.items()}
