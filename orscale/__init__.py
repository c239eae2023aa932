"""Optimizers of the OrScale stack: Newton–Schulz, the Muon family (Muon, Muon+Moonlight,
OrScale, OrScale-LM and the SPEC §3 design-space variants), parameter routing, the LR schedule
and diagnostics, and their sharded execution (FSDP2 / DDP)."""

from orscale.diagnostics import collect_diagnostics, matrix_class
from orscale.muon_family import MuonFamily
from orscale.newton_schulz import newton_schulz, newton_schulz_many
from orscale.routing import OPTIMIZER_NAMES, build_optimizers, check_optim_config
from orscale.schedule import lr_at, set_lr
from orscale.sharded import ReplicatedMuonFamily, ShardedMuonFamily
from orscale.variants import PRESETS, Variant

__all__ = [
    "OPTIMIZER_NAMES",
    "PRESETS",
    "MuonFamily",
    "ReplicatedMuonFamily",
    "ShardedMuonFamily",
    "Variant",
    "build_optimizers",
    "check_optim_config",
    "collect_diagnostics",
    "lr_at",
    "matrix_class",
    "newton_schulz",
    "newton_schulz_many",
    "set_lr",
]
