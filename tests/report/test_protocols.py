"""The ladder's protocol end to end in miniature: a sweep that tunes both LRs by coordinate
search on seed 0, scores the tuned and the shared points on seeds 1-2, runs OrScale-LM at
Muon+Moonlight's tuned LRs, and carries the points to another token budget (`lr_from`); then the
report, whose protocol numbers are recomputed here from metrics.jsonl and the run directories."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from launch.sweep import sweep_cli
from report.build import build_report
from report.stats import compare
from tests.helpers import MINI_LADDER

SEARCH, SEEDS = 0, [1, 2]
GRIDS = {"adamw": [1e-2, 3e-2, 1e-1], "muon_moonlight": [3e-2, 1e-1, 3e-1], "orscale_lm": [3e-2, 1e-1, 3e-1]}
_DIR = re.compile(r"^lr([0-9.e+-]+)(?:-alr([0-9.e+-]+))?-seed(\d+)$")


def sweep_doc(runs: Path) -> dict:
    shape = {"model.n_layer": 1, "model.n_head": 2, "model.d_model": 16}
    return {
        "base": "configs/tiny.yaml",
        "runs_dir": str(runs),
        "overrides": {**MINI_LADDER, "train.log_every": 4, "train.eval_every": 4, "optim.diagnostics": False},
        "scales": [
            {"label": "m1", **shape},
            {"label": "m1-D2", "lr_from": "m1", **shape, "train.tokens_per_step": 256, "train.micro_batch_size": 8},
        ],
        "optimizers": {**GRIDS, "orscale_lm_transfer": {"name": "orscale_lm", "lr_from": "muon_moonlight"}},
        "lr_search": {"seed": SEARCH, "max_extra": 1, "adamw_lr": {"ratios": [3], "rounds": 1}, "shared": True},
        "seeds": SEEDS,
    }


def final_loss(run_dir: Path) -> float:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"val_loss"' in x]
    return float(lines[-1]["val_loss"])


def points(runs: Path, scale: str, optim: str) -> dict[tuple[float, float, int], Path]:
    """(lr, AdamW-group LR, seed) -> run directory, from the directory names."""
    out = {}
    for p in (runs / scale / optim).iterdir():
        m = _DIR.match(p.name)
        if m:
            lr = float(m[1])
            out[(lr, float(m[2]) if m[2] else lr, int(m[3]))] = p
    return out


def best(runs: Path, scale: str, optim: str, tied_only: bool = False) -> tuple[float, float]:
    """The planner's rule from the logs: lowest final loss on the search seed, ties to the lower point."""
    losses = {
        (lr, a): final_loss(p)
        for (lr, a, s), p in points(runs, scale, optim).items()
        if s == SEARCH and (not tied_only or lr == a)
    }
    return min(losses, key=lambda pt: (losses[pt], pt))


def scored(runs: Path, scale: str, optim: str, point: tuple[float, float]) -> dict[int, float]:
    got = points(runs, scale, optim)
    return {s: final_loss(got[(*point, s)]) for s in SEEDS}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, one_thread):
    tmp = tmp_path_factory.mktemp("protocols")
    spec = tmp / "mini.yaml"
    spec.write_text(yaml.safe_dump(sweep_doc(tmp / "runs")))
    rc = sweep_cli.main([str(spec), "--jobs", "1"])
    summary = build_report(tmp / "runs", tmp / "report")
    return {
        "rc": rc,
        "runs": tmp / "runs",
        "summary": summary,
        "md": (tmp / "report/report.md").read_text(),
        "tmp": tmp,
    }


@pytest.mark.slow
def test_the_search_ran_both_lrs_and_the_plan_records_them(sweep):
    assert sweep["rc"] == 0
    plan = json.loads((sweep["runs"] / "sweep_plan.json").read_text())
    for optim in GRIDS:
        g = plan["groups"][f"m1/{optim}"]
        tuned = best(sweep["runs"], "m1", optim)
        assert (g["best_lr"], g["best_adamw_lr"] or g["best_lr"]) == pytest.approx(tuned)  # the plan file's fields
        assert g["shared_lr"] == pytest.approx(best(sweep["runs"], "m1", optim, tied_only=True)[0])
        assert any(p[1] is not None for p in g["points"])  # the AdamW-group LR was searched
    assert plan["groups"]["m1/orscale_lm_transfer"]["lr_from_optim"] == "muon_moonlight"


