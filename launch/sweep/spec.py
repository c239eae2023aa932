"""The sweep file: scales x optimizers x learning rates x seeds -> one cell (run directory) each.

    base: configs/tiny.yaml            # config every cell starts from (a scale may name its own)
    runs_dir: runs/sweeps/mini         # cells go to runs_dir/<scale>/<optimizer>/lr<lr>-seed<seed>
    overrides: {train.max_steps: 40}   # dotted overrides common to every cell
    scales:                            # a preset name, or a dict with a label and dotted overrides
      - 125m
      - {label: l1d64, model.n_layer: 1, model.d_model: 64, base: configs/tiny.yaml, lrs: [3e-3]}
    optimizers:                        # name -> null (default lrs) | [lrs] | {lrs, label, overrides}
      adamw: [1e-3, 3e-3]
      orscale_lm: null
    lrs: [1e-3, 3e-3]                  # default grid
    seeds: [0, 1]
    lr_search: {seed: 0, max_extra: 2} # optional: tune the LR on one seed, then run `seeds` at the best
      # adamw_lr: {ratios: [2, 4, 8], rounds: 2}   # also tune optim.adamw_lr (a 2-D coordinate search)
      # shared: true                              # also score the tied optimum (adamw_lr = lr)
    slurm: {gpus_per_node: 8, nodes: 1, time: "48:00:00", partition: gpu, extra: ["--qos=high"]}

A cell's learning rates: the scale's `lrs` for that optimizer (a scale's `lrs` may be a list, or a
mapping optimizer -> list), else the optimizer's own list, else the scale's plain list, else the
default grid.

Without `lr_search` every LR runs with every seed. With it, and with `lr_from` (a scale's: another
scale's best LR; an optimizer's: another optimizer's at this scale), `launch/sweep/plan.py` decides
which cells run (docs/sweeps.md); `records/points.py` names the cells, with their own adamw_lr
`lr<lr>-alr<adamw_lr>-seed<seed>`.
Every problem raises SpecError with one line naming the key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from data.paths import PROJECT_ROOT as ROOT
from launch.nested import load_yaml, yaml_problem
from launch.sweep.branches import attach_branches
from launch.sweep.cells import Cell as Cell  # the sweep's parts, read from here by its callers
from launch.sweep.cells import CellGroup, Sweep
from launch.sweep.search_spec import parse_search
from launch.sweep.spec_values import SpecError as SpecError  # raised here; callers catch it from spec
from launch.sweep.spec_values import check_keys
from launch.sweep.spec_values import fail as _fail
from launch.sweep.spec_values import lrs as _lrs

SECTIONS = ("run", "model", "data", "optim", "train", "parallel")
AXIS_KEYS = ("run.dir", "optim.name", "optim.lr", "optim.adamw_lr", "train.seed")  # owned by the grid
TOP_KEYS = tuple("base runs_dir overrides scales optimizers lrs seeds slurm description lr_search".split())
SLURM_KEYS = ("gpus_per_node", "nodes", "cpus_per_task", "time", "partition", "account", "extra")


def fmt_value(v: Any) -> str:
    """A YAML scalar as train.py's dotted overrides read it back (bool -> true, list -> [..])."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (list, dict)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def _overrides(raw: Any, where: str) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, dict):
        _fail(f"{where} must be a mapping of section.key: value, got {raw!r}")
    out = []
    for key, value in raw.items():
        key = str(key)
        if "." not in key or key.split(".")[0] not in SECTIONS:
            _fail(f"{where}: '{key}' is not a dotted config key (section.key, sections: {', '.join(SECTIONS)})")
        if key in AXIS_KEYS:
            _fail(f"{where}: '{key}' is set by the sweep's axes (scales/optimizers/lrs/seeds, runs_dir)")
        out.append(f"{key}={fmt_value(value)}")
    return out


