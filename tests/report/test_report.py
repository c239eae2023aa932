"""The report on synthetic run directories (no training): scaling and L(D) fits, unfinished, torn,
missing and diverged runs, and the statistics on hand-computed cases."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from report import build as report
from report.stats import compare, fit_power_law, holm, t_ppf

# ---- synthetic logs: statistics, fits, unfinished/diverged runs


def fake_run(
    path: Path,
    *,
    n_layer=1,
    d_model=64,
    optim="adamw",
    lr=1e-3,
    seed=0,
    steps=10,
    tps=64,
    losses=None,
    nonemb=None,
    tail="",
) -> Path:
    path.mkdir(parents=True)
    cfg = {
        "run": {"dir": str(path)},
        "model": {"preset": "tiny", "n_layer": n_layer, "d_model": d_model, "n_head": None, "vocab_size": None},
        "data": {"seq_len": 32, "val_tokens": 256},
        "optim": {"name": optim, "lr": lr},
        "train": {"max_steps": steps, "tokens_per_step": tps, "seed": seed},
        "parallel": {"backend": "none"},
    }
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (path / "run.log").write_text(f'x INFO run dir {path}, git commit abc123def456\nx INFO setup: {{"params": 1000}}\n')
    lines = [
        json.dumps(
            {
                "step": steps,
                "tokens": steps * tps,
                "train_loss": 5.0,
                "tokens_per_s": 100.0,
                **({"non_embedding_params": nonemb} if nonemb else {}),
            }
        )
    ]
    lines += [f'{{"step": {steps}, "tokens": {steps * tps}, "val_loss": {v}}}' for v in (losses or [])]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n" + tail)
    return path


def test_scaling_fit_recovers_exponent(tmp_path):
    E, A, alpha = 2.0, 300.0, 0.35
    for n in (1e5, 1e6, 1e7, 1e8, 1e9):
        for opt, shift in (("adamw", 0.0), ("orscale_lm", -0.05)):
            fake_run(
                tmp_path / f"{n:g}/{opt}",
                d_model=int(math.log10(n)) * 2,
                optim=opt,
                losses=[E + shift + A * n**-alpha],
                nonemb=n,
            )
    summary = report.build_report(tmp_path, tmp_path / "out")
    fits = summary["headline"]["scaling"]["fits"]
    assert fits["adamw"]["alpha"] == pytest.approx(alpha, abs=1e-3) and fits["adamw"]["E"] == pytest.approx(E, abs=1e-3)
    assert fits["orscale_lm"]["E"] == pytest.approx(E - 0.05, abs=1e-3)
    direct = fit_power_law([1e2, 1e3, 1e4, 1e5], [1.0 + 5.0 * x**-0.5 for x in (1e2, 1e3, 1e4, 1e5)])
    assert (direct.E, direct.A, direct.alpha) == pytest.approx((1.0, 5.0, 0.5), rel=1e-3)
    assert fit_power_law([1, 2], [3, 2]) is None
    assert "1 seed — no test" in (tmp_path / "out/report.md").read_text()


def test_data_efficiency_multiplier(tmp_path):
    # AdamW at three budgets on L(D) = 2.5 + 50 D^-0.3; OrScale-LM at D0 reaches AdamW's loss at 2 D0.
    law = lambda d: 2.5 + 50 * d**-0.3
    for steps in (100, 200, 400):
        fake_run(tmp_path / f"adamw{steps}", steps=steps, losses=[law(steps * 64)])
    fake_run(tmp_path / "ours", optim="orscale_lm", steps=100, losses=[law(2 * 100 * 64)])
    report.build_report(tmp_path, tmp_path / "out")
    md = (tmp_path / "out/report.md").read_text()
    section = md.split("### 2. Data efficiency over AdamW")[1].split("### 3.")[0]  # the multiplier, shown once
    assert "| OrScale-LM | 6,400 | 5.4296 (n=1) | 12,800 | **2×** [2, 2] |" in section


def test_unfinished_truncated_missing_and_diverged(tmp_path):
    fake_run(tmp_path / "ok", losses=[3.0])
    fake_run(tmp_path / "torn", losses=[], tail='{"step": 10, "tokens": 640, "val_lo')
    fake_run(tmp_path / "nan", seed=1, losses=["NaN"])
    fake_run(tmp_path / "null", seed=2, lr=3e-3, losses=["null"])
    (fake_run(tmp_path / "nometrics", losses=[3.0]) / "metrics.jsonl").unlink()
    (fake_run(tmp_path / "noconfig", losses=[3.0]) / "config.yaml").unlink()
    summary = report.build_report(tmp_path, tmp_path / "out")
    assert set(summary["unfinished"]) == {"torn", "nometrics", "noconfig"}
    assert "last line torn" in summary["unfinished"]["torn"]
    g = summary["rows"][0]["groups"]["adamw"]
    assert g["lr"] == 1e-3 and g["mean"] is None  # 3.0 and NaN: the LR counts as diverged
    assert next(p for p in g["by_point"] if p["lr"] == 0.003)["mean"] is None
    md = (tmp_path / "out/report.md").read_text()
    assert "diverged" in md and "metrics.jsonl missing" in md and "config.yaml missing" in md


def test_a_loop_features_own_records_appear_by_their_kind(tmp_path):
    """Any kind of record a feature writes of its own: each run's last one, by kind, no rule per kind."""
    tail = '{"kind": "weight_norms", "step": 5, "tokens": 320, "w/mean": 1.0}\n'
    tail += '{"kind": "weight_norms", "step": 10, "tokens": 640, "w/mean": 1.5, "w/max": null, "note": "x"}\n'
    fake_run(tmp_path / "a", losses=[3.0], tail=tail)
    fake_run(tmp_path / "b", seed=1, losses=[3.1])
    summary = report.build_report(tmp_path, tmp_path / "out")
    assert summary["records"] == {"weight_norms": {"a": {"step": 10, "tokens": 640, "w/mean": 1.5, "w/max": None}}}
    md = (tmp_path / "out/report.md").read_text()
    section = md.split("## Records of kind `weight_norms`")[1].split("## ")[0]
    assert "| run directory | step | tokens | w/mean | w/max |" in section and "| `a` | 10 | 640 | 1.5 | — |" in section


