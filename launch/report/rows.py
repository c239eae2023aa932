"""Runs grouped for the report: a *row* is one setting (same model, context, tokens per step, steps
and every other setting that changes the result); within a row, a *group* per optimizer holds one
cell per LR, whose runs are the seeds. Parameter counts and shapes come from the logs, else from
the model config. The paper's published losses are data (paper_results.json), shown beside ours."""

from __future__ import annotations

import ast
import hashlib
import json
import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from launch.nested import load_yaml, pop_dotted
from launch.run.records import RunRecord, finite

ROOT = Path(__file__).resolve().parents[2]
PAPER_SCALES = ("125m", "399m", "545m", "1.1b")
# SPEC §4: the paper's published final validation losses (one seed each), kept as data beside this
# module. Shown beside ours, never mixed in.
PAPER: dict[str, dict[str, float]] = json.loads((Path(__file__).with_name("paper_results.json")).read_text())[
    "final_val_loss"
]
REFS = ("adamw", "muon_moonlight")
# Settings that do not change what a run computes (or are the sweep's axes): not part of a row.
NOT_IN_ROW = (
    "run",
    "optim",
    "parallel",
    "train.seed",
    "train.log_every",
    "train.eval_every",
    "train.ckpt_every",
    "train.progress",
    "train.record_windows",
    "train.micro_batch_size",
    "data.val_batch_size",
    "data.encode_batch_docs",
)
SCALE_KEYS = ("model", "data.seq_len", "train.max_steps", "train.tokens_per_step")
AXES = ("lr", "adamw_lr")  # optim.* keys a sweep varies within one group


def _drop(cfg: dict, keys: tuple[str, ...]) -> dict:
    out = json.loads(json.dumps(cfg))
    for dotted in keys:
        pop_dotted(out, dotted)
    return out


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:6]


def scale_label(run: RunRecord) -> str:
    parts = [
        f"{k}{run.cfg(f'model.{key}')}"
        for k, key in (("L", "n_layer"), ("d", "d_model"), ("h", "n_head"), ("V", "vocab_size"))
        if run.cfg(f"model.{key}") is not None
    ]
    return str(run.cfg("model.preset", "?")) + (f"[{','.join(parts)}]" if parts else "")


Point = tuple[float, float]  # (optim.lr, the AdamW group's peak LR: optim.adamw_lr, = lr when unset)


def run_point(r: RunRecord) -> Point:
    lr = float(r.cfg("optim.lr"))
    adamw = r.cfg("optim.adamw_lr")
    return (lr, lr if adamw is None else float(adamw))


def same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6)


@dataclass
class LrCell:
    lr: float
    runs: list[RunRecord] = field(default_factory=list)
    adamw_lr: float | None = None  # None: = lr (the shared protocol's cells)

    def __post_init__(self) -> None:
        self.adamw_lr = self.lr if self.adamw_lr is None else self.adamw_lr

    @property
    def point(self) -> Point:
        return (self.lr, float(self.adamw_lr if self.adamw_lr is not None else self.lr))

    @property
    def tied(self) -> bool:
        return same(self.point[1], self.lr)

    @property
    def losses(self) -> dict[int, float]:
        return {int(r.cfg("train.seed", i)): r.final_val for i, r in enumerate(self.runs)}

    @property
    def mean(self) -> float:
        vals = list(self.losses.values())
        return float(np.mean(vals)) if vals and all(math.isfinite(v) for v in vals) else math.nan

    @property
    def std(self) -> float:
        vals = list(self.losses.values())
        return float(np.std(vals, ddof=1)) if len(vals) > 1 and math.isfinite(self.mean) else math.nan


