"""The finished runs as one table (a DataFrame, a line per run), grouped for the report: a *row* is
one setting (same model, context, tokens per step, steps and every other setting that changes the
result); within a row, a *group* per optimizer holds its runs, one *cell* per point (the two peak
LRs), whose runs are the seeds. A group's best point, score and grid edge are the LR search's rule
(records/points.py). Parameter counts and the model's shape come from the run's own records
(metrics.jsonl, run.log's setup line, config.yaml); the paper's published losses and setups are data
(paper_results.json), shown beside ours."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from records.points import Point, best, edge, point, same, tied
from records.read import RunRecord, finite

_PAPER = json.loads(Path(__file__).with_name("paper_results.json").read_text())
PAPER: dict[str, dict[str, float]] = _PAPER["final_val_loss"]  # docs/algorithm.md, one seed each
PAPER_SETUP: dict[str, dict[str, int]] = _PAPER["setup"]
REFS = ("adamw", "muon_moonlight")
# Settings that do not change what a run computes (or are the sweep's axes): not part of a row.
NOT_IN_ROW = tuple(
    "run optim parallel train.seed train.log_every train.eval_every train.ckpt_every train.ckpt_at train.progress "
    "train.record_windows train.micro_batch_size train.profile train.memory_snapshot "
    "data.val_batch_size data.encode_batch_docs".split()
)
SCALE_KEYS = ("model", "data.seq_len", "train.max_steps", "train.tokens_per_step")
AXES = ("lr", "adamw_lr")  # optim.* keys a sweep varies within one group
ROW_KEY = ["label", "steps", "tokens_per_step", "seq_len", "hidden", "schedule"]
SHAPE = ("n_layer", "d_model", "n_head", "vocab_size")


def _hash(cfg: Any, drop: tuple[str, ...] = ()) -> str:
    """Six hex digits of a config without the dotted keys `drop`."""
    tree = json.loads(json.dumps(cfg))
    for dotted in drop:
        *parents, last = dotted.split(".")
        node = tree
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return hashlib.sha256(json.dumps(tree, sort_keys=True, default=str).encode()).hexdigest()[:6]


def schedule_of(run: RunRecord) -> str:
    """How a run's budget was made: "cosine" (its own run), or "wsd" (warmup-stable-decay), "wsd
    branch" when it cooled down from another run's checkpoint (launch.branch: run.init_from). Part
    of a row: runs of one budget under two protocols are two rows, in two scaling series."""
    if run.cfg("optim.schedule", "cosine") == "cosine":
        return "cosine"
    return "wsd branch" if run.cfg("run.init_from") else "wsd"


def scale_label(run: RunRecord) -> str:
    parts = [f"{k}{v}" for k, key in zip("LdhV", SHAPE, strict=True) if (v := run.cfg(f"model.{key}")) is not None]
    return str(run.cfg("model.preset", "?")) + (f"[{','.join(parts)}]" if parts else "")


def _params(run: RunRecord) -> tuple[float | None, float | None]:
    """(non-embedding, total) parameters: the last training line's, else run.log's setup line's."""
    sources = (run.last_train or {}, run.setup)
    n, total = (
        next((src[k] for src in sources if finite(src.get(k))), None) for k in ("non_embedding_params", "params")
    )
    return n, total


def _shape(run: RunRecord) -> tuple[int | None, int | None]:
    """(n_layer, d_model): config.yaml's, else the resolved model on run.log's setup line."""
    logged: dict = run.setup["model"] if isinstance(run.setup.get("model"), dict) else {}
    return run.cfg("model.n_layer") or logged.get("n_layer"), run.cfg("model.d_model") or logged.get("d_model")


def _paper_match(run: RunRecord) -> str | None:
    """The paper scale whose preset, steps, tokens per step and context this run has exactly."""
    scale = str(run.cfg("model.preset"))
    setup = PAPER_SETUP.get(scale)
    if setup is None or any(run.cfg(f"model.{k}") is not None for k in SHAPE):
        return None
    return scale if all(run.cfg(k) == v for k, v in setup.items()) else None


@dataclass(frozen=True)
class Score:
    """The runs at one point that give a group's numbers (seed -> final loss, NaN: diverged)."""

    point: Point
    losses: dict[int, float]
    runs: list[RunRecord]

    @property
    def mean(self) -> float:
        vals = list(self.losses.values())
        return float(np.mean(vals)) if vals and all(math.isfinite(v) for v in vals) else math.nan

    @property
    def std(self) -> float:
        vals = list(self.losses.values())
        return float(np.std(vals, ddof=1)) if len(vals) > 1 and math.isfinite(self.mean) else math.nan