def test_stats_agree_with_hand_computed_case():
    a, b = [3.0, 3.1, 3.2], [3.1, 3.25, 3.3]  # d = -0.1, -0.15, -0.1: mean -0.11667, sd 0.028868
    c = compare(dict(enumerate(a)), dict(enumerate(b)))
    # t = mean / (sd/sqrt 3) = -7 with 2 df; for 2 df, P(T > t) = (1 - t/sqrt(t^2 + 2)) / 2.
    assert c.paired and c.t == pytest.approx(-7.0, rel=1e-9) and c.df == 2
    assert c.p == pytest.approx(1 - 7 / math.sqrt(51), rel=1e-9) and c.diff == pytest.approx(-0.35 / 3)
    assert t_ppf(0.975, 2) == pytest.approx(4.302652729749464, rel=1e-12)  # t₀.₉₇₅ with df 2, from tables
    half = t_ppf(0.975, 2) * np.std(np.subtract(a, b), ddof=1) / math.sqrt(3)
    assert c.ci == pytest.approx((c.diff - half, c.diff + half), rel=1e-12)
    assert compare({0: 3.0}, {0: 3.1, 1: 3.2}) is None  # 1 seed: no test
    w = compare({0: 1.0, 1: 2.0, 2: 3.0}, {5: 2.0, 6: 4.0})  # different seeds: Welch
    assert not w.paired and w.t == pytest.approx(-1.0 / math.sqrt(1 / 3 + 1), rel=1e-9)
    same = compare({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0})  # no spread of the differences: no test, an exact Δ
    assert same.p is None and same.ci == (0.0, 0.0) and same.within_noise
    assert holm([0.01, None, 0.04, 0.03]) == pytest.approx([0.03, None, 0.06, 0.06])
