"""The `parallel:` section: how the model and optimizer are laid out over the ranks (the backend, the
data-parallel mesh, compilation, the Muon family's owner exchange), and the backends' own sub-sections
(`parallel.fsdp`: launch/backends/). Checks itself on construction with one-line `ConfigError`s;
`for_world` checks and resolves what depends on the world size."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from launch.train_config import OwnSections, at_least, require
from orscale.distributed.owners import DEFAULT_BUCKET_NUMEL, MODES

COMPILE: tuple[str, ...] = ("auto", "none", "blocks", "model")


@dataclass
class ParallelConfig(OwnSections):
    # none | ddp | fsdp | zero1 | zero2 (launch/backends/) | auto: none for one process, fsdp when
    # launched on several (resolved by the plan, so config.yaml records the backend that ran)
    backend: str = "auto"
    activation_checkpointing: bool = False
    # auto (blocks on CUDA, none on CPU) | none | blocks (each block, and the head with its loss) | model (whole)
    compile: str | bool = field(default="auto", metadata={"resume": "routine"})
    muon_mode: str = "owner"  # owner: NS once per matrix on one rank | replicate: everywhere (debug)
    # Collective timeouts, seconds: start-up (process groups, rank 0's validation set and resume
    # decision, the checkpoint load), then every collective from the first step on. A rank that stops
    # answering ends the run after comm_timeout_s instead of hanging it (launch/runtime/hangs.py).
    init_timeout_s: float = 1800.0
    comm_timeout_s: float = 600.0
    # HSDP (FSDP2 on a 2-D mesh): shard within groups of dp_shard ranks (a node), replicate across
    # dp_replicate of them; dp_shard -1: the rest of the world (resolved here, recorded in config.yaml).
    dp_replicate: int = 1
    dp_shard: int = -1
    # HSDP + Muon family: split the Newton–Schulz work across the replica groups too (1/R of the
    # FLOPs per rank for Q rows sent across "replicate"; docs/scaling.md says when it pays).
    muon_replica_split: bool = False
    muon_overlap: bool = True  # owner exchange: bucket k+1 in flight while bucket k's NS runs
    muon_bucket_numel: int = DEFAULT_BUCKET_NUMEL  # whole-matrix elements per exchange bucket
    sections: dict[str, Any] = field(default_factory=dict)  # the backends' own, by section name

    def __post_init__(self) -> None:
        # YAML booleans kept meaning what they meant: compile true = blocks, false = none.
        if isinstance(self.compile, bool):
            self.compile = "blocks" if self.compile else "none"
        require(self.compile in COMPILE, f"parallel.compile must be one of {', '.join(COMPILE)}, got {self.compile!r}")
        require(
            self.muon_mode in MODES, f"parallel.muon_mode must be one of {', '.join(MODES)}, got {self.muon_mode!r}"
        )
        for key in ("init_timeout_s", "comm_timeout_s"):
            require(getattr(self, key) > 0, f"parallel.{key} must be > 0 seconds, got {getattr(self, key)}")
        self._check_shape()

    def _check_shape(self) -> None:
        """What any world size checks of the mesh settings (`for_world` checks the rest)."""
        at_least("parallel", self, dp_replicate=(1, "1: no replication"))
        require(
            self.dp_shard == -1 or self.dp_shard >= 1,
            f"parallel.dp_shard must be >= 1, or -1 for the rest of the world, got {self.dp_shard}",
        )
        at_least("parallel", self, muon_bucket_numel=1)

    def for_world(self, world: int, backend: str) -> ParallelConfig:
        """This section as it runs on `world` processes with `backend` (the plan's: auto resolved, its
        layout checked), dp_shard -1 resolved to the rest of the world; one-line ConfigError for a mesh
        that does not fit: dp_replicate × dp_shard = the world size."""
        r = self.dp_replicate
        self._check_shape()
        require(
            world % r == 0,
            f"parallel.dp_replicate ({r}) must divide the world size ({world}); use a divisor of {world}",
        )
        shard = world // r if self.dp_shard == -1 else self.dp_shard
        fix = f"parallel.dp_replicate={world // shard} or " if world % shard == 0 else ""
        require(
            r * shard == world,
            f"parallel.dp_replicate ({r}) x parallel.dp_shard ({shard}) must equal the world size "
            f"({world}); set {fix}leave parallel.dp_shard unset (the rest of the world)",
        )
        require(
            not self.muon_replica_split or (r > 1 and self.muon_mode == "owner"),
            "parallel.muon_replica_split=true splits Newton–Schulz owners across the replica groups: it needs "
            f"parallel.dp_replicate > 1 (got {r}) and parallel.muon_mode=owner (got {self.muon_mode})",
        )
        return dataclasses.replace(self, backend=backend, dp_shard=shard)
