"""The plan of `python -m launch.branch` (launch/branch.py, which reads its arguments): a Branch per
budget, each checked as its train.py would check it, and the branches' commands (`run`). The cooldown
rule is `launch.sweep.branches.cooldown`, which a sweep's `branch_of` scales follow too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from launch.checkpoint import check_loadable, checkpoint_dirs, is_complete, read_meta
from launch.config import Config, read_config, to_dict
from launch.environment import EnvFacts
from launch.errors import USER_ERRORS, UserError
from launch.nested import as_overrides
from launch.plan import load_config, resolve
from launch.run.resume import refuse_incompatible
from orscale.registry import SCHEDULES, schedule_of
from orscale.schedule import COSINE, DECAY_SHAPES, Cooldown
from records.config_keys import MOVED

ROOT = Path(__file__).resolve().parent.parent
# The branch's layout is its own launch's (the parent's resolved backend and shard count were its world's).
LAYOUT = ["parallel.backend=auto", "parallel.dp_replicate=1", "parallel.dp_shard=-1"]
# What a branch sets itself, and the flag that sets it (not an override: the plan depends on it).
OWN_KEYS = {
    "train.max_steps": "give each branch's budget with --budgets",
    "run.dir": "each branch's directory is <--out>/budget_<B>: give --out",
    "run.init_from": "the plan picks the parent's checkpoint for each budget",
}
# The keys of a cooldown's section that the flags set.
FLAGS = {
    "decay_steps": "give the cooldown with --decay-steps",
    "decay_fraction": "give the cooldown with --decay-fraction",
    "decay_shape": "give the cooldown's shape with --decay-shape",
}


@dataclass(frozen=True)
class Branch:
    budget: int  # train.max_steps of the branch
    decay: int  # its cooldown's steps
    start: Path  # the parent checkpoint it starts from (step <= budget - decay)
    run_dir: Path
    cooldown: Cooldown  # the parent's schedule's
    note: str = ""  # said beside the plan: e.g. a budget longer than the parent trains stable steps itself
    shape: str | None = None  # its cooldown's shape (None: the parent's)

    def overrides(self) -> list[str]:
        """On top of the parent's resolved config.yaml. The launch's own world decides the layout
        (the parent's resolved backend and shard count were its world's), unless given again."""
        return [
            *LAYOUT,
            f"run.dir={self.run_dir}",
            f"run.init_from={self.start}",
            "run.resume=auto",
            f"train.max_steps={self.budget}",
            *as_overrides(self.cooldown.keys(self.decay, None, self.shape)),
        ]


def parent_config(parent: Path) -> Config:
    """The parent run's config.yaml, read as train.py reads a config (one line for what is wrong)."""
    path = parent / "config.yaml"
    if not path.is_file():
        raise UserError(
            f"--parent '{parent}' holds no config.yaml: give the run directory of a finished or running run"
        )
    return load_config(str(path), LAYOUT)


def plan_branches(
    parent: Path,
    budgets: list[int],
    out: Path,
    fraction: float | None = None,
    steps: int | None = None,
    shape: str | None = None,
) -> list[Branch]:
    """One Branch per budget, or one UserError line naming what the parent lacks. `fraction`, `steps`:
    the cooldown's length (the flags; None for both: the parent's), `shape`: its shape (None: the parent's)."""
    config = parent_config(parent)
    optim = config.optim
    cooldown = schedule_of(optim.schedule).cooldown
    if cooldown is None:
        raise UserError(
            f"the parent run {parent} has optim.schedule={optim.schedule}: cooldown branches need a "
            f"{_with_cooldown()} parent (its LR is the peak's until its own cooldown); train one with "
            f"optim.schedule={_with_cooldown()}"
        )
    total = config.train.max_steps
    stable_until = total - cooldown.length(optim, total)  # the parent's own cooldown starts here
    # published checkpoints by their directory's step (meta.json is read, and checked, once one is chosen)
    saved = {int(p.name.split("_")[1]): p for p in checkpoint_dirs(parent / "checkpoints") if is_complete(p)}
    given = "--decay-steps" if steps is not None else "the parent's cooldown"
    # the branch's cooldown: the flags' where given, else the parent's (a share of the budget, or steps)
    if steps is not None or fraction is not None:
        optim = read_config(str(parent / "config.yaml"), as_overrides(cooldown.keys(steps, fraction, None))).optim
    branches = []
    for budget in budgets:
        decay = cooldown.length(optim, budget)
        first = budget - decay  # the branch's first cooldown step
        if decay > budget:
            raise UserError(
                f"budget {budget}: its cooldown of {decay} steps ({given}) is longer than the budget; "
                "give a longer budget or a shorter cooldown (--decay-steps / --decay-fraction)"
            )
        if first < optim.warmup_steps:
            raise UserError(
                f"budget {budget}: its cooldown ({decay} steps) would start at step {first}, inside the parent's "
                f"warmup ({optim.warmup_steps} steps); use a longer budget or a shorter cooldown "
                "(--decay-steps / --decay-fraction)"
            )
        usable = [s for s in saved if s <= min(first, stable_until)]
        if not usable:
            raise UserError(
                f"budget {budget}: the parent {parent} has no checkpoint at or before step {min(first, stable_until)} "
                f"(it has {sorted(saved) or 'none'}); train it with train.ckpt_at=[{first}, ...] (a branch then "
                "starts right at its cooldown) and run.keep_checkpoints=0"
            )
        start = max(usable)
        note = ""
        if budget > total:  # past the parent's end: nothing of the parent's covers the steps after `start`
            stable = f"steps {start + 1}-{first} at the peak LR, then " if first > start else ""
            note = (
                f"longer than the parent's {total} steps: from its step {start} the branch trains the rest "
                f"itself, {stable}its cooldown (steps {first + 1}-{budget})"
            )
        branches.append(Branch(budget, decay, saved[start], out / f"budget_{budget}", cooldown, note, shape))
    return branches


