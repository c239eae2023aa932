"""Where a run starts: a fresh run directory, or the newest intact checkpoint in it. `run.resume` (auto, restart,
none, a path), `run.init_from` and what a resume may change: docs/running.md, "Resuming, preemption, export" and
"Schedules, and many token budgets from one run". When checkpoints exist but none is intact the run stops in one
line: the trainer never starts over on top of them, and never deletes one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import yaml

from launch.checkpoint import FORMAT, check_loadable, find_checkpoint, newest_intact_checkpoint
from launch.config import config_from_tree, recorded, resume_keys
from launch.errors import USER_ERRORS, ConfigError
from launch.nested import flatten
from launch.run.run_dir import RunDir, StepLines, continue_at, strict_json
from launch.train_config import RunConfig
from orscale.registry import find_optimizer, schedule_of
from orscale.schedule import Cooldown
from records.read import read_metrics

log = logging.getLogger("orscale")

# A change here makes the checkpoint meaningless for this run: refuse. Changing the QUIET ones is routine
# (log more often, read ahead further): still the same run, and no warning. The sections declare both
# (launch.config.resume_keys).
MUST_MATCH = ("model", "tokenizer", *resume_keys("fixed"))
QUIET = resume_keys("routine")
# Still the same run (extend it), but a resume lists it among the changed settings: max_steps moves the
# end of the LR schedule, so the resumed steps get other LRs than the checkpoint's run would have.
HARMLESS = (*QUIET, "config.train.max_steps")


def same_run(run: RunDir, resolved: dict[str, Any]) -> bool:
    """Whether the run dir's config.yaml is this run's `resolved` config (ignoring what HARMLESS may
    change)."""
    path = run.path / "config.yaml"
    try:
        saved = yaml.safe_load(path.read_text()) if path.is_file() else None
    except yaml.YAMLError:
        return False
    if not isinstance(saved, dict):
        return False
    try:
        saved = recorded(saved)  # a run directory of an earlier format reads as this one records it
    except USER_ERRORS:
        return False
    old, new = flatten({"config": saved}), flatten({"config": resolved})
    return all(old.get(k) == new.get(k) or any(k.startswith(h) for h in HARMLESS) for k in set(old) | set(new))


def find_resume_point(run_cfg: RunConfig, resolved: dict[str, Any], run: RunDir) -> Path | None:
    """The checkpoint this run continues from, or None for step 0 (docs/running.md, "Resuming, preemption, export").
    `run_cfg`: the run's `run:` section; `resolved`: its whole config as a dict."""
    has_run = run.metrics_path.exists()
    mode = run_cfg.resume
    if mode == "none":
        if has_run and not run_cfg.overwrite:
            raise ConfigError(
                f"run.dir '{run.path}' already holds a run; use run.resume=auto to continue it, "
                "another run.dir, or run.overwrite=true to start over (old metrics are kept)"
            )
        return None
    if mode == "restart":
        _move_aside(run.path / "checkpoints")
        return None
    if mode == "auto":
        found, damaged = newest_intact_checkpoint(run.path / "checkpoints")
        if found is None and damaged:
            raise ConfigError(_none_intact(run.path / "checkpoints", damaged))
        for path, problem in damaged:  # found is not None here: with none intact the line above raised
            log.warning("checkpoint %s is damaged (%s): resuming from %s before it", path.name, problem, found)
        if found is None and has_run and not run_cfg.overwrite:
            if not same_run(run, resolved):
                raise ConfigError(
                    f"run.dir '{run.path}' already holds a run (metrics.jsonl) of another config "
                    "and no complete checkpoint; choose another run.dir or pass "
                    "run.overwrite=true"
                )
            if not run_cfg.init_from:
                log.warning(
                    "run.dir %s holds an earlier attempt of this run but no complete checkpoint (stopped "
                    "before its first save): starting again from step 0; its metrics are kept aside",
                    run.path,
                )
        if found is None and run_cfg.init_from:
            return _checked(run_cfg.init_from, "run.init_from")
        return found
    return _checked(mode, "run.resume")


def _checked(path: str, key: str) -> Path:
    """The complete, intact checkpoint at `path` (the value of config key `key`), or one line why not."""
    found = find_checkpoint(path)
    if found is None:
        raise ConfigError(f"{key}='{path}' is not a complete checkpoint (no meta.json inside)")
    damage = check_loadable(found)
    if damage is not None:
        raise ConfigError(f"{key}='{path}' is damaged: {damage}; pick another checkpoint")
    return found


def _none_intact(checkpoints: Path, damaged: list[tuple[Path, str]]) -> str:
    """One short line (the newest damaged step, the two ways on) and, under it, what failed in each."""
    newest, older = damaged[0][0].name, len(damaged) - 1
    which = f"{newest} and the {older} before it are" if older else f"{newest} is"
    head = (
        f"no intact checkpoint in {checkpoints}: {which} damaged (below) and nothing was written; resume from "
        "an intact copy with run.resume=PATH, or start over with run.resume=restart (moved aside, never deleted)"
    )
    return "\n".join([head, *(f"  {path.name}: {problem.replace(f'{path}/', '')}" for path, problem in damaged)])