@dataclass(eq=False)
class Group:
    """One optimizer in one row: `table` holds its runs (lr, adamw_lr, seed, loss, run). The
    selection fields come from the sweep plan (report/selection.py) and are set on construction;
    their defaults are a sweep without a plan: the LR is chosen and scored on the same seeds."""

    name: str
    table: pd.DataFrame
    select_seed: int | None = None  # the LR search's seed: the best point is chosen on it alone
    eval_seeds: tuple[int, ...] | None = None  # the seeds scored at the best point (None: all)
    fixed: Point | None = None  # lr_from: the point found at another scale (or for another optimizer)
    inherited_edge: str | None = None  # lr_from: the source's grid-edge flag
    status: str = "done"  # "done", or why the group has no final numbers yet (search running, ...)
    sweep_id: str | None = None  # "<scale>/<optimizer>" of the sweep's run directories

    @cached_property
    def cells(self) -> pd.DataFrame:
        """Per point (first-seen order): mean and std over seeds (NaN when a seed diverged), runs,
        whether the search seed ran there, and the loss the point is chosen on (the search seed's,
        else the mean)."""
        t = self.table.assign(bad=~np.isfinite(self.table["loss"]), on_seed=self.table["seed"] == self.select_seed)
        agg = {"mean": ("loss", "mean"), "std": ("loss", "std"), "n": ("loss", "size")}
        out = t.groupby(["lr", "adamw_lr"], sort=False).agg(**agg, bad=("bad", "any"), on_seed=("on_seed", "any"))
        out.loc[out["bad"], ["mean", "std"]] = math.nan
        out["sel"] = out["mean"]
        seed_loss = t[t["on_seed"]].set_index(["lr", "adamw_lr"])["loss"]
        out.loc[seed_loss.index, "sel"] = seed_loss
        return out

    @property
    def points(self) -> list[Point]:
        return list(self.cells.index)

    @cached_property
    def best(self) -> Point | None:
        """The fixed point, else the lowest loss on the search seed, else the lowest mean."""
        if self.fixed is not None and self.fixed in self.cells.index:
            return self.fixed
        pool = self.cells[self.cells["on_seed"]] if self.cells["on_seed"].any() else self.cells
        return best(dict(zip(pool.index, pool["sel"], strict=True)))

    def runs_at(self, p: Point | None) -> pd.DataFrame:
        t = self.table
        return t.iloc[:0] if p is None else t[(t["lr"] == p[0]) & (t["adamw_lr"] == p[1])]

    @cached_property
    def score(self) -> Score:
        """The best point's evaluation seeds (with a plan), else every seed at the best point."""
        at = self.runs_at(self.best)
        if self.eval_seeds is not None:
            at = at[at["seed"].isin(self.eval_seeds)]
        losses = {int(s): float(v) for s, v in zip(at["seed"], at["loss"], strict=True)}
        return Score(self.best or (math.nan, math.nan), losses, list(at["run"]))

    def selection_loss(self, p: Point) -> float:
        return float(self.cells.loc[p, "sel"])

    @property
    def two_lrs(self) -> bool:
        """Whether any point sets the AdamW group's LR apart from the matrices'."""
        return not all(tied(p) for p in self.points)

    def lr_line(self) -> list[Point]:
        """The points along the matrix LR through the best point, ascending: those at its adamw_lr (a
        2-D search's last LR line) when there are several, else those at its adamw_lr/lr ratio
        (the shared protocol's grid, where adamw_lr = lr throughout)."""
        if self.best is None:
            return []
        b = self.best
        at_adamw = [p for p in self.points if same(p[1], b[1])]
        on_ratio = [p for p in self.points if same(p[1] / p[0], b[1] / b[0])]
        return sorted(at_adamw if len(at_adamw) > 1 else on_ratio)

    def adamw_line(self) -> list[Point]:
        """The points along adamw_lr at the best point's matrix LR, ascending."""
        return sorted((p for p in self.points if self.best and same(p[0], self.best[0])), key=lambda p: p[1])

    @cached_property
    def edge(self) -> str | None:
        """Where the best point sits at an end of a line searched through it ("highest LR", "lowest
        AdamW-group LR"), or None when it is interior along every line with two or more points."""
        if self.inherited_edge is not None:
            return self.inherited_edge
        if self.best is None or not math.isfinite(self.selection_loss(self.best)):
            return None
        lines = (("LR", self.lr_line()), ("AdamW-group LR", self.adamw_line() if self.two_lrs else []))
        ends = [
            f"{'lowest' if e == 'low' else 'highest'} {what}" for what, line in lines if (e := edge(line, self.best))
        ]
        return " and ".join(ends) or None


def usable(g: Group | None) -> bool:
    """A group whose numbers count: its plan is done and its score is finite."""
    return g is not None and g.status == "done" and bool(g.score.runs) and math.isfinite(g.score.mean)


