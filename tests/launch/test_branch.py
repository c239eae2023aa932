"""Cooldown branches (launch/branch.py): a branch from a wsd run's checkpoint equals the run
given the same schedule from step 0 (bit for bit on one process; within the backends' rounding under
FSDP2 on 2 ranks), a killed branch resumes exactly from its own checkpoint, the parent's files are
untouched, and the command's plan and errors."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from launch import branch, branch_plan
from tests.helpers import ROOT, SMALL, TINY, env, launch_cmd, measured_apart, train_in_pool, train_losses
from tests.pool import rank_pool
from tests.pool_jobs import train_runs

pytestmark = pytest.mark.slow

# The parent: 32 steps of wsd, warmup 2, its own cooldown the last 8 (stable through step 24);
# checkpoints every 4 steps, none pruned.
WSD = ["optim.schedule=wsd", "optim.warmup_steps=2", "optim.name=orscale_lm", "train.eval_every=0"]
WSD += ["optim.r_max=1.05"]  # some steps clip, some not: the clip counters' fractions tell a restart apart
PARENT = [*WSD, "optim.decay_fraction=0.25", "train.max_steps=32", "train.ckpt_every=4", "run.keep_checkpoints=0"]


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def _setups(run_dir: Path) -> list[dict]:
    """The setup line of each launch in run.log."""
    lines = (run_dir / "run.log").read_text().splitlines()
    return [json.loads(line.split("setup: ", 1)[1]) for line in lines if "setup: {" in line]


def _reference(run_dir: Path, budget: int, decay: int, nproc: int = 1) -> Path:
    """The run of `budget` steps given the branch's schedule from step 0."""
    train_in_pool([f"run.dir={run_dir}", *WSD, f"train.max_steps={budget}", f"optim.decay_steps={decay}"], nproc)
    return run_dir


