"""Profiler traces and memory snapshots: a profiled run's trace holds the training step's
spans; the memory-snapshot switch is checked in one line; its window and the out-of-memory path run
with CUDA's calls replaced at their one seam (launch/run/cuda_memory.py), so they run on any CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from launch.errors import ConfigError
from launch.plan import load_config
from launch.run import cuda_memory
from launch.run.traces import StepTracing, check_memory_snapshot
from tests.helpers import SMALL, TINY

OOM_TEXT = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
    "1.06 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use."
)


@pytest.fixture
def fake_cuda(monkeypatch) -> list[tuple]:
    """The seam answered for a GPU: every call is recorded in order; a dump writes its file."""
    calls: list[tuple] = []
    monkeypatch.setattr(cuda_memory, "available", lambda device: True)
    monkeypatch.setattr(cuda_memory, "start_recording", lambda n: calls.append(("start", n)))
    monkeypatch.setattr(cuda_memory, "stop_recording", lambda: calls.append(("stop",)))

    def dump(path: Path) -> None:
        path.write_bytes(b"snapshot")
        calls.append(("dump", path))

    monkeypatch.setattr(cuda_memory, "dump", dump)
    return calls


def _cfg(tmp_path: Path, *overrides: str):
    return load_config(TINY, [*SMALL, f"run.dir={tmp_path}", *overrides])


def test_a_memory_snapshot_without_cuda_is_refused_in_one_line(tmp_path):
    cfg = _cfg(tmp_path, "train.memory_snapshot.enabled=true")
    with pytest.raises(ConfigError) as err:
        check_memory_snapshot(cfg.train, torch.device("cpu"))
    line = str(err.value)
    assert len(line.splitlines()) == 1 and "train.memory_snapshot.enabled=true" in line and "device is cpu" in line
    check_memory_snapshot(_cfg(tmp_path).train, torch.device("cpu"))  # off: nothing to say
    for bad, key in (("train.memory_snapshot.steps=-1", "steps"), ("train.profile.active=0", "profile.active")):
        with pytest.raises(ConfigError, match=key):
            _cfg(tmp_path, bad)


def test_the_memory_window_records_its_steps_and_dumps_under_the_run_dir(tmp_path, fake_cuda):
    """skip_first=2, steps=3 of a launch resumed at step 10: recording starts after step 12, the
    snapshot of steps 13-15 is dumped after step 15 (memory_snapshot/step_15/rank0.pickle), then off."""
    cfg = _cfg(tmp_path, "train.memory_snapshot.enabled=true", "train.memory_snapshot.skip_first=2")
    tracing = StepTracing(cfg.train, tmp_path, 0, torch.device("cuda"), steps_left=10)
    assert fake_cuda == []
    for step in range(11, 19):
        tracing.step(step)
        if step == 12:
            assert fake_cuda == [("start", 100_000)]
    tracing.close()
    snapshot = tmp_path / "memory_snapshot" / "step_15" / "rank0.pickle"
    assert fake_cuda == [("start", 100_000), ("dump", snapshot), ("stop",)] and snapshot.is_file()
    off = StepTracing(_cfg(tmp_path).train, tmp_path, 0, torch.device("cpu"), steps_left=10)
    assert off._profiler is None and off._memory is None  # off: no profiler, nothing recorded


def test_an_out_of_memory_step_dumps_its_snapshot_before_the_one_line_error(tmp_path, fake_cuda, monkeypatch, capsys):
    """Through launch.loop.main: a step that raises torch.OutOfMemoryError (here the loop's first
    step, the set-up stood in) dumps memory_snapshot/oom_step_1/rank0.pickle, then the run stops
    with one `error:` line naming the step, torch's figures, the fixes and the snapshot; exit 2."""
    import launch.loop as loop

    cfg = _cfg(tmp_path, "train.memory_snapshot.enabled=true", "train.memory_snapshot.skip_first=5")
    tracing = StepTracing(cfg.train, tmp_path, 0, torch.device("cuda"), steps_left=10)

    class StandInTrainer:  # what train() touches of a Trainer on this path
        running = 0

        def fit(self):
            self.running = 1
            raise torch.OutOfMemoryError(OOM_TEXT)

        def out_of_memory(self, err):
            return tracing.out_of_memory(err, self.running)

        def close(self) -> None:
            tracing.close()

    def report(err, rank, *args):
        fake_cuda.append(("error line",))
        real_report(err, rank, *args)

    real_report = loop.report_user_error
    monkeypatch.setattr(loop, "build_trainer", lambda cfg: StandInTrainer())
    monkeypatch.setattr(loop, "report_user_error", report)
    code = loop.main(["--config", TINY, *SMALL, f"run.dir={tmp_path}", "train.memory_snapshot.enabled=true"])
    snapshot = tmp_path / "memory_snapshot" / "oom_step_1" / "rank0.pickle"
    assert code == 2 and snapshot.is_file()
    assert [c[0] for c in fake_cuda] == ["dump", "error line"]  # not recording yet (skip_first=5): the state only
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: rank 0 ran out of GPU memory in step 1"), err
    assert "Tried to allocate 2.00 GiB" in err[0] and "1.06 GiB is free" in err[0] and "Including" not in err[0]
    assert "train.micro_batch_size" in err[0] and str(snapshot) in err[0]


