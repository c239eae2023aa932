"""launch.sweep, and the report of what it ran: a real (tiny) sweep in-process, resume and skip, Slurm
scripts, the report's tables against the logs, a killed cell reported then re-run. The report on
synthetic logs is tests/report/test_report.py."""

from __future__ import annotations

import json
import shutil
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from launch.sweep import jobs
from launch.sweep import sweep_cli as sweep
from launch.sweep.spec import ROOT, load_sweep
from report import build as report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
OPTIMS = ["adamw", "muon_moonlight", "orscale_lm"]
LRS = [3e-3, 1e-2]
COMMON = {
    "data.tokenizer": "assets/tokenizers/bpe4k_ladder",  # a 4k head: GPT-2's 50k would be most of each step
    "model.vocab_size": 4096,
    "data.seq_len": 32,
    "model.max_seq_len": 32,
    "data.val_tokens": 256,
    "data.logical_shards": 2,
    "train.tokens_per_step": 64,
    "train.micro_batch_size": 2,
    "train.max_steps": 4,
    "train.log_every": 1,
    "train.eval_every": 2,
    "train.progress": False,
    "optim.warmup_steps": 1,
    "optim.ns_dtype": "fp32",
}
SCALES = [
    {"label": "a", "model.n_layer": 1, "model.d_model": 32, "model.n_head": 2},
    {"label": "b", "model.n_layer": 1, "model.d_model": 64, "model.n_head": 2},
]


def write_sweep(path: Path, runs_dir: Path, **changes) -> Path:
    doc = {
        "base": "configs/tiny.yaml",
        "runs_dir": str(runs_dir),
        "overrides": dict(COMMON),
        "scales": SCALES,
        "optimizers": OPTIMS,
        "lrs": LRS,
        "seeds": [0, 1],
    }
    for key, value in changes.items():
        if key == "overrides":
            doc["overrides"].update(value)
        else:
            doc[key] = value
    path.write_text(yaml.safe_dump(doc))
    return path