def _base(raw: Any, where: str) -> str:
    if not isinstance(raw, str) or not raw:
        _fail(f"{where} must be a config path such as configs/tiny.yaml, got {raw!r}")
    p = Path(raw)
    for cand in [p] if p.is_absolute() else [Path.cwd() / p, ROOT / p]:
        if cand.is_file():
            cand = cand.resolve()
            return str(cand.relative_to(ROOT)) if cand.is_relative_to(ROOT) else str(cand)
    _fail(f"{where}: config file '{raw}' not found")
    return ""


def _label(raw: Any, where: str) -> str:
    s = str(raw)
    if not s or "/" in s or s.startswith(".") or any(c.isspace() for c in s):
        _fail(f"{where}: label {raw!r} must be a non-empty directory name without '/' or spaces")
    return s


def _scales(raw: Any, base: str) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        _fail("'scales' must be a non-empty list of preset names or {label: ..., model.x: ...} mappings")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        where = f"scales[{i}]"
        if isinstance(item, (str, int, float)) and not isinstance(item, bool):
            preset = {"label": _label(item, where), "base": base, "overrides": [f"model.preset={item}"]}
            out.append({**preset, "lrs": None, "lr_from": None, "branch_of": None})
            continue
        if not isinstance(item, dict) or "label" not in item:
            _fail(f"{where} must be a preset name or a mapping with a 'label', got {item!r}")
        rest = {k: v for k, v in item.items() if k not in ("label", "base", "lrs", "lr_from", "branch_of")}
        lrs = item.get("lrs")
        if isinstance(lrs, dict):
            lrs = {str(k): _lrs(v, f"{where}.lrs.{k}") for k, v in lrs.items()}
        elif lrs is not None:
            lrs = _lrs(lrs, f"{where}.lrs")
        out.append(
            {
                "label": _label(item["label"], f"{where}.label"),
                "base": _base(item["base"], f"{where}.base") if "base" in item else base,
                "lrs": lrs,
                "lr_from": _label(item["lr_from"], f"{where}.lr_from") if item.get("lr_from") is not None else None,
                "branch_of": _label(item["branch_of"], f"{where}.branch_of") if item.get("branch_of") else None,
                "overrides": _overrides(rest, where),
            }
        )
    return out


def _optimizers(raw: Any) -> list[dict]:
    items: list[tuple[str, Any]] = []
    if isinstance(raw, list):
        for i, item in enumerate(raw):
            if isinstance(item, str):
                items.append((item, None))
            elif isinstance(item, dict) and "name" in item:
                items.append((str(item.get("label", item["name"])), item))
            else:
                _fail(f"optimizers[{i}] must be a name or a mapping with 'name', got {item!r}")
    elif isinstance(raw, dict) and raw:
        items = [(str(k), v) for k, v in raw.items()]
    else:
        _fail("'optimizers' must be a non-empty list of names or a mapping name -> lrs")
    out = []
    for label, spec in items:
        where = f"optimizers.{label}"
        entry: dict[str, Any] = dict(label=_label(label, where), name=label, lrs=None, overrides=[], lr_from=None)
        if isinstance(spec, list):
            entry["lrs"] = _lrs(spec, where)
        elif isinstance(spec, dict):
            entry["name"] = str(spec.get("name", label))
            if spec.get("lrs") is not None:
                entry["lrs"] = _lrs(spec["lrs"], f"{where}.lrs")
            if spec.get("lr_from") is not None:
                entry["lr_from"] = _label(spec["lr_from"], f"{where}.lr_from")
            rest = {k: v for k, v in spec.items() if k not in ("name", "label", "lrs", "lr_from")}
            rest = rest.get("overrides", rest) if set(rest) == {"overrides"} else rest
            entry["overrides"] = _overrides(rest, where)
        elif spec is not None:
            _fail(f"{where} must be null, a list of learning rates or a mapping, got {spec!r}")
        out.append(entry)
    return out


