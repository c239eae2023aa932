"""The training loop's features, one class per file, built from the config by `registry.FEATURES` and
called by `launch.trainer.Trainer` through the hooks of `base.Feature`."""

from launch.features.base import Feature
from launch.features.registry import FEATURES, build_features

__all__ = ["FEATURES", "Feature", "build_features"]