def read_lines(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def mini(tmp_path_factory, one_thread):
    """The test grid (2 scales x 3 optimizers x 2 LRs x 2 seeds, 4 steps), run through the sweep
    command in-process. One cell was first run for 2 steps, and a broken optimizer cell failed."""
    tmp = tmp_path_factory.mktemp("sweep")
    runs = tmp / "runs"
    pre = write_sweep(
        tmp / "pre.yaml",
        runs,
        overrides={"train.max_steps": 2},
        scales=SCALES[:1],
        seeds=[0],
        optimizers={"adamw": [LRS[0]], "no_such_optimizer": [LRS[0]]},
    )
    pre_rc = sweep.main([str(pre)])
    pre_metrics = (runs / "a/adamw/lr0.003-seed0/metrics.jsonl").read_text()
    spec = write_sweep(tmp / "mini.yaml", runs)
    rc = sweep.main([str(spec)])
    return {"tmp": tmp, "runs": runs, "spec": spec, "pre_rc": pre_rc, "rc": rc, "pre_metrics": pre_metrics}


@pytest.mark.slow  # `mini` trains a 24-cell sweep
def test_sweep_runs_resumes_and_skips(mini, capsys):
    assert mini["pre_rc"] == 1  # the broken cell failed, the other one still ran
    assert mini["rc"] == 0
    cells = load_sweep(mini["spec"]).cells
    assert len(cells) == 24
    for cell in cells:
        lines = read_lines(cell.run_dir)
        assert lines[-1]["step"] == 4 and "val_loss" in lines[-1], cell.id
    # The 2-step cell was continued from its checkpoint, not restarted: its first two steps (logged
    # under the 2-step schedule) are kept as they were, steps 3-4 follow, no step twice.
    resumed = mini["runs"] / "a/adamw/lr0.003-seed0"
    assert '"val_loss"' in mini["pre_metrics"].splitlines()[-1]
    assert (resumed / "metrics.jsonl").read_text().startswith(mini["pre_metrics"])
    assert not list(resumed.glob("metrics.*.jsonl"))  # no restart (run.overwrite keeps old metrics aside)
    train_steps = [m["step"] for m in read_lines(resumed) if "train_loss" in m]
    assert train_steps == [1, 2, 3, 4]
    # Each launch of the cell logged the cell's own command, not the sweep's (which ran it in-process).
    logged = [line.split(" environment: ", 1)[1] for line in (resumed / "run.log").open() if " environment: " in line]
    assert [json.loads(x)["argv"][:2] for x in logged] == [["train.py", "--config"]] * 2, logged
    capsys.readouterr()
    assert sweep.main([str(mini["spec"])]) == 0  # everything finished: all skipped
    out = capsys.readouterr().out
    assert "24 finished, 0 to run" in out and out.count("skipped") == 24


@pytest.mark.slow  # `mini` trains a 24-cell sweep
def test_report_tables_and_pngs_match_logs(mini):
    out = mini["tmp"] / "report"
    summary = report.build_report(mini["runs"], out)
    for name in (
        "val_loss_vs_tokens.png",
        "loss_vs_params.png",
        "loss_vs_lr.png",
        "muon_diagnostics.png",
    ):
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1024, name
    md = (out / "report.md").read_text()
    assert summary["n_runs"] == 24 and summary["n_finished"] == 24 and len(summary["rows"]) == 2
    for row in summary["rows"]:
        label = "a" if ",d32," in row["label"] else "b"
        for opt in OPTIMS:
            g = row["groups"][opt]
            # Recompute from the logs: mean over seeds of the final val loss, per LR; the best LR wins.
            means = {}
            for lr in LRS:
                finals = [
                    read_lines(mini["runs"] / label / opt / f"lr{lr:.6g}-seed{s}")[-1]["val_loss"] for s in (0, 1)
                ]
                means[lr] = (float(np.mean(finals)), float(np.std(finals, ddof=1)))
            best = min(means, key=lambda lr: means[lr][0])
            assert g["lr"] == best and g["mean"] == pytest.approx(means[best][0], abs=1e-12)
            assert f"{means[best][0]:.4f} ± {means[best][1]:.4f}" in md
            assert f"`{label}/{opt}/lr{best:.6g}-seed0` @" in md  # provenance names the run dirs
    for section in (
        "### 1. Which optimizer wins at each scale",
        "## Learning-rate sensitivity",
        "needs ≥ 4",
        "tried — extend the search",
        "## Unfinished runs",
        "None.",
    ):
        assert section in md, section
    assert "## Significance" not in md  # section 1's table is the one significance table
    assert "| 2 (paired), df 1 |" in md.split("### 2.")[0]


@pytest.mark.slow  # the rerun starts a cell's process
def test_killed_cell_is_reported_then_rerun(mini, capsys):
    """Truncate a finished cell's log mid-line and delete its checkpoints (a kill before the first
    checkpoint): the report lists it as unfinished; re-running the sweep redoes only that cell."""
    run = mini["runs"] / "b/orscale_lm/lr0.01-seed1"
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(lines[:2]) + lines[2][:25])
    shutil.rmtree(run / "checkpoints")
    summary = report.build_report(mini["runs"], mini["tmp"] / "report_killed")
    assert list(summary["unfinished"]) == ["b/orscale_lm/lr0.01-seed1"]
    assert "last line torn" in summary["unfinished"]["b/orscale_lm/lr0.01-seed1"]
    md = (mini["tmp"] / "report_killed/report.md").read_text()
    assert "`b/orscale_lm/lr0.01-seed1`" in md.split("## Unfinished runs")[1]
    row_b = next(r for r in summary["rows"] if ",d64," in r["label"])
    assert next(p for p in row_b["groups"]["orscale_lm"]["by_point"] if p["lr"] == 0.01)["n"] == 1  # never averaged in
    capsys.readouterr()
    assert sweep.main([str(mini["spec"])]) == 0
    out = capsys.readouterr().out
    assert "23 finished, 1 to run" in out
    assert read_lines(run)[-1]["step"] == 4
    assert list(run.glob("metrics.*.jsonl"))  # train.py restarted the cell, keeping the old log aside


