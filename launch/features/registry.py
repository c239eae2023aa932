"""The loop features, one line each: (name, class); a feature says itself whether a run has it
(`Feature.enabled`) and which config section it owns (`Feature.section`). Their order is the order of
their hooks' effects within a step (launch/features/base.py): the divergence check before the progress
line it would stop, profiling's step before the metrics line, validation before the downstream tasks,
the checkpoint last."""

from __future__ import annotations

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

FEATURES: tuple[tuple[str, type[Feature]], ...] = (
    ("stall_watch", StallWatching),
    ("preemption", Preemption),
    ("divergence", Divergence),
    ("progress", ProgressReport),
    ("reader_failure", ReaderFailure),
    ("window_audit", WindowAuditing),
    ("profiling", Profiling),
    ("metrics", Metrics),
    ("validation", Validation),
    ("downstream", Downstream),
    ("sample", Sample),
    ("checkpointing", Checkpointing),
)


def build_features(cfg: Config) -> list[Feature]:
    """The features `cfg` enables, in the registry's order (made, not started)."""
    return [feature(cfg) for _, feature in FEATURES if feature.enabled(cfg)]


def feature_options() -> list[type[Any]]:
    """The options class of each feature that owns a config section (`train.<section>`)."""
    return [f.Options for _, f in FEATURES if f.Options is not None]
