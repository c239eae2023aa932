"""The report's figures read right: the figure title clears two-line panel titles, a panel's title
promises only what is drawn, optimizers at one best LR stay visible in the transfer panel, and a
scale has one name in every section (synthetic run directories, no training)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from report import build as report
from report.figures_scaling import best_vs_width
from report.fmt import order
from report.plots import clip_top, figure, save
from tests.report.test_report import fake_run

OPTIMS = ("adamw", "muon_moonlight", "orscale_lm")
LRS = (1e-3, 2e-3, 4e-3)
SCALES = {"w32": 32, "w64": 64}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Two widths in the sweep layout (scale/optimizer/lr<lr>-seed<seed>), every optimizer's best LR
    2e-3 at both (as often on a coarse grid), its report in root/out."""
    root = tmp_path_factory.mktemp("figures")
    for scale, d in SCALES.items():
        for k, optim in enumerate(OPTIMS):
            for lr in LRS:
                loss = 5.0 - d / 100 + 0.01 * k + 0.2 * abs(LRS.index(lr) - 1)
                run = root / f"runs/{scale}/{optim}/lr{lr:g}-seed0"
                fake_run(run, d_model=d, optim=optim, lr=lr, losses=[loss], nonemb=12 * d * d)
    report.build_report(root / "runs", root / "out")
    return root


def test_the_figure_title_clears_two_line_panel_titles(tmp_path):
    fig, axes = figure(3, w=5.4, h=4.0)
    for ax in axes:
        ax.plot([0, 1], [0, 1])
        ax.set_title("s1: L2 d64, 192 steps × 1,024 tokens\n(y axis cut: the early losses are off the top)", fontsize=9)
    save(fig, tmp_path / "f.png", "Validation loss during training at each optimizer's best LR")
    renderer = fig.canvas.get_renderer()
    title = fig.texts[0].get_window_extent(renderer)
    for ax in axes:
        panel = ax.title.get_window_extent(renderer)
        assert panel.y1 < title.y0, (panel, title)  # pixels, origin at the bottom
        assert ax.get_window_extent(renderer).y1 < panel.y0


def test_the_scaling_panel_promises_no_fit_below_four_scales(sweep):
    text = Image.open(sweep / "out/loss_vs_params.png").text  # the PNG's own title and panel titles
    assert text["Title"] == "Scaling with model size"
    assert "no L(N) fit: it needs ≥ 4 scales" in text["Description"] and "band" not in text["Description"]


def test_optimizers_at_one_best_lr_stay_visible_in_the_transfer_panel(sweep):
    rep = report.analyse_dir(sweep / "runs")
    names = order(rep.transfer["points"])
    best = {(n, p["d_model"]): p["vertex_lr"] or p["best_lr"] for n in names for p in rep.transfer["points"][n]}
    assert len(names) == 3 and np.allclose(list(best.values()), 2e-3)  # all on one another in data
    fig, (ax,) = figure(1)
    best_vs_width(ax, rep.transfer, names)
    save(fig, sweep / "transfer.png")
    points = [line for line in ax.get_lines() if line.get_linestyle() == "None"]
    assert len({line.get_marker() for line in points}) == 3  # a marker of its own each
    drawn = np.concatenate([ax.transData.transform(line.get_xydata()) for line in points])
    gaps = np.linalg.norm(drawn[:, None] - drawn[None], axis=-1)[np.triu_indices(len(drawn), 1)]
    assert gaps.min() > 4  # pixels apart: none hidden under another
    fits = [line for line in ax.get_lines() if line.get_linestyle() != "None"]
    assert len({line.get_linestyle() for line in fits}) == 3  # coinciding fit lines told apart by style


def test_a_scale_has_one_name_in_every_section(sweep):
    md = (sweep / "out/report.md").read_text()
    for scale, d in SCALES.items():
        assert f"### {scale}: L1 d{d}, 10 steps × 64 tokens" in md  # LR sensitivity
        rows = [line for line in md.splitlines() if line.startswith("| ") and f"d{d}" in line]
        assert rows and all(line.split("|")[1].strip() == scale for line in rows if "[L1,d" in line), rows
        assert f"### tiny[L1,d{d}]" not in md


def test_a_panel_says_its_y_axis_is_cut_only_when_a_loss_lies_above_the_cut():
    x = np.array([100.0, 500.0, 1000.0])
    fig, axes = figure(2)
    early_high, early_within = np.array([[9.0, 5.0, 4.0]]), np.array([[4.5, 4.6, 4.0]])  # 100 tokens: early
    assert clip_top(axes[0], [early_high], [x]) and axes[0].get_ylim()[1] < 9.0
    assert not clip_top(axes[1], [early_within], [x]) and axes[1].get_ylim()[1] >= 4.6


def test_curves_of_one_evaluation_are_not_called_cut(sweep):
    text = Image.open(sweep / "out/val_loss_vs_tokens.png").text
    assert "w32: L1 d32, 10 steps × 64 tokens" in text["Description"] and "cut" not in text["Description"]