@pytest.mark.slow
def test_a_profiled_run_writes_a_trace_with_the_steps_spans(tmp_path):
    """One process, 4 steps, a window of steps 3-4 (skip 1, warm up 1, trace 2): one chrome trace,
    profile/step_4/rank0.json, holding 2 profiler steps with forward, backward and optimizer_step
    spans, and Newton–Schulz (OrScale-LM's step) inside the optimizer step."""
    from tests.helpers import train_in_pool

    train_in_pool(
        [
            f"run.dir={tmp_path}",
            "optim.name=orscale_lm",
            "train.max_steps=4",
            "train.eval_every=0",
            "train.profile.enabled=true",
            "train.profile.skip_first=1",
            "train.profile.active=2",
        ]
    )
    traces = sorted((tmp_path / "profile").rglob("*.json"))
    assert traces == [tmp_path / "profile" / "step_4" / "rank0.json"]
    events = [e for e in json.loads(traces[0].read_text())["traceEvents"] if e.get("ph") == "X"]
    spans = {name: [e for e in events if e["name"] == name] for name in ("forward", "backward", "optimizer_step")}
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    assert len(steps) == 2 and all(len(found) >= 2 for found in spans.values()), {k: len(v) for k, v in spans.items()}
    assert sorted(e["name"] for e in steps) == ["ProfilerStep#3", "ProfilerStep#4"]  # the run's steps, as logged
    ns = [e for e in events if e["name"] == "newton_schulz"]
    assert ns and all(
        any(o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"] for o in spans["optimizer_step"])
        for e in ns
    ), "a newton_schulz span outside the optimizer step"


def test_traces_number_their_steps_as_the_run_does_and_torch_says_nothing_about_them(tmp_path, capfd, caplog):
    """A launch resumed at step 10, windows of 2 traced steps after 1 of warm-up, twice: the traces are
    profile/step_13 and step_16, their `ProfilerStep#N` spans the run's steps 12-13 and 15-16 as the log
    says; torch's console lines of every window (Kineto's `USDT: ... profiler_start/stop` and the
    second window's "set acc_events=True" warning) are gone, anything else written meanwhile is kept."""
    import logging

    from torch.profiler import profiler as torch_profiler

    torch_profiler._WARNINGS_SHOWN.clear()  # torch warns once per process: as a fresh run would see it
    cfg = _cfg(
        tmp_path,
        "train.profile.enabled=true",
        "train.profile.skip_first=0",
        "train.profile.active=2",
        "train.profile.repeat=2",
    )
    with caplog.at_level(logging.INFO, logger="orscale"):
        tracing = StepTracing(cfg.train, tmp_path, 0, torch.device("cpu"), steps_left=8, start_step=10)
        for step in range(11, 19):
            torch.ones(8, 8).sum()
            if step == 12:
                print("the run's own line", file=sys.stderr, flush=True)
            tracing.step(step)
        tracing.close()
    err = capfd.readouterr().err
    assert "USDT" not in err and "profiler_st" not in err and "acc_events" not in err, err
    assert "the run's own line" in err
    said = [r.getMessage().split(" traced")[0] for r in caplog.records if r.getMessage().startswith("profile:")]
    assert said == ["profile: steps 12-13", "profile: steps 15-16"]
    for last in (13, 16):
        trace = json.loads((tmp_path / "profile" / f"step_{last}" / "rank0.json").read_text())
        steps = sorted({e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")})
        assert steps == [f"ProfilerStep#{last - 1}", f"ProfilerStep#{last}"], steps
