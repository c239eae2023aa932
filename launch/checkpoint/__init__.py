"""Checkpoints: written in self-saving parts by a run, read back from inside or outside one
(docs/running.md)."""

from launch.checkpoint.checkpointer import (
    FORMAT,
    META,
    Checkpointer,
    RankPart,
    SaveError,
    ShardedPart,
    checkpoint_dirs,
    is_complete,
    latest_checkpoint,
    read_meta,
    step_dir,
)
from launch.checkpoint.inspection import (
    check_loadable,
    find_checkpoint,
    load_gpt,
    load_model_weights,
    newest_intact_checkpoint,
)

__all__ = [
    "SaveError",
    "checkpoint_dirs",
    "FORMAT",
    "META",
    "Checkpointer",
    "RankPart",
    "ShardedPart",
    "check_loadable",
    "find_checkpoint",
    "is_complete",
    "latest_checkpoint",
    "load_gpt",
    "load_model_weights",
    "newest_intact_checkpoint",
    "read_meta",
    "step_dir",
]