def _move_aside(checkpoints: Path) -> None:
    """`run.resume=restart`: keep every checkpoint there under a new name (never deleted)."""
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        aside = checkpoints.with_name(f"checkpoints.old-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(checkpoints, aside)
        log.warning("run.resume=restart: the checkpoints there were moved aside to %s (not deleted)", aside.name)


def check_resume_compatible(saved: dict[str, Any], current: dict[str, Any], branch_start: Path | None = None) -> None:
    """ConfigError if the checkpoint cannot continue this run; a warning for changed settings.
    `branch_start`: the run starts from run.init_from's checkpoint, that of another (wsd) run: what it
    changes of that run's schedule (its budget, its cooldown) is what it is, said in one line instead."""
    old, new, changed = refuse_incompatible(saved, current)
    routine = [k for k in changed if not any(k.startswith(h) for h in QUIET)]
    cooldown = schedule_of(str(new.get("config.optim.schedule"))).cooldown
    if branch_start is not None and cooldown is not None:
        log.info(_describe_branch(branch_start, old, current["config"], cooldown))
        # what a cooldown branch (launch/branch.py) changes of its parent: its budget and its cooldown
        own = f"config.{cooldown.section}."
        routine = [k for k in routine if k != "config.train.max_steps" and not k.startswith(own)]
    if routine:
        log.warning(
            "resuming with changed settings: %s", ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in routine)
        )


def refuse_incompatible(saved: dict[str, Any], current: dict[str, Any]) -> tuple[dict, dict, list[str]]:
    """ConfigError (one line) if the checkpoint `saved` (its meta.json) cannot continue the run
    `current` describes (the same keys: format, model, tokenizer, config); else the two flattened and
    the keys that differ."""
    if saved.get("format", 1) != FORMAT:
        raise ConfigError(
            f"cannot resume: the checkpoint is in format {saved.get('format', 1)} of an older trainer "
            f"(this one reads {FORMAT}: data addressed by piece and row); its weights still export "
            "(python -m launch.export); start a new run.dir"
        )
    parts = ("model", "tokenizer", "config")
    # a checkpoint of an earlier format reads as this one records its config
    saved = {**saved, "config": recorded(saved.get("config") or {})}
    old, new = flatten({k: saved.get(k) for k in parts}), flatten({k: current.get(k) for k in parts})
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    fatal = [k for k in changed if any(k == m or k.startswith(m + ".") for m in MUST_MATCH)]
    if fatal:
        key = fatal[0]
        raise ConfigError(
            f"cannot resume: the checkpoint has {key}={old.get(key)!r} but this run has "
            f"{new.get(key)!r}; keep it the same or start a new run.dir"
        )
    _check_param_groups(old, new)
    return old, new, changed


def _describe_branch(start: Path, old: dict[str, Any], config: dict[str, Any], cooldown: Cooldown) -> str:
    """'a cooldown branch of runs/wsd from its step 24: 60 steps (the parent's 32), the last 15 a wsd
    cooldown (from step 46)'."""
    cfg = config_from_tree(config)
    budget = cfg.train.max_steps
    decay = cooldown.length(cfg.optim, budget)
    step = int(start.name.split("_")[-1]) if start.name.startswith("step_") else "?"
    return (
        f"a cooldown branch of {start.parent.parent} from its step {step}: {budget} steps (the parent's "
        f"{old.get('config.train.max_steps')}), the last {decay} a {cfg.optim.schedule} cooldown "
        f"(from step {budget - decay + 1})"
    )


def _check_param_groups(old: dict[str, Any], new: dict[str, Any]) -> None:
    """adamw and CBP/LAMB/LARS put the AdamW group (embedding, norms) in param groups of its own once
    optim.adamw_lr or adamw_weight_decay is set: a checkpoint's groups load only into the same split."""
    name = new.get("config.optim.name")
    spec = find_optimizer(str(name))
    if spec is None or spec.routing == "matrices":  # the Muon family: the same groups either way
        return
    split = [
        any(flat.get(f"config.optim.{k}") is not None for k in ("adamw_lr", "adamw_weight_decay"))
        for flat in (old, new)
    ]
    if split[0] != split[1]:
        state = lambda s: "set" if s else "unset (null)"
        raise ConfigError(
            f"cannot resume: the checkpoint's {name} has optim.adamw_lr/adamw_weight_decay {state(split[0])} and "
            f"this run {state(split[1])}, which splits its param groups differently; keep them "
            f"{state(split[0]).split()[0]} or start a new run.dir"
        )


def prepare_run_dir(run: RunDir, start_step: int) -> None:
    """Make metrics.jsonl continue at `start_step` with no duplicate steps (rank 0 only)."""
    if run.active:
        continue_at(run.metrics_path, start_step, _metric_lines)


def _metric_lines(path: Path) -> StepLines:
    records, bad = read_metrics(path)
    lines = [(r.get("step", 0), json.dumps(strict_json(r), allow_nan=False)) for r in records if isinstance(r, dict)]
    return lines, bad