@dataclass(eq=False)
class Row:  # one setting: model, context, tokens per step, steps, everything else but optimizer/LR/seed
    label: str
    steps: int
    tokens_per_step: int
    seq_len: int
    family: str  # hash of the settings outside the scale keys: rows of one family form a scaling series
    hidden: str  # hash of every setting in the row: tags two rows that share a label
    groups: dict[str, Group] = field(default_factory=dict)
    paper_scale: str | None = None
    n_params: float | None = None  # non-embedding
    n_total: float | None = None
    n_layer: int | None = None
    d_model: int | None = None
    sweep_scale: str | None = None  # the sweep's scale label (first part of the run directories)
    schedule: str = "cosine"  # the protocol that made this budget: cosine (its own runs) | wsd (schedule_of)
    # Other protocols' groups over this row's runs (report/selection.py): "shared", "transfer".
    protocols: dict[str, dict[str, Group]] = field(default_factory=dict)

    @property
    def short(self) -> str:
        made = "" if self.schedule == "cosine" else f" ({self.schedule})"
        return f"{self.sweep_scale}{made}" if self.sweep_scale else self.name

    @property
    def name(self) -> str:
        made = "" if self.schedule == "cosine" else f" ({self.schedule})"
        return f"{self.label} {self.steps}×{self.tokens_per_step}{made}"

    @property
    def title(self) -> str:
        """The row's name with its model and budget, e.g. "s2: L3 d96, 192 steps × 1,024 tokens"."""
        return f"{self.short}: L{self.n_layer} d{self.d_model}, {self.steps} steps × {self.tokens_per_step:,} tokens"

    @property
    def tokens(self) -> int:
        return self.steps * self.tokens_per_step


def runs_table(runs: list[RunRecord], names: dict[Path, str]) -> pd.DataFrame:
    """A line per finished run: its row key, group, point, seed and final loss. `names`: a group
    name for some runs (a sweep's optimizer label, e.g. a protocol's) instead of their optimizer's.
    A copy of a run (same setting, group, point and seed) would count twice: it is marked and left out."""
    lines = []
    for r in (r for r in runs if r.finished):
        p = point(r.cfg("optim.lr"), r.cfg("optim.adamw_lr"))
        lines.append(
            {
                "label": scale_label(r),
                "steps": r.cfg("train.max_steps"),
                "tokens_per_step": r.cfg("train.tokens_per_step"),
                "seq_len": r.cfg("data.seq_len"),
                "hidden": _hash(r.config, NOT_IN_ROW),
                # a branch and its parent are one protocol's budgets: one scaling series (family)
                "schedule": schedule_of(r).removesuffix(" branch"),
                "optim": str(r.cfg("optim.name")),
                "named": names.get(r.path),
                "variant": _hash(r.cfg("optim", {}), AXES),
                "lr": p[0],
                "adamw_lr": p[1],
                "seed": int(r.cfg("train.seed", 0)),
                "loss": r.final_val,
                "run": r,
            }
        )
    t = pd.DataFrame(lines, columns=[*ROW_KEY, "optim", "named", "variant", "lr", "adamw_lr", "seed", "loss", "run"])
    own = t["named"].isna()
    # Other optim.* settings under one optimizer name keep their runs apart: name#hash.
    kinds = t[own].groupby([*ROW_KEY, "optim"], dropna=False)["variant"].transform("nunique")
    t["group"] = t["named"].where(~own, t["optim"])
    split = kinds[kinds > 1].index
    t.loc[split, "group"] = t.loc[split, "optim"] + "#" + t.loc[split, "variant"].str[:4]
    cell = [*ROW_KEY, "group", "lr", "adamw_lr", "seed"]
    first = t.groupby(cell, dropna=False)["run"].transform("first")
    dup = t.duplicated(cell)
    for r, twin in zip(t.loc[dup, "run"], first[dup], strict=True):
        r.problem = f"duplicate of {twin.path} (same setting, LR and seed): not counted"
    return t[~dup]


def build_rows(runs: list[RunRecord], names: dict[Path, str] | None = None) -> list[Row]:
    t = runs_table(runs, names or {})
    rows: list[Row] = []
    for (label, steps, tps, seq_len, hidden, schedule), frame in t.groupby(ROW_KEY, sort=False, dropna=False):
        first: RunRecord = frame["run"].iloc[0]
        family = _hash(first.config, NOT_IN_ROW + SCALE_KEYS) + ("" if schedule == "cosine" else f"-{schedule}")
        row = Row(str(label), int(steps), int(tps), int(seq_len), family, hidden, schedule=str(schedule))
        row.paper_scale = _paper_match(first)
        row.n_params, row.n_total = _params(first)
        row.n_layer, row.d_model = _shape(first)
        row.groups = {str(name): Group(str(name), g) for name, g in frame.groupby("group", sort=False)}
        rows.append(row)
    labels: dict[tuple, list[Row]] = {}
    for row in rows:  # one label for two rows that differ only in hidden settings: tag them
        labels.setdefault((row.label, row.steps, row.tokens_per_step, row.seq_len, row.schedule), []).append(row)
    for same_label in labels.values():
        for row in same_label if len(same_label) > 1 else []:
            row.label += f"#{row.hidden[:4]}"
    return sorted(rows, key=lambda w: (w.family, w.n_params or 0, w.label, w.tokens))