def test_dry_run_prints_commands_and_writes_nothing(tmp_path, capsys):
    spec = write_sweep(tmp_path / "s.yaml", tmp_path / "runs")
    assert sweep.main([str(spec), "--dry-run", "--only", "a/*"]) == 0
    out = capsys.readouterr().out
    cmds = [x for x in out.splitlines() if x.startswith(sys.executable)]
    assert len(cmds) == 12 and all(" train.py --config configs/tiny.yaml " in c for c in cmds)
    assert any(
        c.endswith(
            f"optim.name=muon_moonlight optim.lr=0.01 train.seed=1 run.dir={tmp_path}/runs/a/"
            "muon_moonlight/lr0.01-seed1"
        )
        for c in cmds
    )
    assert sweep.main([str(spec), "--dry-run", "--submit"]) == 0
    assert capsys.readouterr().out.count("\nsbatch ") == 24
    assert sweep.main([str(spec), "--dry-run", "--nproc", "2", "--only", "b/adamw/lr0.003-seed0"]) == 0
    assert "-m launch.launcher --standalone --nproc_per_node=2 train.py" in capsys.readouterr().out
    assert not (tmp_path / "runs").exists()


def test_submit_writes_job_scripts_and_calls_sbatch(tmp_path, monkeypatch, capsys):
    spec = write_sweep(tmp_path / "s.yaml", tmp_path / "runs", scales=SCALES[:1], seeds=[7])
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "sbatch"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/sbatch_calls\necho 'Submitted batch job 4242'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(bindir))
    assert sweep.main([str(spec), "--submit", "--nproc", "4"]) == 0
    scripts = sorted((tmp_path / "runs/slurm").glob("*.sbatch"))
    assert len(scripts) == 6
    calls = (tmp_path / "sbatch_calls").read_text().split()
    assert sorted(calls) == [str(s) for s in scripts]
    text = (tmp_path / "runs/slurm/a__orscale_lm__lr0.01-seed7.sbatch").read_text()
    assert "#SBATCH --gpus-per-node=4" in text and "#SBATCH --requeue" in text and f"cd {ROOT}" in text
    assert (
        "python -m launch.launcher --standalone --nproc_per_node=4 train.py --config configs/tiny.yaml" in text
        and f"optim.name=orscale_lm optim.lr=0.01 train.seed=7 run.dir={tmp_path}/runs/a/orscale_lm/lr0.01-seed7"
        in text
    )
    assert "Submitted batch job 4242" in capsys.readouterr().out
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no sbatch: paths + commands, one error line
    assert sweep.main([str(spec), "--submit"]) == 1
    cap = capsys.readouterr()
    assert cap.err.count("\n") == 1 and cap.err.startswith("error: sbatch not found")
    assert cap.out.count("sbatch ") == 6


