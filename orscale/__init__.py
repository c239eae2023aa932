"""Optimizers of the OrScale stack, for the trainer and for any PyTorch model, and their distributed
execution (docs/algorithm.md, docs/library.md); the public API is what this module exports
(``__all__``)."""

from orscale.builder import build_optimizers
from orscale.diagnostics import collect_diagnostics, matrix_class
from orscale.distributed.ddp import ReplicatedMuonFamily
from orscale.distributed.fsdp import ShardedMuonFamily
from orscale.errors import OptimConfigError
from orscale.model_optimizer import Muon, MuonFamilyWithAdamW, MuonMoonlight, OrScale, OrScaleLM
from orscale.muon_family import MuonFamily
from orscale.newton_schulz import newton_schulz, newton_schulz_many
from orscale.optim_config import OptimConfig
from orscale.optimizer_spec import PLACEMENTS, OptimizerSpec
from orscale.registry import OPTIMIZER_NAMES, OPTIMIZERS, SCHEDULES, check_schedule, scheduled_lr
from orscale.routing import hidden_matrices
from orscale.schedule import lr_at, set_lr
from orscale.variants import VARIANTS, Variant

__all__ = [
    "OPTIMIZERS",
    "OPTIMIZER_NAMES",
    "PLACEMENTS",
    "SCHEDULES",
    "VARIANTS",
    "Muon",
    "MuonFamily",
    "MuonFamilyWithAdamW",
    "MuonMoonlight",
    "OptimConfig",
    "OptimConfigError",
    "OptimizerSpec",
    "OrScale",
    "OrScaleLM",
    "ReplicatedMuonFamily",
    "ShardedMuonFamily",
    "Variant",
    "build_optimizers",
    "collect_diagnostics",
    "check_schedule",
    "hidden_matrices",
    "lr_at",
    "scheduled_lr",
    "matrix_class",
    "newton_schulz",
    "newton_schulz_many",
    "set_lr",
]
