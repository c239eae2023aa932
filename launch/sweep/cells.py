"""The cells of a sweep: one run directory each (`Cell`), the (scale, optimizer) groups that make them
(`CellGroup`) and the whole sweep (`Sweep`), as `launch.sweep.spec` reads them from the sweep file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data.paths import PROJECT_ROOT as ROOT
from launch.nested import dotted_get, load_yaml
from launch.sweep.search_spec import LrSearch
from records.points import Point, adamw_override, point, run_name


@dataclass
class Cell:
    scale: str
    optim: str  # label (directory name); usually the optimizer name
    lr: float
    seed: int
    base: str  # config path as written in the command (relative to ROOT when inside it)
    overrides: list[str]  # every dotted override, axes last
    run_dir: Path
    adamw_lr: float | None = None  # None: optim.adamw_lr unset (= lr, the shared protocol)

    @property
    def id(self) -> str:
        return f"{self.scale}/{self.optim}/{self.run_dir.name}"

    def value(self, dotted: str, default: Any = None) -> Any:
        """The resolved value of a key: the last override, else the base YAML, else `default`."""
        for item in reversed(self.overrides):
            key, _, raw = item.partition("=")
            if key == dotted:
                return load_yaml(raw)
        return dotted_get(_read_yaml(ROOT / self.base), dotted, default)  # an absolute base stays as it is


@dataclass
class CellGroup:
    """One (scale, optimizer) of a sweep: its LR grid, or the scale whose best LR it takes."""

    scale: str
    optim: str  # label
    base: str
    overrides: list[str]  # common, scale and optimizer overrides plus optim.name (no axes)
    lrs: list[float]
    lr_from: str | None  # a scale label
    runs_dir: Path
    lr_from_optim: str | None = None  # an optimizer label: its best LRs at this scale, no search
    branch_of: str | None = None  # a scale label: cooldown branches of its (wsd) cells (launch/sweep/branches.py)

    @property
    def id(self) -> str:
        return f"{self.scale}/{self.optim}"

    @property
    def searched(self) -> bool:
        return self.lr_from is None and self.lr_from_optim is None and self.branch_of is None

    def cell(self, p: Point, seed: int) -> Cell:
        lr, adamw_lr = p[0], adamw_override(p)
        run_dir = self.runs_dir / self.scale / self.optim / run_name(p, seed)
        axes = [f"optim.lr={lr!r}", *([f"optim.adamw_lr={adamw_lr!r}"] if adamw_lr is not None else [])]
        axes += [f"train.seed={seed}", f"run.dir={run_dir}"]
        return Cell(self.scale, self.optim, lr, seed, self.base, [*self.overrides, *axes], run_dir, adamw_lr)


@dataclass
class Sweep:
    path: Path
    runs_dir: Path
    groups: list[CellGroup] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    search: LrSearch | None = None
    slurm: dict = field(default_factory=dict)

    @property
    def cells(self) -> list[Cell]:
        """The cells known before anything runs: every LR x seed (no search), or the search grids."""
        if self.search is None:
            return [g.cell(point(lr), seed) for g in self.groups for lr in g.lrs for seed in self.seeds]
        seed = self.search.seed
        return [g.cell(point(lr), seed) for g in self.groups if g.searched for lr in g.lrs]


_yaml_cache: dict[Path, Any] = {}


def _read_yaml(path: Path) -> Any:
    if path not in _yaml_cache:
        _yaml_cache[path] = load_yaml(path.read_text()) if path.is_file() else {}
    return _yaml_cache[path]
