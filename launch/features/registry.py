"""The loop features, one line each: (name, whether a run's config enables it, its class). Their order
is the order of their hooks' effects within a step (launch/features/base.py): the divergence check
before the progress line it would stop, profiling's step before the metrics line, validation before the
downstream tasks, the checkpoint last."""

from __future__ import annotations

from collections.abc import Callable

from launch.config import Config
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

ALWAYS: Callable[[Config], bool] = lambda cfg: True  # noqa: E731

FEATURES: tuple[tuple[str, Callable[[Config], bool], type[Feature]], ...] = (
    ("stall_watch", lambda cfg: cfg.train.stall_dump_s > 0, StallWatching),
    ("preemption", ALWAYS, Preemption),
    ("divergence", ALWAYS, Divergence),
    ("progress", ALWAYS, ProgressReport),
    ("reader_failure", ALWAYS, ReaderFailure),
    ("window_audit", lambda cfg: cfg.train.record_windows, WindowAuditing),
    ("profiling", ALWAYS, Profiling),
    ("metrics", ALWAYS, Metrics),
    ("validation", ALWAYS, Validation),
    ("downstream", lambda cfg: bool(cfg.eval.tasks), Downstream),
    ("sample", lambda cfg: cfg.train.sample.every > 0, Sample),
    ("checkpointing", ALWAYS, Checkpointing),
)


def build_features(cfg: Config) -> list[Feature]:
    """The features `cfg` enables, in the registry's order (made, not started)."""
    return [feature(cfg) for _, enabled, feature in FEATURES if enabled(cfg)]
