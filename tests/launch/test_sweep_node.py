"""A local sweep on one big node, its answers as such a node gives them (torch's GPU count, the
machine's cores): a cell asking for more GPUs than the node has is refused however many cells run
at once, and the cores are shared among every rank of the cells running at once. The cells' processes
are stand-ins that fail at once (nothing is launched)."""

from __future__ import annotations

import os

import torch
import yaml

from launch.sweep import jobs
from launch.sweep import sweep_cli as sweep


class _Failed:
    """A cell's process that has already failed (rc 1: the sweep goes on to the next cell)."""

    returncode = 1

    def poll(self) -> int:
        return 1


def _sweep(tmp_path, monkeypatch, gpus: int, cores: int, argv: list[str]) -> tuple[int, list[dict]]:
    """`python -m launch.sweep` of 4 cells on a node whose torch sees `gpus` GPUs and whose machine has
    `cores` cores: its exit status, and each started cell's command and OMP_NUM_THREADS."""
    spec = {
        "base": "configs/tiny.yaml",
        "runs_dir": str(tmp_path / "runs"),
        "overrides": {"parallel.backend": "ddp"},
        "scales": ["tiny"],
        "optimizers": ["adamw", "orscale_lm"],
        "lrs": [1e-3, 3e-3],
        "seeds": [0],
    }
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    started: list[dict] = []

    def popen(argv, env, **kwargs):
        started.append({"argv": argv, "threads": env.get("OMP_NUM_THREADS")})
        return _Failed()

    def run(argv, env, **kwargs):  # --jobs 1: one cell after another
        popen(argv, env)
        return _Failed()

    monkeypatch.setattr(jobs.subprocess, "Popen", popen)
    monkeypatch.setattr(jobs.subprocess, "run", run)
    return sweep.main([str(tmp_path / "s.yaml"), *argv]), started


def test_a_cell_needing_more_gpus_than_the_node_has_is_refused_one_cell_at_a_time_too(tmp_path, monkeypatch, capsys):
    rc, started = _sweep(tmp_path, monkeypatch, 8, 128, ["--jobs", "1", "--nproc", "16"])
    err = capsys.readouterr().err
    assert rc == 2 and started == [], started
    assert err.count("\n") == 1 and "--nproc 16 needs 16 GPUs per cell but 8 are visible" in err, err
    assert "lower --nproc to at most 8" in err
    rc, started = _sweep(tmp_path / "fits", monkeypatch, 8, 128, ["--jobs", "1", "--nproc", "8"])
    assert rc == 1 and len(started) == 4  # every cell started (and failed at once: the stand-in)
    assert all("--nproc_per_node=8" in s["argv"] for s in started)


def test_concurrent_cells_share_the_cores_among_all_their_ranks(tmp_path, monkeypatch):
    # 4 cells of 2 ranks at once on 128 cores: 16 threads a rank, 128 in all.
    rc, started = _sweep(tmp_path, monkeypatch, 8, 128, ["--jobs", "4", "--nproc", "2"])
    assert rc == 1 and len(started) == 4 and {s["threads"] for s in started} == {"16"}
    # 8 GPUs hold 2 cells of 4 ranks at once (--jobs 4 asks for more): 128 / (2 x 4) threads a rank.
    rc, started = _sweep(tmp_path / "fewer", monkeypatch, 8, 128, ["--jobs", "4", "--nproc", "4"])
    assert rc == 1 and len(started) == 4 and {s["threads"] for s in started} == {"16"}
    # No GPU: every cell runs at once on the CPU, 2 ranks each: 128 / (4 x 2).
    rc, started = _sweep(tmp_path / "cpu", monkeypatch, 0, 128, ["--jobs", "4", "--nproc", "2"])
    assert rc == 1 and {s["threads"] for s in started} == {"16"}
    rc, started = _sweep(tmp_path / "small", monkeypatch, 0, 6, ["--jobs", "4", "--nproc", "2"])
    assert {s["threads"] for s in started} == {"1"}  # never 0


def test_one_cell_at_a_time_of_several_ranks_gives_each_rank_its_share(tmp_path, monkeypatch):
    # torchrun alone would give each of the 8 ranks one thread: 128 cores / 8 ranks instead.
    rc, started = _sweep(tmp_path, monkeypatch, 8, 128, ["--jobs", "1", "--nproc", "8"])
    assert rc == 1 and len(started) == 4 and {s["threads"] for s in started} == {"16"}
