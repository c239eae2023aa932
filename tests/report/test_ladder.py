"""A miniature of the CPU ladder (configs/sweeps/cpu_ladder.yaml) end to end: four tiny scales x
AdamW / Muon+Moonlight / OrScale-LM, an LR search on seed 0 (3-point grids, an edge extended once),
two evaluation seeds at the best LR, and two more token budgets at one scale (`lr_from`); then the
report, whose four headline answers are checked against numbers recomputed here from metrics.jsonl."""

from __future__ import annotations

import json
import math
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from bench import run_logs
from launch.sweep import sweep_cli
from report.build import build_report
from report.stats import fit_power_law, t_ppf
from tests.helpers import MINI_LADDER

SEARCH, SEEDS = 0, [1, 2]
GRIDS = {"adamw": [1e-2, 3e-2, 1e-1], "muon_moonlight": [3e-2, 1e-1, 3e-1], "orscale_lm": [3e-2, 1e-1, 3e-1]}
MAIN = ["m1", "m2", "m3", "m4"]
WIDTH = {"m1": 16, "m2": 24, "m3": 32, "m4": 48}
BUDGETS = {"m2-D0.5": 64, "m2": 128, "m2-D2": 256}  # tokens per step at 8 steps: 512, 1,024, 2,048 tokens


def sweep_doc(runs: Path) -> dict:
    shape = {"model.n_layer": 1, "model.n_head": 2}
    scales = [{"label": s, **shape, "model.d_model": WIDTH[s]} for s in MAIN]
    scales += [
        {"label": "m2-D0.5", "lr_from": "m2", **shape, "model.d_model": 24, "train.tokens_per_step": 64,
         "train.micro_batch_size": 2},
        {"label": "m2-D2", "lr_from": "m2", **shape, "model.d_model": 24, "train.tokens_per_step": 256,
         "train.micro_batch_size": 8},
    ]  # fmt: skip
    return {
        "base": "configs/tiny.yaml",
        "runs_dir": str(runs),
        "overrides": MINI_LADDER,
        "scales": scales,
        "optimizers": GRIDS,
        "lr_search": {"seed": SEARCH, "max_extra": 1},
        "seeds": SEEDS,
    }


@pytest.fixture(scope="module")
def ladder(tmp_path_factory, one_thread):
    tmp = tmp_path_factory.mktemp("ladder")
    spec = tmp / "mini_ladder.yaml"
    spec.write_text(yaml.safe_dump(sweep_doc(tmp / "runs")))
    rc = sweep_cli.main([str(spec), "--jobs", "1"])
    summary = build_report(tmp / "runs", tmp / "report")
    return {
        "tmp": tmp,
        "runs": tmp / "runs",
        "rc": rc,
        "summary": summary,
        "md": (tmp / "report/report.md").read_text(),
    }


def final_loss(run_dir: Path) -> float:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"val_loss"' in x]
    return float(lines[-1]["val_loss"])


def first(run_dir: Path, key: str) -> float:
    return next(json.loads(x)[key] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if f'"{key}"' in x)


def best_lr(runs: Path, scale: str, optim: str) -> tuple[float, dict[float, float]]:
    """The planner's rule, from the logs: lowest final loss on the search seed, ties to the lower LR."""
    losses = {
        float(p.name[2:].split("-seed")[0]): final_loss(p) for p in (runs / scale / optim).glob(f"*-seed{SEARCH}")
    }
    return min(losses, key=lambda lr: (losses[lr], lr)), losses


def scored(runs: Path, scale: str, optim: str, lr: float) -> dict[int, float]:
    return {s: final_loss(runs / scale / optim / f"lr{lr:.6g}-seed{s}") for s in SEEDS}


@pytest.mark.slow
def test_sweep_finished_and_the_top_of_the_report_has_four_answers(ladder):
    assert ladder["rc"] == 0
    md, s = ladder["md"], ladder["summary"]
    top = md.split("## Final validation loss at the best learning rate")[0]
    for heading in (
        "## At a glance",
        "### 1. Which optimizer wins at each scale",
        "### 2. Data efficiency over AdamW",
        "### 3. Does the best LR transfer across width?",
        "### 4. How the gap changes with scale",
    ):
        assert heading in top, heading
    assert "chosen on seed 0 alone" in top and "evaluation seeds 1, 2 only" in top
    assert s["selection"] == "search seed" and s["headline"]["complete"] == s["headline"]["total"] == 18
    assert "Holm" in top and f"**{s['headline']['n_tests']} tests**" in top
    for name in ("val_loss_vs_tokens", "loss_vs_params", "loss_vs_lr", "muon_diagnostics"):
        png = ladder["tmp"] / "report" / f"{name}.png"
        assert png.read_bytes()[:4] == b"\x89PNG" and name in s["figures"], name
    assert s["figures"]["muon_diagnostics"] and {e["class"] for e in s["figures"]["muon_diagnostics"]} == {
        "attn_qkv",
        "attn_out",
        "mlp_up",
        "mlp_down",
    }
    # every seed at the best LR, search seed included
    assert {e["seed"] for e in s["figures"]["muon_diagnostics"] if e["optim"] == "orscale_lm"} == {SEARCH, *SEEDS}