def load_sweep(path: str | Path) -> Sweep:
    """Parse and check a sweep file; SpecError (one line) on any problem."""
    path = Path(path)
    if not path.is_file():
        _fail(f"sweep file '{path}' not found")
    try:
        doc = load_yaml(path.read_text())
    except yaml.YAMLError as err:
        _fail(f"sweep file '{path}' is not valid YAML at {yaml_problem(err)}")
    if not isinstance(doc, dict):
        _fail(f"sweep file '{path}' must hold a mapping (base, runs_dir, scales, optimizers, lrs, seeds)")
    check_keys(doc, TOP_KEYS, "sweep key")
    for key in ("base", "runs_dir", "scales", "optimizers"):
        if key not in doc:
            _fail(f"sweep file '{path}' lacks '{key}'")
    base = _base(doc["base"], "base")
    if not isinstance(doc["runs_dir"], str) or not doc["runs_dir"]:
        _fail(f"'runs_dir' must be a directory path, got {doc['runs_dir']!r}")
    runs_dir = Path(doc["runs_dir"]).expanduser().resolve()
    common = _overrides(doc.get("overrides"), "overrides")
    default_lrs = _lrs(doc["lrs"], "lrs") if doc.get("lrs") is not None else None
    seeds = doc.get("seeds", [42])
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
        _fail(f"'seeds' must be a non-empty list of integers, got {seeds!r}")
    slurm = doc.get("slurm") or {}
    if not isinstance(slurm, dict):
        _fail(f"'slurm' must be a mapping ({', '.join(SLURM_KEYS)}), got {slurm!r}")
    check_keys(slurm, SLURM_KEYS, "slurm key")

    search = parse_search(doc.get("lr_search"))
    sweep = Sweep(path=path, runs_dir=runs_dir, seeds=list(seeds), search=search, slurm=slurm)
    scales = _scales(doc["scales"], base)
    labels = {sc["label"] for sc in scales}
    optimizers = _optimizers(doc["optimizers"])
    for opt in optimizers:
        if opt["lr_from"] is not None:
            if search is None:
                _fail(f"optimizer '{opt['label']}': lr_from needs lr_search (the best LRs come from a search)")
            source = next((o for o in optimizers if o["label"] == opt["lr_from"]), None)
            if source is None or source is opt or source["lr_from"] is not None:
                _fail(
                    f"optimizer '{opt['label']}': lr_from names '{opt['lr_from']}', not another searched "
                    "optimizer of this sweep"
                )
    for scale in scales:
        if scale["lr_from"] is not None:
            if search is None:
                _fail(f"scale '{scale['label']}': lr_from needs lr_search (the best LR comes from a search)")
            if scale["lr_from"] not in labels or scale["lr_from"] == scale["label"]:
                _fail(f"scale '{scale['label']}': lr_from names '{scale['lr_from']}', not another scale of this sweep")
        for opt in optimizers:
            s_lrs = scale["lrs"]
            lrs = (
                (s_lrs.get(opt["label"]) if isinstance(s_lrs, dict) else None)
                or opt["lrs"]
                or (s_lrs if isinstance(s_lrs, list) else None)
                or default_lrs
            )
            if not lrs and scale["lr_from"] is None and opt["lr_from"] is None and scale["branch_of"] is None:
                _fail(
                    f"no learning rates for optimizer '{opt['label']}' at scale '{scale['label']}': "
                    "give 'lrs' (top level, per optimizer or per scale)"
                )
            overrides = [*common, *scale["overrides"], *opt["overrides"], f"optim.name={opt['name']}"]
            grid = list(lrs or []) if opt["lr_from"] is None else []  # lr_from: the source's best, no grid
            group_args = (scale["label"], opt["label"], scale["base"], overrides, grid, scale["lr_from"], runs_dir)
            group = CellGroup(*group_args, opt["lr_from"], scale["branch_of"])
            if len(set(group.lrs)) != len(group.lrs) or any(g.id == group.id for g in sweep.groups):
                _fail(f"two cells share a directory under {group.id} (duplicate label or learning rate)")
            sweep.groups.append(group)
    attach_branches(sweep)  # it builds on the groups above
    return sweep
