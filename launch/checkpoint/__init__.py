"""Checkpoints: the checkpointer of self-saving parts (`checkpointer`), inspection from outside a run
(`inspection`: find, check, load weights or a whole GPT), the manifest of sizes and checksums
(`manifest`), DCP read without unpickling code (`dcp_safe`), the DCP part of the PyTorch-native
engines (`dcp_state`), any backend's checkpoint read by parameter name (`portable`), a failed
write said in one line (`disk`) and what a save written in the background needs (`async_writer`)."""

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
