"""The prepared device check (bench/gpu_check.py): its arithmetic, timetable and report here; what its
rows say ran; its CPU run end to end, as on the GPU image, where `datasets` and `deepspeed` are not
installed."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import gpu_ab as ga
from bench import gpu_check as gc
from bench import gpu_phases as gp
from tests.helpers import ROOT, env

# Installed by a sitecustomize.py on PYTHONPATH in every process of a run (workers, data.prepare,
# train.py): `import datasets` / `import deepspeed` fail as on a machine without them, and
# importlib.util.find_spec answers None, as it does there. Each attempt is logged with its caller.
BLOCKER = """
import importlib.abc, importlib.util, os, sys, traceback

BLOCKED = ("datasets", "deepspeed")


def _note(kind, name):
    frames = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack()[:-2] if "<frozen" not in f.filename]
    with open(os.environ["IMPORT_BLOCK_LOG"], "a") as fh:
        fh.write(f"{kind} {name} <- {' < '.join(reversed(frames[-4:]))}\\n")


class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            _note("import", name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Refuse())
_find_spec = importlib.util.find_spec


def _probe(name, package=None):
    if name.split(".")[0] in BLOCKED:
        _note("probe", name)
        return None
    return _find_spec(name, package)


importlib.util.find_spec = _probe
"""


def blocked_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    site = tmp_path / "blocker"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    log = tmp_path / "blocked_imports.log"
    log.touch()
    return {**env(), "PYTHONPATH": f"{site}:{ROOT}", "IMPORT_BLOCK_LOG": str(log)}, log


def test_ns_flops_is_five_iterations_of_two_gram_products_and_a_square():
    m, n = 768, 3072
    assert gp.ns_flops((n, m), 5) == gp.ns_flops((m, n), 5) == 5 * (4 * m * m * n + 2 * m**3)


def test_error_line_finds_the_exception_among_the_noise():
    log = "step 1\nTraceback (most recent call last):\n  File x\ntorch.OutOfMemoryError: CUDA out of memory.\nbye\n"
    assert gc.error_line(log) == "torch.OutOfMemoryError: CUDA out of memory."
    assert gc.error_line("error: no CUDA device is visible\n") == "error: no CUDA device is visible"
    assert gc.error_line("only\nnoise\n") == "noise"


def test_a_failed_preflight_compile_runs_the_later_phases_eager_and_says_so():
    assert gc.effective_compile("blocks", "ok (3.1 s)") == ("blocks", "")
    mode, note = gc.effective_compile("model", "error: BackendCompilerFailed: triton")
    assert mode == "none" and "BackendCompilerFailed" in note and "eager" in note
    assert gc.effective_compile("none", "skipped (--compile none)") == ("none", "")


def _row(optim: str, fb: float, opt: float, micro: int = 4) -> dict:
    what = {"preset": "125m", "optim": optim, "backend": "fsdp", "micro_batch": micro, "context": 1024}
    return what | {"fwd_bwd_ms": fb, "clip_ms": 1.0, "opt_ms": opt, "step_ms": fb + 1.0 + opt}


def test_comparisons_measure_and_extrapolate_to_the_config_batch():
    rows = [_row("adamw", 100.0, 4.0), _row("muon_moonlight", 100.0, 20.0), _row("orscale_lm", 100.0, 22.0)]
    out = {c["against"]: c for c in gc.comparisons(rows, gp.GPU)}
    assert out["adamw"]["ratio"] == pytest.approx(123 / 105) and out["adamw"]["within"] is False
    assert out["muon_moonlight"]["ratio"] == pytest.approx(123 / 121) and out["muon_moonlight"]["within"]
    accum = 262144 / (4 * 1024)  # configs/125m.yaml's tokens per step over one micro-batch
    assert out["adamw"]["ratio_at_config"] == pytest.approx((100 * accum + 23) / (100 * accum + 5))
    assert out["adamw"]["comparable"]


def test_an_eager_fallback_is_the_first_line_of_the_report():
    res = {"device": "cuda", "budget_s": 480, "total_s": 12.0, "compile": "none", "phases": {}}
    res["compile_note"] = "blocks requested, but the preflight compile gave 'error: no C compiler': ran eager"
    first = gc.markdown(res).splitlines()[0]
    assert first.startswith("**Every phase ran eager") and "no C compiler" in first


def test_the_mfu_legend_states_the_convention_and_the_measured_ceiling():
    legend = gc.mfu_legend({"peak_tflops": 989.4, "matmul_tflops": 701.3})
    assert "989 TFLOP/s" in legend and "701 TFLOP/s (71% of the datasheet)" in legend
    assert "PaLM" in legend and "causal" in legend
    assert "not measured" in gc.mfu_legend({})


@pytest.mark.parametrize(
    "name, tflops",
    [
        ("NVIDIA H100 80GB HBM3", 989.4),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.4),
        ("NVIDIA H200 NVL", 835.0),
        ("NVIDIA GH200 480GB", 989.4),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA L40S", 362.05),
        ("NVIDIA A10", 125.0),
        ("NVIDIA A10G", None),  # not the A10's figure: a name we do not know gets no MFU
        ("NVIDIA RTX 6000 Ada Generation", None),
    ],
)
def test_peak_tflops_by_exact_board(name, tflops):
    from launch.run.meter import peak_tflops_of

    assert peak_tflops_of(name) == tflops


def test_causal_attention_flops_are_half_the_square():
    """The non-causal convention reads ~7% high at 125m/1024 and ~12% at 1.1b/4096."""
    import torch

    from models import GPT, get_preset

    for preset, seq, high in (("125m", 1024, 1.07), ("1.1b", 4096, 1.12)):
        with torch.device("meta"):
            model = GPT(get_preset(preset))
        c = model.cfg
        whole, causal = model.flops_per_token(seq), model.flops_per_token(seq, causal=True)
        assert whole - causal == 6 * c.n_layer * c.d_model * seq
        assert whole / causal == pytest.approx(high, abs=0.005), preset


def test_a_row_that_failed_is_kept_as_its_error_line_beside_the_others():
    rows = [_row("adamw", 100.0, 4.0), {"preset": "125m", "optim": "orscale_lm", "backend": "fsdp", "error": "x"}]
    assert gc.comparisons(rows, gp.GPU) == []  # nothing to compare against a row without numbers
    res = {"device": "cuda", "budget_s": 480, "total_s": 1.0, "compile": "none", "compile_note": "", "phases": {}}
    md = gc.markdown({**res, "fsdp_vs_none": [{**rows[1], "backend": "none", "notes": "error: RuntimeError: x"}]})
    assert "| 125m | orscale_lm | none |" in md and "error: RuntimeError: x |" in md


def test_the_report_renders_a_check_that_stopped_early():
    res = {"device": "cuda", "budget_s": 480, "total_s": 12.0, "compile": "none", "compile_note": ""}
    res["phases"] = {"preflight": {"status": "failed", "timeout_s": 120, "seconds": 3.0, "error": "error: no CUDA"}}
    md = gc.markdown(res)
    assert "| preflight | failed | 3.0 | 120 | error: no CUDA |" in md


@pytest.mark.slow
def test_the_cpu_check_runs_every_phase_without_datasets_or_deepspeed(tmp_path):
    """`bash bench/gpu_check.sh --device cpu`: every phase ran, in processes where `datasets` and
    `deepspeed` cannot be imported (the GPU image has neither); one JSON and one table with numbers."""
    run_env, log = blocked_env(tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import datasets"], env=run_env, capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'datasets'" in probe.stderr  # the blocker works
    log.write_text("")
    out = tmp_path / "out"
    cmd = ["bash", str(ROOT / "bench/gpu_check.sh"), "--out", str(out), "--device", "cpu"]
    cmd += ["--wheelhouse", str(tmp_path / "no-wheelhouse")]  # no DeepSpeed: its rows are not run
    proc = subprocess.run(cmd, cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_check.md", "logs"]  # scratch is elsewhere
    res = json.loads((out / "gpu_check.json").read_text())
    scratch = Path(res["scratch"])
    assert scratch.is_dir() and out not in scratch.parents and (scratch / "run" / "checkpoints").is_dir()
    shutil.rmtree(scratch)
    order = gp.phase_order(gp.CPU, zero2=False)
    assert res["order"] == order and [n for n in res["phases"] if n in order] == order  # run in the planned order
    assert set(res["phases"]) == {*order, "zero2", "prepare (background)"}
    assert res["phases"].pop("zero2")["status"] == "not run"  # and the check still passes
    assert all(p["status"] == "ok" for p in res["phases"].values())
    for phase in res["phases"].values():  # every phase's full log comes back with the tables
        assert (out / phase["log"]).is_file()
    assert "done at step 4" in (out / res["phases"]["realtext"]["log"]).read_text()
    assert [r["variant"] for r in res["ab"]] == list(ga.CPU_AB) and all(r["tokens_per_s"] > 0 for r in res["ab"])
    assert [r["attention_ran"] for r in res["ab"]] == ["flash", "math"]  # what each row asked for ran
    assert [(r["preset"], r["variant"]) for r in res["ns_ab"]] == [("tiny", v) for v in gp.CPU.ns_variants]
    assert all(r["opt_ms"] > 0 and r["ns_tflop_executed"] > 0 for r in res["ns_ab"])
    assert {(r["ns"], r["passes"]) for r in res["ns_ab"]} == {("matmul", "eager")}  # what a CPU runs
    rows = res["throughput"]
    assert [r["optim"] for r in rows] == list(gp.OPTIMS)
    for r in rows + res["fsdp_vs_none"]:
        for key in ("tokens_per_s", "model_tflop_per_step", "fwd_bwd_ms", "clip_ms", "opt_ms", "step_ms", "loss"):
            assert isinstance(r[key], float) and r[key] > 0, (r["optim"], key)
    assert {(r["backend"], r["optim"]) for r in res["fsdp_vs_none"]} == {
        (b, o) for b in ("none", "fsdp") for o in gp.COMPARED
    }
    assert {r["param_dtype"] for r in res["fsdp_vs_none"]} == {"fp32"}  # two layouts, one precision
    assert rows[0]["ns_tflop_model"] == 0 < rows[2]["ns_tflop_model"]  # adamw runs no Newton-Schulz
    assert [(r["ns"], r["passes"]) for r in rows] == [(None, None), ("matmul", "eager"), ("matmul", "eager")]
    assert all(r["ns_tflop_executed"] == r["ns_tflop_model"] for r in rows)  # torch's full products ran
    assert {c["against"] for c in res["comparisons"]} == {"adamw", "muon_moonlight"}
    real = res["realtext"]
    assert real["steps"] == 4 and real["val loss"] > 0 and 0 < real["times the run sees the training text"] < 1
    md = (out / "gpu_check.md").read_text()
    headings = ("## Preflight", "## Throughput", "## OrScale-LM's step time", "## FSDP2", "## Real text", "## A/B")
    for heading in (*headings, "## Newton–Schulz A/B"):
        assert heading in md
    assert "| tiny | orscale_lm | fsdp |" in md
    assert log.read_text() == "", f"datasets/deepspeed were asked for:\n{log.read_text()}"


@pytest.mark.slow
def test_a_failing_phase_is_recorded_and_the_check_still_writes_both_files(tmp_path):
    """--device cuda on a machine without one: the preflight fails with its one line, the device
    phases are not run, the background token shards are still made, and both files are written."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    out = tmp_path / "out"
    cmd = ["bash", str(ROOT / "bench/gpu_check.sh"), "--out", str(out), "--device", "cuda"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    res = json.loads((out / "gpu_check.json").read_text())
    assert res["phases"]["preflight"]["status"] == "failed"
    assert (
        res["phases"]["preflight"]["error"] == "error: no CUDA device is visible (torch.cuda.is_available() is False)"
    )
    assert res["phases"]["prepare (background)"]["status"] == "ok"
    assert "| preflight | failed |" in (out / "gpu_check.md").read_text()


def test_the_wheelhouse_unpacks_into_an_importable_tree(tmp_path, monkeypatch):
    """A wheel is a zip of its import tree: unpacked onto the path, it imports without pip."""
    import importlib
    import importlib.metadata
    import zipfile

    house = tmp_path / "wheels"
    house.mkdir()
    with zipfile.ZipFile(house / "tinypkg-1.0-py3-none-any.whl", "w") as z:
        z.writestr("tinypkg/__init__.py", "VALUE = 7\n")
        z.writestr("tinypkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n")
    assert ga.unpack_wheelhouse(house, tmp_path / "site") == ["tinypkg-1.0-py3-none-any.whl"]
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "tinypkg", raising=False)
    assert importlib.import_module("tinypkg").VALUE == 7 and importlib.metadata.version("tinypkg") == "1.0"