@pytest.mark.parametrize(
    "doc, needle",
    [
        ("base: [unclosed", "not valid YAML"),
        ("base: configs/tiny.yaml\nruns_dir: r\noptimizers: [adamw]\nlrs: [1e-3]", "lacks 'scales'"),
        ("base: configs/nope.yaml\nruns_dir: r\nscales: [tiny]\noptimizers: [adamw]\nlrs: [1e-3]", "not found"),
        ("base: configs/tiny.yaml\nruns_dir: r\nscales: [tiny]\noptimizers: [adamw]\nlrs: [fast]", "not a number"),
        (
            "base: configs/tiny.yaml\nruns_dir: r\nscales: [tiny]\noptimizers: [adamw]\nlrs: [1e-3]\nseed: [1]",
            "unknown sweep key 'seed'; did you mean 'seeds'?",
        ),
        (
            "base: configs/tiny.yaml\nruns_dir: r\nscales: [tiny]\noptimizers: [adamw]\nlrs: [1e-3]\n"
            "overrides: {optim.lr: 1}",
            "set by the sweep's axes",
        ),
        ("base: configs/tiny.yaml\nruns_dir: r\nscales: [{n_layer: 2}]\noptimizers: [adamw]\nlrs: [1e-3]", "label"),
    ],
)
def test_bad_sweep_file_is_one_error_line(tmp_path, capsys, doc, needle):
    (tmp_path / "bad.yaml").write_text(doc)
    assert sweep.main([str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and needle in err, err


def test_ready_sweep_files():
    paper = load_sweep(ROOT / "configs/sweeps/paper.yaml")
    assert len(paper.cells) == 16  # the paper's 12 and NorMuon's 4: one per scale at its LR, seed 42
    cell = next(c for c in paper.cells if c.id == "399m/orscale_lm/lr0.0009503-seed42")
    assert cell.base == "configs/399m.yaml" and cell.value("train.max_steps") == 11342
    assert jobs.train_argv(cell, 8)[1:6] == ["-m", "launch.launcher", "--standalone", "--nproc_per_node=8", "train.py"]
    # both LRs tuned, the shared protocol scored, OrScale-LM at Moonlight's LRs, in both ladders
    for path, cells in (("paper.yaml", 16), ("cpu_ladder.yaml", 60)):
        s = load_sweep(ROOT / "configs/sweeps" / path)
        assert len(s.cells) == cells and s.search is not None and s.search.adamw_ratios and s.search.shared, path
        assert {g.optim for g in s.groups if g.lr_from_optim == "muon_moonlight"} == {"orscale_lm_transfer"}, path
    # the budget axis as cooldown branches: the scored runs save where their branches start
    budgets = load_sweep(ROOT / "configs/sweeps/paper_budgets.yaml")
    assert len(budgets.cells) == 12 and sum(g.branch_of is not None for g in budgets.groups) == 24
    main = next(g for g in budgets.groups if g.id == "1.1b/orscale_lm")
    assert "train.ckpt_at=[3629,7258]" in main.overrides and "optim.schedule=wsd" in main.overrides
    mini = load_sweep(ROOT / "configs/sweeps/cpu_mini.yaml")
    # the LR search's first round: 2 scales x 3 optimizers x 3 LRs at seed 0 (seeds 1-2 follow its answer)
    assert len(mini.cells) == 18 and all(jobs.in_process(c, 1) for c in mini.cells)


def test_a_cell_run_in_process_logs_its_own_train_py_command(tmp_path, monkeypatch):
    """run.log records sys.argv as the run's command: a cell run in the sweep's process records its own
    `python train.py ...` (from the project root), resolving to the cell's config; not the sweep's."""
    from launch import loop
    from launch.plan import load_config
    from launch.run.provenance import environment

    cell = load_sweep(write_sweep(tmp_path / "s.yaml", tmp_path / "runs")).cells[0]
    seen = {}

    def fake_train(argv):
        seen["argv"], seen["logged"] = argv, environment()["argv"]
        return 0

    monkeypatch.setattr(loop, "main", fake_train)
    sweep_argv = ["launch/sweep/__main__.py", str(tmp_path / "s.yaml"), "--jobs", "1"]
    monkeypatch.setattr(sys, "argv", list(sweep_argv))
    assert jobs.run_local(cell, 1) == 0 and sys.argv == sweep_argv  # the sweep's own again
    assert (logged := seen["logged"])[:3] == ["train.py", "--config", cell.base], logged
    monkeypatch.chdir(ROOT)
    args, ran = loop.parse_args(logged[1:]), loop.parse_args(seen["argv"])
    assert load_config(args.config, args.overrides) == load_config(ran.config, ran.overrides)