@pytest.fixture(scope="module")
def parent(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("wsd") / "parent"
    train_in_pool([f"run.dir={run_dir}", *PARENT])
    return run_dir


def test_a_branch_is_the_run_of_its_budget_and_leaves_the_parent_untouched(parent, tmp_path):
    before = _digest(parent)
    plans = branch_plan.plan_branches(parent, [12, 24], tmp_path / "branches", fraction=0.25)
    assert [(b.budget, b.decay, b.start.name) for b in plans] == [(12, 3, "step_00000008"), (24, 6, "step_00000016")]
    argvs = [["--config", str(parent / "config.yaml"), *b.overrides()] for b in plans]
    (launch,) = rank_pool(1).run_raw(train_runs, argvs, group=False)
    assert launch.error is None, launch.log
    # what a branch is, said once per branch; no warning about the changes it exists to make
    assert launch.log.count(f"a cooldown branch of {parent} from its step ") == 2, launch.log
    assert "changed settings" not in launch.log, launch.log
    for b in plans:
        got = train_losses(b.run_dir)
        ref = _reference(tmp_path / f"ref_{b.budget}", b.budget, b.decay)
        want = train_losses(ref)
        start = int(b.start.name.split("_")[1])
        assert sorted(got) == list(range(start + 1, b.budget + 1))  # the branch trains from its start on
        assert got == {s: want[s] for s in got}, b.budget  # bit for bit, the cooldown included
        # every key of every line, the clip counters' diag/*/cum_frac_* and the validation lines included
        lines = [m for m in measured_apart(ref) if m["step"] > start]
        assert any(m.get("diag/all/cum_frac_rmax", 0) > 0 for m in lines), "no step clipped: the test sees nothing"
        assert measured_apart(b.run_dir) == lines, b.budget
        # provenance: the parent checkpoint (its run and step) in the branch's config and setup line
        assert yaml.safe_load((b.run_dir / "config.yaml").read_text())["run"]["init_from"] == str(b.start)
        assert _setups(b.run_dir)[-1]["resumed_from"] == str(b.start)
    assert _digest(parent) == before  # nothing of the parent's was written, moved or pruned


def test_a_branch_runs_under_other_backends(parent, tmp_path):
    """The one-process parent's checkpoint, branched under FSDP2 and under ZeRO-2 on 2 ranks: the run of
    its budget, within the backends' rounding (one process and 2 ranks differ by ~1e-7 themselves)."""
    backends = ("fsdp", "zero2")
    plans = {b: branch_plan.plan_branches(parent, [12], tmp_path / b, fraction=0.25)[0] for b in backends}
    argvs = [
        ["--config", str(parent / "config.yaml"), *p.overrides(), f"parallel.backend={b}"] for b, p in plans.items()
    ]
    rank_pool(2).run(train_runs, argvs)
    want = train_losses(_reference(tmp_path / "ref", 12, plans["fsdp"].decay))
    for backend, plan in plans.items():
        got = train_losses(plan.run_dir)
        assert sorted(got) == [9, 10, 11, 12]
        for step, loss in got.items():
            assert loss == pytest.approx(want[step], rel=1e-5), (backend, step)


def test_a_killed_branch_resumes_from_its_own_checkpoint_bit_for_bit(parent, tmp_path):
    from tests.launch.test_resume import _wait_for_step

    # steps 17-32, killed once past its own checkpoint of step 20: 11 steps and 3 checkpoints before
    # its end, so that a kill cannot come after it (a 3-step margin lost that race once in CI)
    (plan,) = branch_plan.plan_branches(parent, [32], tmp_path / "branches", fraction=0.5)
    assert (plan.start.name, plan.decay) == ("step_00000016", 16)
    cmd = launch_cmd(ROOT / "train.py", ["--config", str(parent / "config.yaml"), *plan.overrides()])
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    _wait_for_step(plan.run_dir, 21, proc, poll_s=0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (plan.run_dir / "checkpoints/step_00000020/meta.json").is_file()
    newest = max((plan.run_dir / "checkpoints").glob("step_*/meta.json")).parent
    assert newest.name != "step_00000032", "the kill came after the branch's end"
    rank_pool(1).run(train_runs, [["--config", str(parent / "config.yaml"), *plan.overrides()]], group=False)
    starts = [s["resumed_from"] for s in _setups(plan.run_dir)]
    assert starts == [str(plan.start), str(newest)]  # the parent's checkpoint, then its own
    want = train_losses(_reference(tmp_path / "ref", plan.budget, plan.decay))
    assert train_losses(plan.run_dir) == {s: want[s] for s in range(17, 33)}


def test_the_command_plans_each_budget_and_refuses_in_one_line(parent, tmp_path, capsys):
    assert branch.main(["--parent", str(parent), "--budgets", "12", "24", "--out", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "budget 12: cooldown of 2 steps" not in out  # the parent's share (0.25): 3 steps of 12
    assert "budget 12: cooldown of 3 steps from" in out and "budget 24: cooldown of 6 steps from" in out
    assert f"train.py --config {parent / 'config.yaml'} parallel.backend=auto" in out
    assert f"run.dir={tmp_path / 'budget_12'} run.init_from={parent / 'checkpoints/step_00000008'}" in out
    # longer than the parent: from its last stable checkpoint (step 24), then a stable stretch of its own
    assert branch.main(["--parent", str(parent), "--budgets", "40", "--out", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "budget 40: cooldown of 10 steps from " + str(parent / "checkpoints/step_00000024") in out
    assert (
        "  note: longer than the parent's 32 steps: from its step 24 the branch trains the rest itself, steps "
        "25-30 at the peak LR, then its cooldown (steps 31-40)\n"
    ) in out
    # no parent checkpoint before the cooldown's start; a cooldown inside the warmup
    assert branch.main(["--parent", str(parent), "--budgets", "4", "--decay-steps", "1", "--dry-run"]) == 2
    assert branch.main(["--parent", str(parent), "--budgets", "3", "--decay-steps", "2", "--dry-run"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2 and "no checkpoint at or before step 3" in errors[0] and "warmup" in errors[1]
    cosine = tmp_path / "cosine"
    cosine.mkdir()
    (cosine / "config.yaml").write_text(
        (parent / "config.yaml")
        .read_text()
        .replace("schedule: wsd", "schedule: cosine")
        .replace("decay_fraction: 0.25", "decay_fraction: null")
    )
    assert branch.main(["--parent", str(cosine), "--budgets", "12", "--dry-run"]) == 2
    assert "cooldown branches need a wsd parent" in capsys.readouterr().err


def test_overrides_may_follow_the_budgets_and_a_cooldown_longer_than_a_budget_says_so(parent, tmp_path, capsys):
    """`--budgets 12 24 optim.r_max=1.1`: the override is every branch's (argparse alone read it as a
    budget); a cooldown longer than its budget is named as such, in one line."""
    argv = ["--parent", str(parent), "--budgets", "12", "24", "optim.r_max=1.1", "--out", str(tmp_path), "--dry-run"]
    assert branch.main(argv) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if "train.py" in line]
    assert len(commands) == 2 and all(line.endswith(" optim.r_max=1.1") for line in commands), commands
    assert branch.main(["--parent", str(parent), "--budgets", "12", "--decay-steps", "20", "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        "error: budget 12: its cooldown of 20 steps (--decay-steps) is longer than the budget; give a longer "
        "budget or a shorter cooldown (--decay-steps / --decay-fraction)\n"
    )


def test_a_branch_with_a_cooldown_shape_of_its_own_trains_it_without_a_changed_settings_warning(parent, tmp_path):
    """`--decay-shape 1-sqrt` on a linear parent: the branch's config has it, and its train.py says what
    the branch is, not that a setting changed (the shape is the branch's own, as its length is)."""
    (plan,) = branch_plan.plan_branches(parent, [12], tmp_path / "branches", fraction=0.25, shape="1-sqrt")
    assert "optim.wsd.decay_shape=1-sqrt" in plan.overrides()
    (launch,) = rank_pool(1).run_raw(
        train_runs, [["--config", str(parent / "config.yaml"), *plan.overrides()]], group=False
    )
    assert launch.error is None, launch.log
    assert f"a cooldown branch of {parent} from its step 8" in launch.log and "changed settings" not in launch.log
    assert yaml.safe_load((plan.run_dir / "config.yaml").read_text())["optim"]["wsd"]["decay_shape"] == "1-sqrt"
    assert sorted(train_losses(plan.run_dir)) == [9, 10, 11, 12]


def _copy_of(parent: Path, to: Path, damage: str | None = None) -> Path:
    """The parent's config.yaml and step-8 checkpoint (what budget 12 reads), `damage` done to a copy."""
    shutil.copytree(parent / "checkpoints/step_00000008", to / "checkpoints/step_00000008")
    shutil.copy(parent / "config.yaml", to / "config.yaml")
    if damage == "yaml":
        (to / "config.yaml").write_text((to / "config.yaml").read_text() + "optim: [1, 2\n")
    elif damage == "meta":
        (to / "checkpoints/step_00000008/meta.json").write_text('{"step": 8,')
    elif damage == "shard":
        shard = max((to / "checkpoints/step_00000008/dcp").glob("*.distcp"), key=lambda f: f.stat().st_size)
        shard.write_bytes(shard.read_bytes()[:100])
    return to


@pytest.mark.parametrize(
    "damage, args, said",
    [
        ("yaml", [], "config.yaml' is not valid YAML at line"),
        ("meta", [], "step_00000008, which is damaged: "),
        ("shard", [], "step_00000008, which is damaged: "),
        (None, ["optim.shedule=wsd"], "unknown config key 'optim.shedule'; did you mean 'optim.schedule'?"),
        (None, ["optim.schedule=cosine"], "optim.schedule=cosine: a cooldown branch runs the parent's wsd schedule"),
        (None, ["train.max_steps=20"], "train.max_steps=20: give each branch's budget with --budgets"),
        (None, ["--nproc", "0"], "--nproc must be >= 1"),
        (None, ["--nproc", "3"], "data.logical_shards (4) must be a multiple of the world size (3)"),
        (None, ["--nproc", "2", "parallel.backend=fsdp", "parallel.dp_replicate=4"], "divide the world size (2)"),
        (None, ["--decay-fraction", "1.5"], "--decay-fraction must be in (0, 1]"),
        (None, ["--decay-steps", "0"], "--decay-steps must be >= 1"),
        (None, ["--decay-shape", "sqrt"], "--decay-shape must be one of linear, 1-sqrt, cosine, got 'sqrt'"),
        (None, ["optim.decay_shape=cosine"], "optim.decay_shape=cosine: give the cooldown's shape with --decay-shape"),
        (
            None,
            ["--budgets", "12x"],
            "--budgets takes whole numbers of steps >= 1 (each branch's train.max_steps), got '12x'",
        ),
    ],
    ids=[
        *("bad-yaml", "bad-meta", "truncated-shard", "typo", "cosine", "own-key", "nproc-0", "nproc-3"),
        *("resolved-at-nproc", "frac", "steps", "shape", "shape-override", "budget-word"),
    ],
)
def test_a_mistake_is_one_line_before_any_plan_or_run(parent, tmp_path, capsys, damage, args, said):
    """Each in one line and exit 2, before the plan is printed or any branch's train.py starts;
    a flag's mistake names the flag."""
    source = _copy_of(parent, tmp_path / "parent", damage) if damage else parent
    code = branch.main(["--parent", str(source), "--budgets", "12", "--out", str(tmp_path / "b"), *args])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and not (tmp_path / "b").exists(), (out, err)
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and said in err, err


def test_init_from_past_the_budget_is_one_line(parent, tmp_path, capsys):
    from launch.loop import main as train_main

    code = train_main(
        ["--config", TINY, *SMALL, *WSD, f"run.dir={tmp_path / 'b'}", "train.max_steps=8", "optim.decay_steps=2"]
        + [f"run.init_from={parent / 'checkpoints/step_00000012'}"]
    )
    assert code == 2
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error: ")][0]
    assert "run.init_from's checkpoint" in line and "step 12, not before train.max_steps=8" in line
