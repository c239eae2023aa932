"""What `launch.sweep` writes and the report reads back, written once: a run's *point* (its two peak
LRs), the run directory names of a sweep, the best-point and grid-edge rule of an LR search, and the
sweep plan (`RUNS_DIR/sweep_plan.json`).

A point is (optim.lr, the AdamW group's peak LR), the second the value itself: equal to the first
when optim.adamw_lr is unset (the *shared* protocol). A point whose two LRs are equal runs with
optim.adamw_lr unset and is named without `-alr`: the tied point and "unset" are one cell.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from records.read import finite

PLAN_FILE = "sweep_plan.json"
Point = tuple[float, float]  # (optim.lr, optim.adamw_lr or, unset, optim.lr)
K = TypeVar("K")
_RUN_NAME = re.compile(r"^lr([0-9.e+-]+)(?:-alr([0-9.e+-]+))?-seed(-?\d+)$")


def same(a: float, b: float) -> bool:
    """One LR: run directory names keep 6 significant digits, the planner rounds to 4."""
    return math.isclose(a, b, rel_tol=1e-6)


def point(lr: float, adamw_lr: float | None = None) -> Point:
    """The point of optim.lr and optim.adamw_lr (None: unset, the tied point)."""
    lr = float(lr)
    return (lr, lr) if adamw_lr is None or same(float(adamw_lr), lr) else (lr, float(adamw_lr))


def tied(p: Point) -> bool:
    return same(p[1], p[0])


def adamw_override(p: Point) -> float | None:
    """The optim.adamw_lr a point runs with: unset (None) when tied."""
    return None if tied(p) else p[1]


def run_name(p: Point, seed: int) -> str:
    """A sweep cell's directory: lr<lr>-seed<seed>, or lr<lr>-alr<adamw_lr>-seed<seed>."""
    alr = adamw_override(p)
    return f"lr{p[0]:.6g}" + ("" if alr is None else f"-alr{alr:.6g}") + f"-seed{seed}"


def parse_run_name(name: str) -> tuple[Point, int] | None:
    """(point, seed) of a directory named by `run_name`, else None."""
    m = _RUN_NAME.match(name)
    return None if m is None else (point(float(m[1]), float(m[2]) if m[2] else None), int(m[3]))


def best(losses: Mapping[K, float | None]) -> K | None:
    """The key with the lowest loss: a non-finite one (a diverged run) counts as the worst, ties go
    to the lower key (the lower LR). The planner's rule, and the report's."""
    return min(losses, key=lambda k: (not finite(losses[k]), losses[k] if finite(losses[k]) else 0.0, k), default=None)


def edge(line: Sequence[K], at: K) -> str | None:
    """ "low" or "high" where `at` is an end of a line (ascending) of two or more points, else None."""
    if len(line) < 2:
        return None
    return "low" if at == line[0] else "high" if at == line[-1] else None


@dataclass
class GroupPlan:
    """One (scale, optimizer) of the plan: the LR search's points on the search seed and its
    outcome, or the group whose best point it takes (`lr_from` a scale, `lr_from_optim` an optimizer)."""

    lrs: list[float] = field(default_factory=list)  # the LRs tried with adamw_lr unset, ascending
    best: Point | None = None  # decided once every search run finished
    at_edge: bool = False  # the best point is still at an edge of a line (max_extra reached)
    note: str = ""
    shared_lr: float | None = None  # the best LR with adamw_lr unset, when scored on its own
    points: list[Point] = field(default_factory=list)  # every point of the search seed, in search order
    lr_from: str | None = None
    lr_from_optim: str | None = None

    @property
    def best_lr(self) -> float | None:
        return None if self.best is None else self.best[0]

    @property
    def best_adamw_lr(self) -> float | None:
        """The plan file's field: None when the best point is tied (adamw_lr unset)."""
        return None if self.best is None else adamw_override(self.best)

    def tried(self) -> list[Point]:
        return self.points or [point(lr) for lr in self.lrs]

    def to_json(self) -> dict[str, Any]:
        return {
            "lrs": self.lrs,
            "best_lr": self.best_lr,
            "best_adamw_lr": self.best_adamw_lr,
            "shared_lr": self.shared_lr,
            "points": [[p[0], adamw_override(p)] for p in self.points],
            "at_edge": self.at_edge,
            "note": self.note,
            "lr_from": self.lr_from,
            "lr_from_optim": self.lr_from_optim,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GroupPlan:
        lr = d.get("best_lr")
        return cls(
            lrs=[float(x) for x in d.get("lrs") or []],
            best=None if lr is None else point(lr, d.get("best_adamw_lr")),
            at_edge=bool(d.get("at_edge")),
            note=str(d.get("note") or ""),
            shared_lr=None if d.get("shared_lr") is None else float(d["shared_lr"]),
            points=[point(p[0], p[1]) for p in d.get("points") or []],
            lr_from=d.get("lr_from"),
            lr_from_optim=d.get("lr_from_optim"),
        )


@dataclass
class SweepPlan:
    """sweep_plan.json: the search settings, the seeds and each group's plan."""

    groups: dict[str, GroupPlan]
    seeds: list[int]
    search: dict[str, Any] | None = None  # lr_search: seed, max_extra, factor, adamw_ratios, rounds, shared
    sweep: str = ""

    @property
    def search_seed(self) -> int | None:
        return None if self.search is None else int(self.search["seed"])

    def write(self, runs_dir: Path) -> None:
        """Atomically: a reader never sees half a plan."""
        runs_dir.mkdir(parents=True, exist_ok=True)
        doc = {
            "sweep": self.sweep,
            "lr_search": self.search,
            "seeds": self.seeds,
            "groups": {gid: gp.to_json() for gid, gp in self.groups.items()},
        }
        tmp = runs_dir / (PLAN_FILE + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(runs_dir / PLAN_FILE)

    @classmethod
    def read(cls, runs_dir: Path) -> SweepPlan | None:
        """The plan, or None when absent or unreadable."""
        try:
            doc = json.loads((Path(runs_dir) / PLAN_FILE).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get("groups"), dict):
            return None
        search = doc.get("lr_search") if isinstance(doc.get("lr_search"), dict) else None
        groups = {str(k): GroupPlan.from_json(v or {}) for k, v in doc["groups"].items()}
        return cls(groups, [int(s) for s in doc.get("seeds") or []], search, str(doc.get("sweep") or ""))
