"""The device check's A/B rows (bench/gpu_check.py runs them; docs/gpu.md): each change of the GPU work
measured against the default settings in the same run.

* a/b rows (one process, the A/B preset, AdamW so that no optimizer work blurs them): the head and
  loss left eager under compiled blocks (the loss as it ran before), the whole model compiled
  (`parallel.compile=model`), SDPA on FlashAttention-2 and on cuDNN (`train.attention`), each against
  the throughput phase's row of the default settings (compiled blocks, head and loss; no sharding).
* Newton–Schulz a/b: OrScale-LM's optimizer step alone on a preset's matrices (random gradients, no
  model), before (elementwise passes eager, cuBLAS's full products), with the passes compiled, and
  after (compiled passes and the symmetric Triton kernels).
* zero2: DeepSpeed ZeRO-2 rows, DeepSpeed unpacked from a wheelhouse (the GPU image has none and no
  network): `bash bench/make_wheelhouse.sh` builds it beside the repo; `--wheelhouse` names another.
"""

from __future__ import annotations

import argparse
import time
import zipfile
from pathlib import Path
from typing import Any

from bench.gpu_phases import DevicePlan, RowSpec, emit, ns_flops, run_rows
from orscale.muon_spec import MuonOptions

# The A/B rows' changes: label -> (config overrides, eager head). Against the throughput row of the
# same preset and optimizer, which runs the defaults.
AB_ROWS: dict[str, tuple[tuple[str, ...], bool]] = {
    "loss eager": ((), True),
    "compile model": (("parallel.compile=model",), False),
    "attention flash": (("train.attention=flash",), False),
    "attention cudnn": (("train.attention=cudnn",), False),
    "attention math": (("train.attention=math",), False),
}
GPU_AB = ("loss eager", "compile model", "attention flash", "attention cudnn")
CPU_AB = ("attention flash", "attention math")  # the CPU has neither compiled blocks nor cuDNN
AB_OPTIM = "adamw"
# Newton–Schulz variants: label -> (compile the elementwise passes: None = the default, on CUDA; NS kernel)
NS_VARIANTS: dict[str, tuple[bool | None, str]] = {
    "before": (False, "torch"),
    "compiled passes": (True, "torch"),
    "after": (None, "auto"),
}


def ab_rows(args: argparse.Namespace, plan: DevicePlan) -> None:
    names = GPU_AB if args.device == "cuda" else CPU_AB
    specs = [
        RowSpec(plan.ab_preset, AB_OPTIM, "none", overrides=AB_ROWS[n][0], eager_head=AB_ROWS[n][1], variant=n)
        for n in names
    ]
    run_rows(args, plan, specs, fresh_graphs=True)


def zero2_rows(args: argparse.Namespace, plan: DevicePlan) -> None:
    run_rows(args, plan, [RowSpec(plan.ab_preset, o, "zero2", variant="zero2") for o in ("adamw", "orscale_lm")])