@dataclass
class Group:  # one optimizer in one row
    optim: str
    cells: dict[Point, LrCell] = field(default_factory=dict)
    # Set from sweep_plan.json (launch/report/selection.py); the defaults are a sweep without a
    # plan: the LR is chosen and scored on the same seeds.
    select_seed: int | None = None  # the LR search's seed: the best LR is chosen on it alone
    eval_seeds: tuple[int, ...] | None = None  # the seeds scored at the best LR (None: all)
    fixed: Point | None = None  # lr_from: the point found at another scale (or for another optimizer)
    inherited_edge: str | None = None  # lr_from: the source's grid-edge flag
    status: str = "done"  # "done", or why the group has no final numbers yet (search running, ...)
    sweep_id: str | None = None  # "<scale>/<optimizer>" of the sweep's run directories

    @property
    def best(self) -> LrCell:
        if self.fixed is not None and self.fixed in self.cells:
            return self.cells[self.fixed]
        if self.select_seed is not None:
            on_seed = {pt: c.losses[self.select_seed] for pt, c in self.cells.items() if self.select_seed in c.losses}
            if on_seed:  # the planner's rule: lowest loss on the search seed, non-finite worst, ties lower LR
                pt = min(on_seed, key=lambda x: (not math.isfinite(on_seed[x]), on_seed[x], x))
                return self.cells[pt]
        # Lowest mean over seeds; a diverged seed makes the whole LR non-finite (never "best").
        return min(
            self.cells.values(),
            key=lambda c: (not math.isfinite(c.mean), c.mean if math.isfinite(c.mean) else 0.0, c.point),
        )

    @property
    def two_lrs(self) -> bool:
        """Whether any cell sets the AdamW group's LR apart from the matrices'."""
        return any(not c.tied for c in self.cells.values())

    def lr_line(self) -> list[LrCell]:
        """The cells along the matrix LR through the best point, ascending: those at the best's adamw_lr
        (a 2-D search's last LR line) when there are several, else those at its adamw_lr/lr ratio
        (the shared protocol's grid, where adamw_lr = lr throughout)."""
        b = self.best
        at_adamw = [c for c in self.cells.values() if same(c.point[1], b.point[1])]
        ratio = b.point[1] / b.lr
        on_ratio = [c for c in self.cells.values() if same(c.point[1] / c.lr, ratio)]
        return sorted(at_adamw if len(at_adamw) > 1 else on_ratio, key=lambda c: c.lr)

    def adamw_line(self) -> list[LrCell]:
        """The cells along adamw_lr at the best point's matrix LR, ascending."""
        return sorted((c for c in self.cells.values() if same(c.lr, self.best.lr)), key=lambda c: c.point[1])

    @property
    def score(self) -> LrCell:
        """The runs that give the group's numbers: the best LR's evaluation seeds (with a plan),
        else every seed at the best LR."""
        b = self.best
        if self.eval_seeds is None:
            return b
        return LrCell(b.lr, [r for r in b.runs if int(r.cfg("train.seed", -1)) in self.eval_seeds], b.adamw_lr)

    def selection_loss(self, point: Point) -> float:
        """The loss the point was chosen on: the search seed's, else the mean over seeds."""
        c = self.cells[point]
        if self.select_seed is not None and self.select_seed in c.losses:
            return c.losses[self.select_seed]
        return c.mean

    @property
    def edge(self) -> str | None:
        """Where the best point sits at an end of a line searched through it ("highest LR", "lowest
        AdamW-group LR"), or None when it is interior along every line with two or more points."""
        if self.inherited_edge is not None:
            return self.inherited_edge
        b = self.best
        if not math.isfinite(self.selection_loss(b.point)):
            return None
        ends = []
        for what, line in (("LR", self.lr_line()), ("AdamW-group LR", self.adamw_line() if self.two_lrs else [])):
            if len(line) >= 2 and (b is line[0] or b is line[-1]):
                ends.append(f"{'lowest' if b is line[0] else 'highest'} {what}")
        return " and ".join(ends) or None


@dataclass
class Row:  # one setting: model, context, tokens per step, steps, everything else but optimizer/LR/seed
    label: str
    steps: int
    tokens_per_step: int
    seq_len: int
    family: str  # hash of the settings outside the scale keys: rows of one family form a scaling series
    groups: dict[str, Group] = field(default_factory=dict)
    paper_scale: str | None = None
    n_params: float | None = None  # non-embedding
    n_total: float | None = None
    n_layer: int | None = None
    d_model: int | None = None
    sweep_scale: str | None = None  # the sweep's scale label (first part of the run directories)
    # Other protocols' groups over this row's runs (launch/report/selection.py): "shared", "transfer".
    protocols: dict[str, dict[str, Group]] = field(default_factory=dict)

    @property
    def flops_per_token(self) -> float | None:
        """Training FLOPs per token as models.gpt.GPT.flops_per_token counts them: 6 × every
        parameter (the tied output layer is a matmul) + 12·L·d·T for attention's QKᵀ and AV."""
        if self.n_total is None or self.n_layer is None or self.d_model is None:
            return None
        return 6.0 * self.n_total + 12.0 * self.n_layer * self.d_model * self.seq_len

    @property
    def short(self) -> str:
        return self.sweep_scale or self.name

    @property
    def name(self) -> str:
        return f"{self.label} {self.steps}×{self.tokens_per_step}"

    @property
    def tokens(self) -> int:
        return self.steps * self.tokens_per_step


def _paper_setups() -> dict[str, dict]:
    out = {}
    for s in PAPER_SCALES:
        p = ROOT / "configs" / f"{s}.yaml"
        if p.is_file():
            out[s] = load_yaml(p.read_text())
    return out


def _paper_match(run: RunRecord, setups: dict[str, dict]) -> str | None:
    """The paper scale whose preset, steps, tokens per step and context this run has exactly."""
    s = run.cfg("model.preset")
    cfg = setups.get(s)
    if cfg is None or any(run.cfg(f"model.{k}") is not None for k in ("n_layer", "d_model", "n_head", "vocab_size")):
        return None
    same = all(
        run.cfg(k) == cfg.get(k.split(".")[0], {}).get(k.split(".")[1])
        for k in ("train.max_steps", "train.tokens_per_step", "data.seq_len")
    )
    return s if same else None


def _preset(run: RunRecord) -> Any:
    try:
        from models.presets import get_preset  # imports torch: only when the logs lack what we need

        return get_preset(
            str(run.cfg("model.preset")),
            **{k: run.cfg(f"model.{k}") for k in ("n_layer", "d_model", "n_head", "vocab_size", "center_mlp")},
        )
    except (ImportError, ValueError, TypeError):
        return None