def test_each_change_is_read_against_the_default_row():
    base = {"preset": "125m", "optim": "adamw", "backend": "none", "variant": "", "tokens_per_s": 400_000.0}
    res = {"throughput": [base, {**base, "optim": "orscale_lm", "tokens_per_s": 380_000.0}]}
    res["ab"] = [{**base, "variant": "loss eager", "tokens_per_s": 300_000.0, "attention_ran": "flash"}]
    res["ab"] += [{"preset": "125m", "optim": "adamw", "variant": "attention cudnn", "error": "error: RuntimeError: x"}]
    zero2 = {**base, "optim": "orscale_lm", "backend": "zero2", "variant": "zero2", "tokens_per_s": 342_000.0}
    res["zero2"] = [zero2 | {"attention_ran": "cudnn", "ns": "matmul", "passes": "compiled"}]
    ns = {"preset": "1.1b", "ns": "matmul", "passes": "eager", "ns_tflop_model": 61.6, "mfu_ns_model": 0.41}
    res["ns_ab"] = [
        ns
        | {"variant": "before", "opt_ms": 150.0, "ns_tflop_executed": 61.6, "ns_tflops_per_s_executed": 411.0}
        | {"mfu_ns_executed": 0.41},
        ns
        | {"variant": "after", "ns": "symmetric kernels", "passes": "compiled", "opt_ms": 100.0}
        | {"ns_tflop_executed": 44.6, "ns_tflops_per_s_executed": 446.0, "mfu_ns_executed": 0.45, "mfu_ns_model": 0.62},
    ]
    md = "\n".join(ga.ab_markdown(res))
    assert "| loss eager | adamw | attention flash | 300,000 | 400,000 | 0.750 |" in md
    assert "| zero2 | orscale_lm | attention cudnn, NS matmul, passes compiled | 342,000 | 380,000 | 0.900 |" in md
    assert "| attention cudnn | adamw | — | error: RuntimeError: x |" in md
    assert "| 1.1b | after | symmetric kernels | compiled | 100.00 | 44.6 | 61.6 | 446 | 45.0 | 62.0 | 1.50 |" in md
    assert "| NS TFLOP executed | NS TFLOP full products |" in md and "| MFU executed % | MFU full products % |" in md