def ns_ab(args: argparse.Namespace, plan: DevicePlan) -> None:
    """OrScale-LM's step over each preset's matrices (fp32 weights, gradients drawn once), per variant:
    `plan.warmup` steps, then `plan.steps` timed (CUDA events, read after the last synchronize)."""
    import gc

    import torch

    from models import GPT, get_preset
    from orscale import MuonFamily, OptimConfig
    from orscale.muon_spec import muon_family_kwargs
    from orscale.ns_kernels import symmetric_flops
    from orscale.routing import route_parameters

    dev = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    for preset in plan.ns_presets:
        with torch.device("meta"):
            model = GPT(get_preset(preset))
        shapes = [tuple(p.shape) for _, p in route_parameters(model, OptimConfig(name="orscale_lm")).matrices]
        gen = torch.Generator(device=dev).manual_seed(0)
        for label in plan.ns_variants:
            compiled, kernel = NS_VARIANTS[label]
            cfg = OptimConfig(name="orscale_lm").with_options(
                MuonOptions(ns_dtype="bf16", compile_passes=compiled, ns_kernel=kernel)
            )
            params = [
                (f"blocks.{i}.w", torch.nn.Parameter(torch.randn(s, device=dev, generator=gen) * 0.02))
                for i, s in enumerate(shapes)
            ]
            for _, p in params:
                p.grad = torch.randn(p.shape, device=dev, generator=gen)
            opt = MuonFamily(params, **muon_family_kwargs(cfg))
            times = []
            for i in range(plan.warmup + plan.steps):
                t0 = _mark(dev)
                opt.step()
                times.append((t0, _mark(dev))) if i >= plan.warmup else None
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            ms = [(b.elapsed_time(e) if dev.type == "cuda" else (e - b) * 1e3) for b, e in times]
            symmetric = kernel == "auto" and dev.type == "cuda"
            flops = sum((symmetric_flops if symmetric else ns_flops)(s, cfg.own(MuonOptions).ns_steps) for s in shapes)
            step_ms = sum(ms) / len(ms)
            row = {"preset": preset, "variant": label, "compile_passes": compiled, "ns_kernel": kernel}
            row |= {"matrices": len(shapes), "opt_ms": step_ms, "ns_tflop": flops / 1e12}
            row |= {"ns_tflops_per_s": flops / (step_ms / 1e3) / 1e12}
            emit(args.rows, row)
            del opt, params
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()


def _mark(dev: Any) -> Any:
    import torch

    if dev.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def unpack_wheelhouse(wheelhouse: Path, target: Path) -> list[str]:
    """Every wheel of `wheelhouse` unpacked into `target` (a wheel is a zip of its import tree): put on
    PYTHONPATH, its packages import without pip or a network. Returns the wheels' file names."""
    target.mkdir(parents=True, exist_ok=True)
    wheels = sorted(wheelhouse.glob("*.whl"))
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(target)
    return [w.name for w in wheels]


def ab_markdown(res: dict[str, Any]) -> list[str]:
    """The A/B tables: each changed row against the default row of its preset and optimizer."""
    base = {(r["preset"], r["optim"]): r for r in res.get("throughput", []) if "error" not in r}
    lines: list[str] = []
    pairs = []
    for r in [*res.get("ab", []), *res.get("zero2", [])]:
        ref = base.get((r.get("preset"), r.get("optim")))
        if "error" in r or ref is None:
            pairs.append([r.get("variant", "?"), r.get("optim", "?"), r.get("error", "no default row"), "—", "—"])
            continue
        ratio = r["tokens_per_s"] / ref["tokens_per_s"]
        pairs.append(
            [r["variant"], r["optim"], f"{r['tokens_per_s']:,.0f}", f"{ref['tokens_per_s']:,.0f}", f"{ratio:.3f}"]
        )
    if pairs:
        lines += ["", "## A/B: each change against the default settings", ""]
        lines += [
            "Default: no sharding, compiled blocks with the head and loss, fused AdamW, SDPA's `train.attention` auto."
        ]
        lines += ["", *table(["variant", "optimizer", "tokens/s", "default tokens/s", "variant / default"], pairs)]
    ns = res.get("ns_ab", [])
    if ns:
        before = {r["preset"]: r["opt_ms"] for r in ns if r["variant"] == "before"}
        rows = [
            [r["preset"], r["variant"], f"{r['opt_ms']:.2f}", f"{r['ns_tflop']:.1f}", f"{r['ns_tflops_per_s']:.0f}"]
            + [f"{before[r['preset']] / r['opt_ms']:.2f}" if r["preset"] in before else "—"]
            for r in ns
        ]
        lines += ["", "## Newton–Schulz A/B: OrScale-LM's optimizer step alone", ""]
        lines += [
            "before: elementwise passes eager, cuBLAS's full products; compiled passes; after: compiled passes and"
        ]
        lines += ["the symmetric Triton kernels (their FLOPs: the upper triangle of tiles of X Xᵀ and A²)."]
        lines += ["", *table(["preset", "variant", "step ms", "NS TFLOP", "NS TFLOP/s", "speed-up over before"], rows)]
    return lines


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