def check_overrides(extra: list[str]) -> None:
    """UserError (one line) for an override of what a branch sets itself or cannot change."""
    sections = {s.cooldown.section for s in SCHEDULES.values() if s.cooldown is not None}
    for item in extra:
        key, _, value = item.partition("=")
        if key in OWN_KEYS:
            raise UserError(f"{item}: {OWN_KEYS[key]}")
        if key == "optim.schedule" and SCHEDULES.get(value.strip(), COSINE).cooldown is None:
            raise UserError(
                f"{item}: a cooldown branch runs the parent's {_with_cooldown()} schedule with a cooldown of its "
                "own; drop it (a run of another schedule is a run of its own: python train.py)"
            )
        for now in MOVED.get(key, (key,)):  # a key of the earlier format is checked where it lives now
            section, _, field = now.rpartition(".")
            if section in sections:
                raise UserError(f"{item}: {FLAGS.get(field, 'the flags set the cooldown')}")


def _with_cooldown() -> str:
    """The schedules a branch can cool down on, for a message."""
    return " or ".join(name for name, s in SCHEDULES.items() if s.cooldown is not None)


def check_branch(parent: Path, branch: Branch, nproc: int, extra: list[str]) -> None:
    """What the branch's train.py would refuse at its start, checked now (one UserError line): its
    config with the user's overrides, on `nproc` processes, and the parent checkpoint it starts from.
    (Its config's warnings, if any, its train.py says.)"""
    cfg = read_config(str(parent / "config.yaml"), [*branch.overrides(), *extra])
    # resolved as the branch's launch will resolve it: parallel.backend=auto, parallel.dp_shard=-1
    launch = dataclasses.replace(EnvFacts.from_env(cfg.train), world_size=nproc, local_world_size=nproc)
    plan = resolve(cfg, launch)
    cfg = plan.cfg
    problem = check_loadable(branch.start)
    if problem is not None:
        raise UserError(
            f"budget {branch.budget} starts from the parent's checkpoint {branch.start}, which is damaged: "
            f"{problem}; restore it from a copy, or give budgets whose cooldown starts at another checkpoint"
        )
    plan.backend.engine_class().check_checkpoint(branch.start, nproc)
    saved = read_meta(branch.start)
    model = dataclasses.asdict(cfg.model.resolve())
    refuse_incompatible(saved, {**saved, "config": to_dict(cfg), "model": model})


def branch_argv(parent: Path, branch: Branch, nproc: int, extra: list[str]) -> list[str]:
    """The branch's train.py command (from the project root): the parent's resolved config, then the
    branch's own settings, then the user's overrides."""
    args = ["train.py", "--config", str(parent / "config.yaml"), *branch.overrides(), *extra]
    if nproc > 1:
        return [sys.executable, "-m", "launch.launcher", "--standalone", f"--nproc_per_node={nproc}", *args]
    return [sys.executable, *args]


def check_flags(args: argparse.Namespace) -> list[int]:
    """The budgets, or a UserError (one line, naming the flag) for a flag's impossible value."""
    budgets = []
    for text in args.budgets:
        if not text.isdigit() or int(text) < 1:
            raise UserError(
                f"--budgets takes whole numbers of steps >= 1 (each branch's train.max_steps), got {text!r}"
            )
        budgets.append(int(text))
    if not budgets:
        raise UserError("--budgets needs at least one number of steps (each branch's train.max_steps)")
    if args.nproc < 1:
        raise UserError(f"--nproc must be >= 1 (processes per branch), got {args.nproc}")
    if args.decay_fraction is not None and not 0 < args.decay_fraction <= 1:
        raise UserError(
            f"--decay-fraction must be in (0, 1] (the cooldown's share of a budget), got {args.decay_fraction}"
        )
    if args.decay_steps is not None and args.decay_steps < 1:
        raise UserError(f"--decay-steps must be >= 1, got {args.decay_steps}")
    if args.decay_shape is not None and args.decay_shape not in DECAY_SHAPES:
        raise UserError(f"--decay-shape must be one of {', '.join(DECAY_SHAPES)}, got {args.decay_shape!r}")
    return sorted(set(budgets))


def run(args: argparse.Namespace) -> int:
    """`python -m launch.branch` with its arguments read (launch.branch.parse_args): everything checked,
    then each branch's plan printed and (unless --dry-run) its train.py run. 2 after a user error's one
    line, 1 if a branch failed."""
    parent = args.parent.resolve()
    out = (args.out or parent.with_name(f"{parent.name}-branches")).resolve()
    try:  # everything that can be checked, before the plan is printed or a branch starts
        budgets = check_flags(args)
        check_overrides(args.overrides)
        branches = plan_branches(parent, budgets, out, args.decay_fraction, args.decay_steps, args.decay_shape)
        for branch in branches:
            check_branch(parent, branch, args.nproc, args.overrides)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    failed = 0
    for branch in branches:
        argv_b = branch_argv(parent, branch, args.nproc, args.overrides)
        note = f"\n  note: {branch.note}" if branch.note else ""
        shape = f" ({branch.shape})" if branch.shape else ""
        print(
            f"budget {branch.budget}: cooldown of {branch.decay} steps{shape} from {branch.start}{note}\n"
            f"  {' '.join(argv_b)}"
        )
        if not args.dry_run:
            failed += subprocess.run(argv_b, cwd=ROOT, env=env).returncode != 0
    return 1 if failed else 0