@pytest.mark.slow
def test_delta_and_lr_choice_recomputed_from_the_logs(ladder):
    runs, s = ladder["runs"], ladder["summary"]
    wins = {w["scale"]: w for w in s["headline"]["wins"]}
    for scale in MAIN:
        lrs = {o: best_lr(runs, scale, o)[0] for o in GRIDS}
        a, b = scored(runs, scale, "orscale_lm", lrs["orscale_lm"]), scored(runs, scale, "adamw", lrs["adamw"])
        d = np.array([a[k] - b[k] for k in SEEDS])
        half = t_ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
        got = wins[scale]["deltas"]["orscale_lm|adamw"]
        assert got["diff"] == pytest.approx(d.mean(), abs=1e-12) and got["df"] == len(SEEDS) - 1
        assert got["ci"] == pytest.approx([d.mean() - half, d.mean() + half], abs=1e-9)
        row = next(r for r in ladder["summary"]["rows"] if r["name"] == wins[scale]["row"])
        assert row["groups"]["orscale_lm"]["lr"] == lrs["orscale_lm"]
        assert f"**{d.mean():+.4f}**".replace("-", "−") in ladder["md"]
    assert abs(t_ppf(0.975, 1) - 12.7062) < 1e-3  # n = 2 seeds: a t-interval, not a bootstrap over 2 points


@pytest.mark.slow
def test_scaling_fit_and_lr_transfer_recomputed(ladder):
    runs, h = ladder["runs"], ladder["summary"]["headline"]
    ns, means = [], []
    for scale in MAIN:
        lr, _ = best_lr(runs, scale, "adamw")
        ns.append(first(runs / scale / "adamw" / f"lr{lr:.6g}-seed1", "non_embedding_params"))
        means.append(float(np.mean(list(scored(runs, scale, "adamw", lr).values()))))
    fit = fit_power_law(ns, means)
    got = h["scaling"]["fits"]["adamw"]
    assert got["N"] == ns and (got["E"], got["A"], got["alpha"]) == pytest.approx((fit.E, fit.A, fit.alpha))
    assert got["E_ci"][0] <= got["E_ci"][1] and got["alpha_ci"][0] <= got["alpha_ci"][1]
    for optim in GRIDS:
        pts = {p["d_model"]: p for p in h["lr_transfer"]["points"][optim]}
        assert {d: pts[d]["best_lr"] for d in pts} == {WIDTH[s]: best_lr(runs, s, optim)[0] for s in MAIN}
        assert h["lr_transfer"]["fits"][optim]["slope"]["df"] == len(MAIN) - 2


@pytest.mark.slow
def test_speedup_recomputed(ladder):
    runs, h = ladder["runs"], ladder["summary"]["headline"]
    (entry,) = h["speedup"]
    lr_a = best_lr(runs, "m2", "adamw")[0]
    adam = [(BUDGETS[s] * 8, float(np.mean(list(scored(runs, s, "adamw", lr_a).values())))) for s in BUDGETS]
    adam.sort()
    if any(y2 >= y1 for (_, y1), (_, y2) in zip(adam, adam[1:], strict=False)):  # no decreasing L(D): said so
        assert "does not fall" in entry["reason"]
        return
    fit = fit_power_law([d for d, _ in adam], [y for _, y in adam])
    assert entry["fit"]["E"] == pytest.approx(fit.E) and entry["fit"]["alpha"] == pytest.approx(fit.alpha)
    lr_o = best_lr(runs, "m2", "orscale_lm")[0]
    for scale, tps in BUDGETS.items():
        loss = float(np.mean(list(scored(runs, scale, "orscale_lm", lr_o).values())))
        row = next(r for r in entry["rows"] if r["optim"] == "orscale_lm" and r["tokens"] == tps * 8)
        expect = fit.inverse(loss) / (tps * 8)
        assert row["speedup"] == pytest.approx(expect) if math.isfinite(expect) else math.isinf(row["speedup"])
    assert "speedup [95%]" in ladder["md"]