@pytest.mark.slow
def test_the_three_protocols_recomputed_from_the_logs(sweep):
    runs, s = sweep["runs"], sweep["summary"]
    for scale in ("m1", "m1-D2"):
        p = s["protocols"][scale]
        tuned_pts = {o: best(runs, "m1", o) for o in GRIDS}  # m1-D2 takes m1's points (lr_from)
        shared_pts = {o: best(runs, "m1", o, tied_only=True) for o in GRIDS}
        for optim in GRIDS:
            t = scored(runs, scale, optim, tuned_pts[optim])
            sh = scored(runs, scale, optim, shared_pts[optim])
            got = p["optims"][optim]
            assert got["tuned"]["mean"] == pytest.approx(np.mean(list(t.values())), abs=1e-12)
            assert got["shared"]["mean"] == pytest.approx(np.mean(list(sh.values())), abs=1e-12)
            assert (got["tuned"]["lr"], got["tuned"]["adamw_lr"]) == pytest.approx(tuned_pts[optim])
        o_t, m_t = (scored(runs, scale, o, tuned_pts[o]) for o in ("orscale_lm", "muon_moonlight"))
        o_s, m_s = (scored(runs, scale, o, shared_pts[o]) for o in ("orscale_lm", "muon_moonlight"))
        gap = p["gaps"]["orscale_lm|muon_moonlight"]
        assert gap["tuned"]["diff"] == pytest.approx(compare(o_t, m_t).diff, abs=1e-12)
        assert gap["shared"]["diff"] == pytest.approx(compare(o_s, m_s).diff, abs=1e-12)
        part = np.mean([(o_s[k] - m_s[k]) - (o_t[k] - m_t[k]) for k in SEEDS])
        assert gap["protocol_part"]["mean"] == pytest.approx(part, abs=1e-12)
        transfer = scored(runs, scale, "orscale_lm_transfer", tuned_pts["muon_moonlight"])
        tr = p["transfer"]["orscale_lm_transfer"]
        assert tr["group"]["mean"] == pytest.approx(np.mean(list(transfer.values())), abs=1e-12)
        assert tr["vs_source"]["muon_moonlight"]["diff"] == pytest.approx(compare(transfer, m_t).diff, abs=1e-12)


@pytest.mark.slow
def test_the_report_names_the_protocols_and_shows_both_lrs(sweep):
    md, s = sweep["md"], sweep["summary"]
    section = md.split("## Protocols")[1].split("\n## ")[0]
    for name in ("**tuned**", "**shared**", "**transfer**", "the protocol's part", "OrScale-LM at Muon+Moonlight"):
        assert name in section, name
    top = md.split("## Protocols")[0]
    assert "OrScale-LM at Moonlight's LRs" not in top  # the headline compares the tuned protocol only
    grid = sweep["tmp"] / "report" / "loss_vs_both_lrs.png"
    assert grid.read_bytes()[:4] == b"\x89PNG" and "loss_vs_both_lrs.png" in md
    fig = {e["optim"]: e for e in s["figures"]["loss_vs_both_lrs"]}
    assert set(fig) == set(GRIDS) and all(len(e["points"]) >= 5 for e in fig.values())
    m1 = next(r for r in s["rows"] if r["scale"] == "m1")
    assert all("adamw_lr" in g and g["by_point"] for g in m1["groups"].values())


def test_a_groups_score_keeps_its_points_adamw_lr():
    """The scored runs at an untied best point carry both LRs (a tied copy would show the shared LR)."""
    import pandas as pd

    from report.runs import Group

    lines = [(1e-3, 1e-3, s, 5.0 + s / 10) for s in (0, 1)] + [(1e-3, 8e-3, s, 4.0 + s / 10) for s in (0, 1, 2)]
    table = pd.DataFrame(lines, columns=["lr", "adamw_lr", "seed", "loss"]).assign(run=None)
    g = Group("adamw", table, select_seed=0, eval_seeds=(1, 2))
    assert g.best == (1e-3, 8e-3) and g.score.point == (1e-3, 8e-3) and sorted(g.score.losses) == [1, 2]
    assert g.two_lrs and g.adamw_line() == [(1e-3, 1e-3), (1e-3, 8e-3)]
    assert g.edge == "highest AdamW-group LR"  # the best is the top of the one line searched through it