def _params(run: RunRecord) -> tuple[float | None, float | None]:
    """(non-embedding, total) parameters: metrics, else run.log's setup, else from the model config."""
    lt = run.last_train or {}
    total = lt.get("params") if finite(lt.get("params")) else run.setup.get("params")
    nonemb = lt.get("non_embedding_params") if finite(lt.get("non_embedding_params")) else None
    if nonemb is None:
        nonemb = run.setup.get("non_embedding_params") if finite(run.setup.get("non_embedding_params")) else None
    if nonemb is None or total is None:
        cfg = _preset(run)
        if cfg is None:
            return nonemb, total
        from models.presets import param_counts

        counted = param_counts(cfg)
        total = counted[0] if total is None else total
        nonemb = counted[1] if nonemb is None else nonemb
    return nonemb, total


@cache
def _preset_shapes() -> dict[str, dict[str, int]]:
    """models/presets.py's PRESETS as {name: {n_layer, d_model, ...}}, read with ast: importing the
    module imports torch (seconds), and a report of preset-only runs needs just these integers."""
    try:
        tree = ast.parse((ROOT / "models" / "presets.py").read_text())
        for node in tree.body:
            target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
            if isinstance(target, ast.Name) and target.id == "PRESETS" and isinstance(node.value, ast.Dict):
                return {
                    ast.literal_eval(k): {kw.arg: ast.literal_eval(kw.value) for kw in v.keywords if kw.arg}
                    for k, v in zip(node.value.keys, node.value.values, strict=True)
                    if k is not None and isinstance(v, ast.Call)
                }
    except (OSError, SyntaxError, ValueError):
        pass
    return {}


def _shape(run: RunRecord) -> tuple[int | None, int | None]:
    """(n_layer, d_model): the config's overrides, else the preset's."""
    n_layer, d_model = run.cfg("model.n_layer"), run.cfg("model.d_model")
    if n_layer is None or d_model is None:
        known = _preset_shapes().get(str(run.cfg("model.preset")))
        cfg = known if known and "n_layer" in known and "d_model" in known else None
        if cfg is None:
            preset = _preset(run)
            cfg = None if preset is None else {"n_layer": preset.n_layer, "d_model": preset.d_model}
        if cfg is not None:
            n_layer, d_model = n_layer or cfg["n_layer"], d_model or cfg["d_model"]
    return n_layer, d_model


def _row_key(r: RunRecord) -> tuple:
    """What puts two runs in one row: scale, steps, tokens per step, context and the other settings."""
    return (
        scale_label(r),
        r.cfg("train.max_steps"),
        r.cfg("train.tokens_per_step"),
        r.cfg("data.seq_len"),
        _hash(_drop(r.config, NOT_IN_ROW)),
    )


def build_rows(runs: list[RunRecord], names: dict[Path, str] | None = None) -> list[Row]:
    """`names`: a group name for some runs (a sweep's optimizer label, e.g. a protocol's), instead
    of their optimizer's."""
    names = names or {}
    setups = _paper_setups()
    rows: dict[tuple, Row] = {}
    variants: dict[tuple, set] = {}
    finished = [r for r in runs if r.finished]
    keyed = [(_row_key(r), r) for r in finished]  # hashing a whole config: once per run
    for key, r in keyed:
        if r.path not in names:
            variants.setdefault((key, r.cfg("optim.name")), set()).add(_hash(_drop(r.config["optim"], AXES)))
    for key, r in keyed:
        if key not in rows:
            rows[key] = Row(
                label=key[0],
                steps=key[1],
                tokens_per_step=key[2],
                seq_len=key[3],
                family=_hash(_drop(r.config, NOT_IN_ROW + SCALE_KEYS)),
                paper_scale=_paper_match(r, setups),
            )
            rows[key].n_params, rows[key].n_total = _params(r)
            rows[key].n_layer, rows[key].d_model = _shape(r)
        name = names.get(r.path) or str(r.cfg("optim.name"))
        if r.path not in names and len(variants[(key, name)]) > 1:  # other optim.* settings: keep apart
            name += "#" + _hash(_drop(r.config["optim"], AXES))[:4]
        group = rows[key].groups.setdefault(name, Group(name))
        point = run_point(r)
        cell = group.cells.setdefault(point, LrCell(point[0], adamw_lr=point[1]))
        twin = next((o for o in cell.runs if o.cfg("train.seed") == r.cfg("train.seed")), None)
        if twin is not None:  # a copy of a run (same setting and seed) would count twice: keep it out
            r.problem = f"duplicate of {twin.path} (same setting, LR and seed): not counted"
            continue
        cell.runs.append(r)
    labels = {}
    for key, row in rows.items():  # one label for two rows that differ only in hidden settings: tag them
        labels.setdefault((row.label, row.steps, row.tokens_per_step, row.seq_len), []).append(key)
    for keys in labels.values():
        if len(keys) > 1:
            for k in keys:
                rows[k].label += f"#{k[4][:4]}"
    return sorted(rows.values(), key=lambda w: (w.family, w.n_params or 0, w.label, w.tokens))
