"""The device check's A/B rows (bench/gpu_check.py runs them; docs/gpu.md): each change of the GPU work
measured against the default settings in the same run.

* a/b rows (one process, the A/B preset, AdamW so that no optimizer work blurs them): the head and
  loss left eager under compiled blocks (the loss as it ran before), the whole model compiled
  (`parallel.compile=model`), SDPA on FlashAttention-2 and on cuDNN (`train.attention`), each against
  the throughput phase's row of the default settings (compiled blocks, head and loss; no sharding).
* Newton–Schulz a/b: OrScale-LM's optimizer step alone on a preset's matrices (random gradients, no
  model), before (elementwise passes eager, cuBLAS's full products), with the passes compiled, and
  after (compiled passes and the symmetric Triton kernels); each row says what ran (a kernel or a
  compile that stepped aside shows there, not only in the phase's log).
* zero2: DeepSpeed ZeRO-2 rows, DeepSpeed unpacked from a wheelhouse (the GPU image has none and no
  network): `bash bench/make_wheelhouse.sh` builds it beside the repo; `--wheelhouse` names another.
"""

from __future__ import annotations

import argparse
import time
import zipfile
from pathlib import Path
from typing import Any

from bench.gpu_phases import DevicePlan, RowSpec, emit, logged_warnings, ns_work, optimizer_ran, run_rows
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
    `plan.warmup` steps, then `plan.steps` timed (CUDA events, read after the last synchronize). Each
    row records what ran (the symmetric kernels step aside when their self-check fails, a pass whose
    compile fails runs eager), Newton–Schulz's FLOPs as executed and as full products, and the warnings
    logged while it ran."""
    import gc

    import torch

    from launch.plan import load_config
    from launch.run.meter import peak_tflops
    from models import GPT
    from orscale import MuonFamily, OptimConfig
    from orscale.muon_spec import muon_family_kwargs
    from orscale.routing import route_parameters

    dev = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    peak = peak_tflops(dev)
    for preset in plan.ns_presets:
        extra = plan.presets[preset][2] if preset in plan.presets else []  # the plan's model overrides
        with torch.device("meta"):
            model = GPT(load_config(None, [f"model.preset={preset}", *extra]).model.resolve())
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
            with logged_warnings() as warned:
                opt = MuonFamily(params, **muon_family_kwargs(cfg))
                times = []
                for i in range(plan.warmup + plan.steps):
                    t0 = _mark(dev)
                    opt.step()
                    times.append((t0, _mark(dev))) if i >= plan.warmup else None
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                ran = optimizer_ran([opt], dev)
            ms = [(b.elapsed_time(e) if dev.type == "cuda" else (e - b) * 1e3) for b, e in times]
            executed, full = ns_work(shapes, cfg.own(MuonOptions).ns_steps, ran["ns"])
            step_s = sum(ms) / len(ms) / 1e3
            row = {"preset": preset, "variant": label, "compile_passes": compiled, "ns_kernel": kernel, **ran}
            row |= {"matrices": len(shapes), "opt_ms": step_s * 1e3}
            row |= {"ns_tflop_executed": executed / 1e12, "ns_tflop_model": full / 1e12}
            row |= {"ns_tflops_per_s_executed": executed / step_s / 1e12, "ns_tflops_per_s_model": full / step_s / 1e12}
            row |= {"mfu_ns_executed": executed / step_s / (peak * 1e12) if peak else None}
            row |= {"mfu_ns_model": full / step_s / (peak * 1e12) if peak else None, "notes": "; ".join(warned)}
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


NS_LEGEND = """Asked for: before, elementwise passes eager and cuBLAS's full products; compiled passes; after,
compiled passes and the symmetric Triton kernels. `NS ran` and `passes ran` say what ran: the kernels
step aside when their self-check fails, a pass whose compile fails runs eager (the warning is in the
row's notes in gpu_check.json). Executed FLOPs count what ran (the kernels compute the upper triangle
of tiles of X Xᵀ and A²); full products count 5·(4m²n + 2m³) a matrix whatever computes them (the
model-FLOPs convention). MFU in % of the device's dense bf16 datasheet peak."""


def ab_markdown(res: dict[str, Any]) -> list[str]:
    """The A/B tables: each changed row against the default row of its preset and optimizer, with what
    each row ran."""
    base = {(r["preset"], r["optim"]): r for r in res.get("throughput", []) if "error" not in r}
    lines: list[str] = []
    pairs = []
    for r in [*res.get("ab", []), *res.get("zero2", [])]:
        ref = base.get((r.get("preset"), r.get("optim")))
        if "error" in r or ref is None:
            pairs.append([r.get("variant", "?"), r.get("optim", "?"), "—", r.get("error", "no default row"), "—", "—"])
            continue
        ratio = r["tokens_per_s"] / ref["tokens_per_s"]
        tokens = [f"{r['tokens_per_s']:,.0f}", f"{ref['tokens_per_s']:,.0f}", f"{ratio:.3f}"]
        pairs.append([r["variant"], r["optim"], ran_summary(r), *tokens])
    if pairs:
        lines += ["", "## A/B: each change against the default settings", ""]
        lines += [
            "Default: no sharding, compiled blocks with the head and loss, fused AdamW, SDPA's `train.attention` auto."
        ]
        lines += ["`ran`: the SDPA kernel the row's profiled step executed (and the Muon family's NS and passes)."]
        head = ["variant", "optimizer", "ran", "tokens/s", "default tokens/s", "variant / default"]
        lines += ["", *table(head, pairs)]
    ns = res.get("ns_ab", [])
    if ns:
        before = {r["preset"]: r["opt_ms"] for r in ns if r["variant"] == "before"}
        pct = lambda v: f"{v * 100:.1f}" if v is not None else "—"
        rows = [
            [r["preset"], r["variant"], str(r.get("ns")), str(r.get("passes")), f"{r['opt_ms']:.2f}"]
            + [f"{r['ns_tflop_executed']:.1f}", f"{r['ns_tflop_model']:.1f}", f"{r['ns_tflops_per_s_executed']:.0f}"]
            + [pct(r.get("mfu_ns_executed")), pct(r.get("mfu_ns_model"))]
            + [f"{before[r['preset']] / r['opt_ms']:.2f}" if r["preset"] in before else "—"]
            for r in ns
        ]
        lines += ["", "## Newton–Schulz A/B: OrScale-LM's optimizer step alone", "", *NS_LEGEND.splitlines()]
        head = ["preset", "variant", "NS ran", "passes ran", "step ms", "NS TFLOP executed", "NS TFLOP full products"]
        head += ["TFLOP/s executed", "MFU executed %", "MFU full products %", "speed-up over before"]
        lines += ["", *table(head, rows)]
    return lines


def ran_summary(row: dict[str, Any]) -> str:
    """What a throughput row ran, in a few words: attention kernel, and NS / passes where there are any."""
    parts = [f"attention {row.get('attention_ran', '?')}"]
    if row.get("ns"):
        parts += [f"NS {row['ns']}", f"passes {row['passes']}"]
    return ", ".join(parts)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