@pytest.mark.slow
def test_a_group_still_searching_is_pending_not_a_number(ladder, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(ladder["runs"], runs, ignore=shutil.ignore_patterns("checkpoints"))
    lr, _ = best_lr(runs, "m3", "adamw")
    victim = runs / "m3/adamw" / f"lr{lr:.6g}-seed{SEARCH}" / "metrics.jsonl"
    victim.write_text("".join(victim.read_text().splitlines(keepends=True)[:3]))  # killed mid-search
    summary = build_report(runs, tmp_path / "report")
    m3 = next(w for w in summary["headline"]["wins"] if w["scale"] == "m3")
    m3_adamw = next(r for r in summary["rows"] if r["name"] == m3["row"])["groups"]["adamw"]
    assert m3_adamw["mean"] is None and m3_adamw["status"].startswith("LR search")
    assert m3["deltas"]["orscale_lm|adamw"] is None
    md = (tmp_path / "report/report.md").read_text()
    assert "*pending: LR search incomplete" in md.split("## Final validation loss")[0]
    assert summary["headline"]["complete"] == 17


@pytest.mark.slow
def test_packed_logs_rebuild_the_report_and_resume_the_sweep(ladder, tmp_path, capsys):
    """bench.run_logs: the finished runs' logs, packed and unpacked elsewhere, give the same report
    numbers and leave the sweep nothing to run; an unfinished run and checkpoints are not packed."""
    archive, plain = tmp_path / "logs.tar.xz", tmp_path / "plain" / "runs"
    assert run_logs.main(["pack", str(ladder["runs"]), str(archive)]) == 0
    assert run_logs.main(["unpack", str(archive), str(plain)]) == 0
    assert not list(plain.rglob("checkpoints")) and (plain / "sweep_plan.json").is_file()
    summary = build_report(plain, tmp_path / "report")
    for key in ("headline", "rows"):
        assert json.dumps(summary[key], sort_keys=True) == json.dumps(ladder["summary"][key], sort_keys=True), key
    spec = tmp_path / "again.yaml"
    spec.write_text(yaml.safe_dump(sweep_doc(plain)))
    capsys.readouterr()
    assert sweep_cli.main([str(spec), "--dry-run"]) == 0
    assert ", 0 to run" in capsys.readouterr().out
    assert run_logs.main(["unpack", str(archive), str(plain)]) == 0  # everything already there: kept
    assert "0 files written" in capsys.readouterr().out
    victim = next(plain.glob("m1/adamw/*-seed1")) / "metrics.jsonl"
    victim.write_text("".join(victim.read_text().splitlines(keepends=True)[:3]))  # a run killed mid-way
    assert run_logs.main(["pack", str(plain), str(archive)]) == 0
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    run = victim.parent.relative_to(plain)
    assert str(run / "metrics.jsonl") not in names and str(run / "config.yaml") not in names


# ---- synthetic logs (fast): grid-edge flags, Holm, downstream accuracies, hyperparameters


def fake_run(root: Path, scale: str, optim: str, lr: float, seed: int, d: int, loss: float, acc: float | None) -> Path:
    path = root / scale / optim / f"lr{lr:.6g}-seed{seed}"
    path.mkdir(parents=True)
    cfg = {
        "run": {"dir": str(path)},
        "model": {"preset": "tiny", "n_layer": 2, "d_model": d, "n_head": 2, "vocab_size": 4096},
        "data": {"seq_len": 64, "val_tokens": 1024},
        "optim": {"name": optim, "lr": lr, "weight_decay": 0.1, "momentum": 0.95, "warmup_steps": 2},
        "train": {"max_steps": 20, "tokens_per_step": 256, "seed": seed, "eval_every": 2},
        "parallel": {"backend": "none"},
    }
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (path / "run.log").write_text("x INFO run dir x, git commit abc123\n")
    n = 24 * d * d + 2 * d
    lines = []
    for step in range(2, 21, 2):
        diag = (
            {
                f"diag/{c}/{f}": 1.0 + step / 20
                for c in ("attn_qkv", "attn_out", "mlp_up", "mlp_down", "all")
                for f in ("r", "r_raw", "w_norm", "update_ratio", "cum_frac_rmax")
            }
            if optim != "adamw"
            else {}
        )
        lines.append(
            {
                "step": step,
                "tokens": 256 * step,
                "train_loss": 9.0,
                "tokens_per_s": 1e3,
                "params": n + 4096 * d,
                "non_embedding_params": n,
                **diag,
            }
        )
        lines.append({"step": step, "tokens": 256 * step, "val_loss": loss + (20 - step) / 10, "val_tokens": 1024})
    if acc is not None:
        lines.append(
            {
                "step": 20,
                "tokens": 5120,
                "eval/hellaswag/acc": acc,
                "eval/hellaswag/acc_norm": acc,
                "eval/hellaswag/acc_per_token": acc,
                "eval/hellaswag/n": 200,
                "eval/hellaswag/chance": 0.25,
            }
        )
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_edges_holm_downstream_and_hyperparameters_from_synthetic_logs(tmp_path):
    runs = tmp_path / "runs"
    lrs = [1e-3, 2e-3, 4e-3]
    groups = {}
    for scale, d, shift in (("a", 32, 0.0), ("b", 64, -0.3)):
        for optim, base in (("adamw", 5.0), ("orscale_lm", 4.9)):
            for lr in lrs:  # AdamW's best at the high edge, OrScale-LM's interior
                bump = (lrs.index(lr) - (2 if optim == "adamw" else 1)) ** 2 * 0.05
                fake_run(runs, scale, optim, lr, 0, d, base + shift + bump, None)
            best = 4e-3 if optim == "adamw" else 2e-3
            for seed, noise in ((1, 0.0), (2, 0.01), (3, -0.02)):
                acc = 0.25 + 0.005 * seed if optim == "adamw" else 0.40 + 0.01 * seed
                fake_run(
                    runs, scale, optim, best, seed, d, base + shift + noise + 0.002 * seed * (optim == "adamw"), acc
                )
            groups[f"{scale}/{optim}"] = {
                "lrs": lrs,
                "best_lr": best,
                "at_edge": optim == "adamw",
                "note": "",
                "lr_from": None,
            }
    final = runs / "a/adamw/lr0.004-seed1/downstream/step_20.json"  # launch.evaluation's default output
    final.parent.mkdir()
    summary = {"task": "hellaswag", "n": 200, "chance": 0.25, "acc": 0.5, "acc_norm": 0.31, "acc_per_token": 0.3}
    final.write_text(json.dumps({"summaries": {"hellaswag": {**summary, "primary_metric": "acc_norm"}}}))
    plan = {"lr_search": {"seed": 0, "max_extra": 2, "factor": None}, "seeds": [1, 2, 3], "groups": groups}
    (runs / "sweep_plan.json").write_text(json.dumps(plan))
    s = build_report(runs, tmp_path / "out")
    md = (tmp_path / "out/report.md").read_text()
    top = md.split("## Final validation loss")[0]
    assert "⚠ best at the highest LR tried: not tuned" in top and "⚠ AdamW best at the highest LR tried" in top
    # two tests (OrScale-LM − AdamW at a and b): Holm doubles the smaller p, keeps the order
    d = [w["deltas"]["orscale_lm|adamw"] for w in s["headline"]["wins"]]
    small, large = sorted(d, key=lambda x: x["p"])
    assert small["p_holm"] == pytest.approx(min(1.0, 2 * small["p"]))
    assert large["p_holm"] == pytest.approx(max(small["p_holm"], large["p"]))
    assert s["headline"]["n_tests"] == 2 and "**2 tests**" in top
    # downstream: metrics records, except where downstream.json (launch.evaluation) gives the final numbers
    assert "### hellaswag (acc_norm)" in md and "near chance" in md.split("## Downstream evaluation")[1]
    pts = {(e["scale"], e["optim"]): e for e in s["figures"]["accuracy_vs_val_loss"]}
    assert pts[("a", "adamw")]["mean"] == pytest.approx(np.mean([0.31, 0.26, 0.265]))
    assert pts[("b", "orscale_lm")]["mean"] == pytest.approx(0.42)
    assert (tmp_path / "out/accuracy_vs_val_loss.png").read_bytes()[:4] == b"\x89PNG"
    hyper = md.split("## Hyperparameters")[1].split("##")[0]
    assert (
        "| momentum | `optim.muon.momentum` | n/a | 0.95 |" in hyper
        and "| weight decay | `optim.weight_decay` | 0.1 | 0.1 |" in hyper
    )