def test_newton_schulz_counts_what_ran_executed_and_as_full_products():
    """At 1.1b the full products are ~1.37x what the symmetric kernels execute; with torch's matmuls
    the two counts are one."""
    from models import get_preset

    c = get_preset("1.1b")
    d = c.d_model
    shapes = [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * c.n_layer
    executed, full = gp.ns_work(shapes, 5, "symmetric kernels")
    assert full == sum(gp.ns_flops(s, 5) for s in shapes) and full / executed == pytest.approx(1.37, abs=0.005)
    assert gp.ns_work(shapes, 5, "matmul") == (full, full)


@pytest.mark.usefixtures("one_thread")
# The kernels under the interpreter: ~0.3 CPU-s a launch, 30 launches a step here (3 buckets, 5 iterations).
@pytest.mark.parametrize("self_check", [pytest.param("passes", marks=pytest.mark.slow), "fails"])
def test_a_newton_schulz_row_records_what_ran(self_check, tmp_path, monkeypatch):
    """The "after" row asks for the symmetric kernels. With CUDA's question in `ns_kernels.usable`
    answered for the CPU (the kernels run under Triton's interpreter here), the row says which
    products ran and counts their FLOPs: the kernels where their self-check passed; torch's matmuls,
    with the warning that says why, where it failed (a GPU image without a working Triton)."""
    from orscale import ns_kernels

    monkeypatch.setattr(ns_kernels, "_VERIFIED", {})
    monkeypatch.setattr(ns_kernels, "usable", lambda x: x.dtype == torch.bfloat16 and ns_kernels.verified(x.device))
    if self_check == "fails":

        def no_toolchain(*args, **kwargs):
            raise RuntimeError("triton: no C compiler")

        monkeypatch.setattr(ns_kernels, "symmetric_product", no_toolchain)
    plan = dataclasses.replace(gp.CPU, presets={"tiny": (16, 1, ["model.n_layer=1", "model.d_model=32"])})
    plan = dataclasses.replace(plan, steps=1, warmup=0)
    rows = tmp_path / "rows.jsonl"
    ga.ns_ab(argparse.Namespace(device="cpu", rows=str(rows)), plan)
    before, after = (json.loads(line) for line in rows.read_text().splitlines())
    assert (before["ns"], after["ns"]) == ("matmul", "symmetric kernels" if self_check == "passes" else "matmul")
    shapes = [(96, 32), (32, 32), (128, 32), (32, 128)]
    counted = sum(
        (ns_kernels.symmetric_flops if after["ns"] == "symmetric kernels" else gp.ns_flops)(s, 5) for s in shapes
    )
    assert after["ns_tflop_executed"] == pytest.approx(counted / 1e12)
    assert after["ns_tflop_model"] == pytest.approx(sum(gp.ns_flops(s, 5) for s in shapes) / 1e12)
    assert ("symmetric kernels RuntimeError: triton: no C compiler" in after["notes"]) == (self_check == "fails")


def test_the_gpu_check_fits_540_s_and_every_phase_gets_its_estimate():
    """The planner alone, on a fake clock: with every phase on its estimate, and with every phase
    hanging until it is killed, each gets at least its estimated time and the whole check ends within
    the 540 s a first GPU run may have (the interpreter's start and the last write included)."""
    order = gp.phase_order(gp.GPU, zero2=True)
    assert order[:4] == ["preflight", "newton-schulz a/b", "throughput 125m", "a/b 125m"]
    assert set(gp.GPU.estimates) == set(gp.GPU.timeouts) == set(order)
    start_and_write_s = 20
    for took in (lambda n: gp.GPU.estimates[n], lambda n: math.inf):
        table = gc.rehearse(gp.GPU, order, gp.GPU.budget_s, took)
        for name, phase in table.items():
            assert phase["ran"] and phase["seconds"] >= gp.GPU.estimates[name], (name, phase)
        assert max(p["start"] + p["seconds"] for p in table.values()) + start_and_write_s <= 540


@pytest.mark.slow
def test_the_zero2_rows_run_deepspeed_on_the_cpu(tmp_path):
    """The zero2 worker with the DeepSpeed this venv has (on the GPU: unpacked from the wheelhouse):
    a row per optimizer, the step timed whole (DeepSpeed clips inside it)."""
    rows = tmp_path / "rows.jsonl"
    cmd = [sys.executable, "-m", "bench.gpu_check", "--out", str(tmp_path), "--device", "cpu", "--worker", "zero2"]
    proc = subprocess.run([*cmd, "--rows", str(rows)], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = [json.loads(line) for line in rows.read_text().splitlines()]
    assert [(r["backend"], r["optim"], r["variant"]) for r in got] == [
        ("zero2", o, "zero2") for o in ("adamw", "orscale_lm")
    ]
    assert all(r["tokens_per_s"] > 0 and r["opt_ms"] > 0 and r["clip_ms"] < 0.05 * r["opt_ms"] for r in got)
    # what ran, read through DeepSpeed's wrapper too: the owners' Newton–Schulz on the CPU is torch's
    assert [(r["attention_ran"], r["ns"], r["passes"]) for r in got] == [
        ("flash", None, None),
        ("flash", "matmul", "eager"),
    ]
