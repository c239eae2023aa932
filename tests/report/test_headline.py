"""The report's "lowest loss" verdict on synthetic run directories: a winner is named only where the
comparison is tuned, i.e. no other optimizer's best LR sits at an edge of its grid."""

from __future__ import annotations

from report import build as report
from tests.report.test_report import fake_run

LRS = (1e-3, 2e-3, 4e-3)
# one row per case (its width): the LR at which each optimizer's loss is lowest
CASES = {
    32: {"adamw": 4e-3, "muon_moonlight": 4e-3, "orscale_lm": 4e-3},  # every best LR at the high edge
    48: {"adamw": 1e-3, "muon_moonlight": 2e-3, "orscale_lm": 2e-3},  # AdamW's at the low edge
    64: {"adamw": 2e-3, "muon_moonlight": 2e-3, "orscale_lm": 4e-3},  # only the lowest loss's at an edge
}


def test_a_winner_is_named_only_where_every_other_best_lr_is_interior(tmp_path):
    for d, best in CASES.items():
        for k, (optim, at) in enumerate(best.items()):  # OrScale-LM lowest, AdamW next (by 0.02)
            for lr in LRS:
                for seed in (0, 1):
                    loss = 4.0 + 0.04 * k - 0.1 * (optim == "orscale_lm") + 0.2 * abs(LRS.index(lr) - LRS.index(at))
                    run = tmp_path / f"runs/d{d}/{optim}/lr{lr:g}-s{seed}"
                    fake_run(run, d_model=d, optim=optim, lr=lr, seed=seed, losses=[loss + 0.01 * seed])
    s = report.build_report(tmp_path / "runs", tmp_path / "out")
    rows = {int(w["scale"].split(",d")[1].split("]")[0]): w for w in s["headline"]["wins"]}
    md = (tmp_path / "out/report.md").read_text()
    table = md.split("### 1. Which optimizer wins")[1].split("Δ = optimizer − reference")[0]
    verdict = {d: next(x for x in table.splitlines() if f",d{d}]" in x).split("|")[-2] for d in CASES}
    for w in rows.values():
        assert w["lowest"] == {"optim": "orscale_lm", "runner_up": "adamw", "margin": w["lowest"]["margin"]}

    assert rows[32]["winner"] is None and rows[32]["untuned"] == ["adamw", "muon_moonlight", "orscale_lm"]
    assert "untuned: no winner (every best LR at an edge" in verdict[32] and "**" not in verdict[32]

    assert rows[48]["winner"] is None and rows[48]["untuned"] == ["adamw"]
    assert "untuned: no winner; lowest OrScale-LM" in verdict[48] and "grid edge: AdamW" in verdict[48]
    assert "**" not in verdict[48]

    assert rows[64]["winner"] == rows[64]["lowest"] and rows[64]["untuned"] == ["orscale_lm"]
    assert verdict[64].strip().startswith("**OrScale-LM**, by 0.0200 over AdamW") and "better still" in verdict[64]
