"""The loop features, one line each (in any order: it decides nothing). A feature says itself what it is
called (`Feature.name`), whether a run has it (`Feature.enabled`), which config section it owns
(`Feature.Options`) and which features' effects it needs before or after its own (`Feature.after`,
`Feature.before`); `ORDER` is the one order that keeps every such declaration, ties broken by name, so
the same table in any order runs the same way. A name no feature has, a name twice, or a cycle is one
line (FeatureOrderError) when this module is imported."""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from launch.features.base import Feature
from launch.features.checkpointing import Checkpointing
from launch.features.divergence import Divergence
from launch.features.downstream import Downstream
from launch.features.metrics import Metrics
from launch.features.preemption import Preemption
from launch.features.profiling import Profiling
from launch.features.progress import ProgressReport
from launch.features.reader_failure import ReaderFailure
from launch.features.sample import Sample
from launch.features.stall_watch import StallWatching
from launch.features.validation import Validation
from launch.features.window_audit import WindowAuditing

if TYPE_CHECKING:
    from launch.config import Config

FEATURES: tuple[type[Feature], ...] = (
    Checkpointing,
    Divergence,
    Downstream,
    Metrics,
    Preemption,
    Profiling,
    ProgressReport,
    ReaderFailure,
    Sample,
    StallWatching,
    Validation,
    WindowAuditing,
)


class FeatureOrderError(ValueError):
    """The features' declarations cannot be kept: a name no feature has, a name twice, or a cycle."""


def in_order(features: Iterable[type[Feature]]) -> tuple[type[Feature], ...]:
    """`features` in the order their `after`/`before` declarations give (a topological order; among
    features free to go either way, by name)."""
    by_name: dict[str, type[Feature]] = {}
    for feature in features:
        if not feature.name:
            raise FeatureOrderError(f"loop feature {feature.__name__} has no name (its class's `name`)")
        if feature.name in by_name:
            twice = f"{by_name[feature.name].__name__} and {feature.__name__}"
            raise FeatureOrderError(f"loop features {twice} are both named {feature.name!r}; give each its own")
        by_name[feature.name] = feature
    edges: dict[str, set[str]] = {name: set() for name in by_name}  # name -> the names that run after it
    for name, feature in by_name.items():
        for word, declared in (("after", feature.after), ("before", feature.before)):
            for other in declared:
                if other not in by_name:
                    raise FeatureOrderError(
                        f"loop feature {name!r} declares {word}={declared!r}, but no feature is named {other!r} "
                        f"(the features: {', '.join(sorted(by_name))})"
                    )
                first, then = (other, name) if word == "after" else (name, other)
                edges[first].add(then)
    waiting = {name: 0 for name in by_name}  # how many features must run before each
    for thens in edges.values():
        for then in thens:
            waiting[then] += 1
    ready = [name for name, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        name = heapq.heappop(ready)
        order.append(name)
        for then in edges[name]:
            waiting[then] -= 1
            if waiting[then] == 0:
                heapq.heappush(ready, then)
    if len(order) < len(by_name):
        raise FeatureOrderError(f"the loop features' after/before declarations form a cycle: {_cycle(edges, order)}")
    return tuple(by_name[name] for name in order)


def _cycle(edges: dict[str, set[str]], placed: list[str]) -> str:
    """One cycle among the features `in_order` could not place, as "a after b after ... a"."""
    left = [name for name in edges if name not in placed]
    runs_before = {name: sorted(first for first in left if name in edges[first]) for name in left}
    path, name = [], min(left)
    while name not in path:  # each feature left waits for another one left: walking back comes round
        path.append(name)
        name = runs_before[name][0]
    cycle = [*path[path.index(name) :], name]
    return " after ".join(cycle)


ORDER: tuple[type[Feature], ...] = in_order(FEATURES)


def build_features(cfg: Config, features: Iterable[type[Feature]] | None = None) -> list[Feature]:
    """The features `cfg` enables, in their order (made, not started). `features`: another table
    than `FEATURES` (ordered the same way)."""
    order = ORDER if features is None else in_order(features)
    return [feature(cfg) for feature in order if feature.enabled(cfg)]


def feature_options() -> list[type[Any]]:
    """The options class of each feature that owns a config section (`train.<section>`)."""
    return [f.Options for f in ORDER if f.Options is not None]
