"""The device check's workers, one process per phase (bench/gpu_check.py runs them): the preflight,
throughput of one preset x optimizer (the step split into forward+backward / clip / optimizer with
CUDA events read once at the end; MFU of the model's and of Newton-Schulz's FLOPs; what ran: the
attention kernel, Newton–Schulz's products, the optimizer's passes), FSDP2 against no sharding. Each
appends its result rows to a JSON Lines file as soon as it has them. The plan of each device (phases,
their order, caps and estimates) is here too."""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OPTIMS = ("adamw", "muon_moonlight", "orscale_lm")
COMPARED = ("adamw", "orscale_lm")  # phase c: FSDP2 against no sharding
LIMITS = {"muon_moonlight": 1.05, "adamw": 1.15}  # orscale_lm's step time may be at most this times theirs
MIN_PHASE_S = 20  # a phase allowed less is skipped; and what a phase with no estimate keeps for itself


@dataclass(frozen=True)
class DevicePlan:
    """What one device runs. presets: name -> (context, micro-batch, model overrides); timeouts: each
    phase's cap; estimates: each phase's expected seconds, which the phases before it leave free."""

    presets: dict[str, tuple[int, int, list[str]]]
    compared: str  # the preset of phase c
    steps: int  # timed steps per (preset, optimizer), after `warmup` untimed ones
    warmup: int
    real: list[str]  # train.py overrides of the real-text run (on configs/tiny.yaml)
    budget_s: int
    timeouts: dict[str, int] = field(default_factory=dict)
    estimates: dict[str, int] = field(default_factory=dict)
    ab_preset: str = "125m"  # the A/B rows' model (bench/gpu_ab.py)
    ns_presets: tuple[str, ...] = ("125m", "1.1b")  # the Newton–Schulz A/B phase's matrix shapes
    ns_variants: tuple[str, ...] = ("before", "compiled passes", "after")  # bench/gpu_ab.NS_VARIANTS


def phase_order(plan: DevicePlan, zero2: bool) -> list[str]:
    """The phases in the order a first run on a GPU must learn them: the device works at all; what no
    GPU has run yet (Newton–Schulz's kernels and compiled passes; then the attention kernels and the
    compile modes, read against the A/B preset's default row, measured just before); the larger
    preset; ZeRO-2 (with a wheelhouse); last what the first H200 run measured already (FSDP2 on one
    device, train.py on real text)."""
    first = [f"throughput {plan.ab_preset}", f"a/b {plan.ab_preset}"]
    rest = [f"throughput {p}" for p in plan.presets if p != plan.ab_preset]
    return ["preflight", "newton-schulz a/b", *first, *rest, *(["zero2"] if zero2 else []), "fsdp_vs_none", "realtext"]


GPU = DevicePlan(
    presets={"125m": (1024, 32, []), "1.1b": (4096, 8, [])},
    compared="125m",
    steps=10,
    warmup=3,
    # The throughput 125m phase's shapes (micro-batch 32 x 1024): its compiled block graph is reused
    # from inductor's on-disk cache; the validation batch is the same size.
    real="model.preset=125m model.max_seq_len=1024 data.seq_len=1024 data.val_tokens=32768 data.val_batch_size=32 "
    "data.logical_shards=8 train.tokens_per_step=32768 train.micro_batch_size=32 train.max_steps=100 "
    "train.log_every=25 optim.lr=1e-3 optim.warmup_steps=10".split(),
    # The estimates (docs/gpu.md) add up to 490 s: 30 s of slack, and 20 s of a 540 s window left for
    # the interpreter's start and the last write.
    budget_s=520,
    timeouts={
        "preflight": 120,
        "newton-schulz a/b": 180,
        "throughput 125m": 150,
        "a/b 125m": 240,
        "throughput 1.1b": 210,
        "zero2": 150,
        "fsdp_vs_none": 120,
        "realtext": 150,
    },
    estimates={
        "preflight": 25,
        "newton-schulz a/b": 90,
        "throughput 125m": 35,
        "a/b 125m": 140,
        "throughput 1.1b": 80,
        "zero2": 45,
        "fsdp_vs_none": 35,
        "realtext": 40,
    },
)
CPU = DevicePlan(
    presets={"tiny": (64, 2, ["model.n_layer=2", "model.d_model=64"])},
    compared="tiny",
    steps=2,
    warmup=1,
    real="model.n_layer=2 model.d_model=64 model.max_seq_len=64 data.seq_len=64 data.val_tokens=1024 "
    "data.logical_shards=4 train.tokens_per_step=512 train.micro_batch_size=4 train.max_steps=4 "
    "train.log_every=2 optim.warmup_steps=2".split(),
    budget_s=1200,
    ab_preset="tiny",
    ns_presets=("tiny",),
    ns_variants=("before", "after"),  # the CPU runs no compiled passes here (inductor's C++: minutes)
)
PLANS = {"cuda": GPU, "cpu": CPU}


# ---------------------------------------------------------------- the workers (one process per phase)
def emit(path: str, row: dict[str, Any]) -> None:
    """One result row, appended at once: a phase killed later keeps what it measured."""
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def _describe(err: BaseException) -> str:
    return f"error: {type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"


def _try(fn: Any) -> Any:
    try:
        return fn()
    except Exception as err:  # recorded, not raised: the orchestrator decides what follows from it
        return _describe(err)


def _sync(dev: Any) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def preflight(args: argparse.Namespace) -> None:
    import platform

    import torch

    from launch.backends.registry import backend_for
    from launch.run.meter import peak_tflops
    from launch.runtime.process_group import init_distributed, shutdown

    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version()}
    info["triton"] = _try(lambda: __import__("triton").__version__)
    info["cuda_visible"] = torch.cuda.is_available()
    if args.device == "cuda" and not torch.cuda.is_available():
        emit(args.rows, info)
        raise SystemExit("error: no CUDA device is visible (torch.cuda.is_available() is False)")
    dev = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info.update(device=props.name, memory_gib=props.total_memory / 2**30, capability=f"{props.major}.{props.minor}")
        info.update(bf16=torch.cuda.is_bf16_supported(), cuda=torch.version.cuda, peak_tflops=peak_tflops(dev))
        info["nccl"] = _try(lambda: ".".join(map(str, torch.cuda.nccl.version())))
    else:
        info.update(device=platform.processor() or platform.machine(), bf16=True, peak_tflops=None)

    def matmul() -> float:  # the dense matrix-product rate as found, the ceiling MFU is read against
        n, dtype = (8192, torch.bfloat16) if dev.type == "cuda" else (256, torch.float32)
        a, b = (torch.randn(n, n, device=dev, dtype=dtype) for _ in range(2))
        for reps in (3, 10):  # warm-up, then timed
            _sync(dev)
            t0 = time.perf_counter()
            for _ in range(reps):
                a @ b
            _sync(dev)
        return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12

    def tiny_compile() -> str:
        x = torch.randn(64, 64, device=dev)
        fn = torch.compile(lambda t: torch.nn.functional.gelu(t @ t.T).sum(), dynamic=False)
        t0 = time.perf_counter()
        got, want = float(fn(x)), float(torch.nn.functional.gelu(x @ x.T).sum())
        if abs(got - want) > 1e-3 * max(1.0, abs(want)):
            raise RuntimeError(f"compiled result {got} != eager {want}")
        return f"ok ({time.perf_counter() - t0:.1f} s)"

    def sdpa(backend: str) -> str:  # the kernel alone, no fallback: it runs here or says why not
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q = torch.randn(1, 8, 1024, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
        with sdpa_kernel([getattr(SDPBackend, backend)]):
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
        return "ok"

    def group() -> str:  # NCCL on CUDA: what FSDP2 on one GPU needs
        env = init_distributed(backend_for("fsdp"), args.device)
        torch.distributed.all_reduce(torch.ones(4, device=env.device))
        shutdown()
        return "ok"

    info["matmul"] = "8192³ bf16" if dev.type == "cuda" else "256³ fp32"
    info["matmul_tflops"] = _try(matmul)
    info["compile"] = "skipped (--compile none)" if args.compile == "none" else _try(tiny_compile)
    if dev.type == "cuda":
        info["sdpa_flash"] = _try(lambda: sdpa("FLASH_ATTENTION"))
        info["sdpa_cudnn"] = _try(lambda: sdpa("CUDNN_ATTENTION"))
    info["process_group"] = _try(group)
    emit(args.rows, info)


@dataclass(frozen=True)
class RowSpec:
    """One throughput row: what `measure` builds and times. `variant` names an A/B row's change
    against the default settings ("" for a row of the defaults)."""

    preset: str
    optim: str
    backend: str
    param_dtype: str = "auto"
    overrides: tuple[str, ...] = ()
    eager_head: bool = False
    variant: str = ""


def throughput(
    args: argparse.Namespace,
    plan: DevicePlan,
    presets: list[str],
    backends: list[str],
    optims: tuple,
    param_dtype: str = "auto",
) -> None:
    """Every preset x optimizer on each backend. `param_dtype`: FSDP2's `parallel.fsdp.param_dtype`;
    fsdp_vs_none passes fp32, so that its FSDP2 rows differ from the `none` rows (fp32 params under
    bf16 autocast) in the layout only."""
    specs = [RowSpec(p, o, b, param_dtype) for b in backends for p in presets for o in optims]
    run_rows(args, plan, specs)


def run_rows(args: argparse.Namespace, plan: DevicePlan, specs: list[RowSpec], fresh_graphs: bool = False) -> None:
    """Measure `specs` in order, each row on its own (a row that raises is kept as its error line);
    an OOM is retried once at half the micro-batch, which the preset's later rows keep. Backends in
    the order given: `none` needs no process group, the others make one (of 1). `fresh_graphs`:
    Dynamo forgets the previous row's graphs (an A/B row that changes a traced choice must not reuse
    them). Each row carries the warnings logged while it ran (a kernel or a compile that stepped aside)."""
    import gc

    import torch

    from launch.backends.registry import backend_for
    from launch.runtime.process_group import init_distributed, shutdown

    micro: dict[str, int] = {}  # a micro-batch halved after an OOM stays halved: later rows stay comparable
    failed: list[str] = []
    envs: dict[str, Any] = {}
    for spec in specs:
        if spec.backend not in envs:
            envs[spec.backend] = init_distributed(backend_for(spec.backend), args.device)
        env, preset = envs[spec.backend], spec.preset
        if fresh_graphs:
            torch._dynamo.reset()
        notes, mb = [], micro.setdefault(preset, plan.presets[preset][1])
        with logged_warnings() as warned:
            while True:
                row = None
                try:
                    row = measure(
                        args, plan, preset, spec.optim, env, mb, spec.param_dtype, spec.overrides, spec.eager_head
                    )
                except torch.cuda.OutOfMemoryError:
                    if mb == 1:
                        raise
                except Exception as err:  # this row's error line; the phase's other rows still run
                    line = _describe(err)
                    row = {"preset": preset, "optim": spec.optim, "backend": spec.backend, "micro_batch": mb}
                    row["error"] = line
                    notes.append(line)
                    failed.append(
                        f"{preset}/{spec.optim}/{spec.backend}{'/' + spec.variant if spec.variant else ''}: {line}"
                    )
                gc.collect()  # the model and optimizers (compiled forwards hold reference cycles)
                if env.device.type == "cuda":
                    torch.cuda.empty_cache()
                if row is not None:
                    break
                notes.append(f"OOM at micro-batch {mb}, retried at {mb // 2}")
                mb = micro[preset] = mb // 2
        emit(args.rows, {**row, "variant": spec.variant, "notes": "; ".join([*notes, *warned])})
    shutdown()
    if failed:
        raise SystemExit(f"error: {len(failed)} row(s) failed; first: {failed[0]}")


@contextmanager
def logged_warnings() -> Iterator[list[str]]:
    """The warnings logged inside (a fallback says so once per process: its row is where it happened),
    as "name: message" lines; they still reach the phase's log."""
    caught: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            caught.append(f"{record.name}: {record.getMessage()}")

    keep, root = Keep(logging.WARNING), logging.getLogger()
    root.addHandler(keep)
    try:
        yield caught
    finally:
        root.removeHandler(keep)


def optimizer_ran(optimizers: list[Any], device: Any) -> dict[str, str | None]:
    """What the Muon family's step ran on `device`, whatever was asked: Newton–Schulz's products
    ("symmetric kernels" when `orscale.ns_kernels` served them, else "matmul": torch's full
    products) and the elementwise passes ("compiled", "eager", or which passes fell back to eager
    after their compile failed). None for both without a Muon-family optimizer."""
    import torch

    from orscale import MuonFamily, muon_passes, ns_kernels
    from orscale.newton_schulz import resolve_ns_dtype

    muons = [o for o in optimizers if isinstance(o, MuonFamily)]
    if not muons:
        return {"ns": None, "passes": None}
    opt = muons[0]
    probe = torch.empty(1, 1, 1, dtype=resolve_ns_dtype(opt.param_groups[0]["ns_dtype"]), device=device)
    kernels = opt.ns_kernel == "auto" and ns_kernels.usable(probe)  # the test newton_schulz makes per batch
    asked = opt.compile_passes if opt.compile_passes is not None else device.type == "cuda"
    failed = muon_passes.failed_passes()
    passes = "eager" if not asked else f"compiled, except {', '.join(failed)} (eager)" if failed else "compiled"
    return {"ns": "symmetric kernels" if kernels else "matmul", "passes": passes}


def ns_work(shapes: list[tuple[int, ...]], steps: int, ns: str | None) -> tuple[float, float]:
    """Newton–Schulz's FLOPs per step over `shapes`: as executed by what ran (`optimizer_ran`'s "ns":
    the symmetric kernels compute the upper triangle of tiles of X Xᵀ and A²), and the full products'
    count (the model-FLOPs convention: what the algorithm asks for, however it is computed)."""
    from orscale.ns_kernels import symmetric_flops

    full = sum(ns_flops(s, steps) for s in shapes)
    return (sum(symmetric_flops(s, steps) for s in shapes) if ns == "symmetric kernels" else full), full


def measure(
    args: argparse.Namespace,
    plan: DevicePlan,
    preset: str,
    optim: str,
    env: Any,
    micro: int,
    param_dtype: str,
    overrides: tuple[str, ...] = (),
    eager_head: bool = False,
) -> dict[str, Any]:
    """Model and optimizers built fresh, synthetic tokens, `plan.warmup` steps, then `plan.steps`
    timed: wall clock for throughput, and per step CUDA events (read once, after the last
    synchronize; perf_counter on CPU) around forward+backward, gradient clipping, optimizer step
    (a ZeRO engine's clip runs inside its step: clip_ms 0); then one more step, untimed, under the
    profiler: which SDPA kernel it executed. `overrides`: config overrides of an A/B row;
    `eager_head`: the head and loss left eager under compiled blocks (the loss as it ran before)."""
    import torch
    from torch._dynamo.utils import counters
    from torch.profiler import ProfilerActivity, profile

    from launch.backends.registry import backend_for
    from launch.backends.torch_native import FSDPOptions
    from launch.engine.parallelize import fsdp_mixed_precision
    from launch.engine.torch_engine import TorchEngine
    from launch.plan import load_config
    from launch.run.meter import peak_tflops
    from launch.runtime.attention import attention_ran
    from launch.runtime.process_group import compute_dtype
    from orscale.muon_spec import MuonOptions
    from orscale.routing import route_parameters
    from orscale.schedule import set_lr

    seq, _, extra = plan.presets[preset]
    settings = f"model.preset={preset} model.max_seq_len={seq} data.seq_len={seq} data.val_tokens={seq} "
    settings += f"data.logical_shards=1 optim.name={optim} parallel.backend={env.backend} "
    settings += f"parallel.compile={args.compile} train.device={args.device} train.micro_batch_size={micro} "
    settings += f"parallel.fsdp.param_dtype={param_dtype} " if env.backend == "fsdp" else ""
    cfg = load_config(None, [*settings.split(), f"train.tokens_per_step={micro * seq}", *extra, *overrides])
    cuda = env.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(env.device)
    resident = torch.cuda.memory_allocated(env.device) / 2**30 if cuda else None  # a leak of the last build shows
    graphs0, t0 = counters["stats"]["unique_graphs"], time.perf_counter()
    dtype = compute_dtype(cfg.train.dtype, env.device)
    engine = backend_for(env.backend).build_engine(
        cfg.model.resolve(), cfg.parallel, cfg.optim, cfg.train, env, dtype, 1
    )
    if eager_head and "head_loss" in engine.model.__dict__:  # the compiled method parallelize set
        del engine.model.__dict__["head_loss"]  # back to GPT.head_loss, eager
    torch_engine = isinstance(engine, TorchEngine)
    if torch_engine:
        set_lr(engine.optimizers, cfg.optim.lr)
    build_s = time.perf_counter() - t0
    gen = torch.Generator(device=env.device).manual_seed(0)
    batch = torch.randint(0, 50257, (micro, seq + 1), device=env.device, generator=gen)

    def mark() -> Any:
        if not cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def train_step(m: list[Any]) -> Any:  # appends a mark after forward+backward, clip, optimizer
        loss = engine.forward_backward(batch, last_micro_batch=True)
        m.append(mark())
        if torch_engine:  # TorchEngine.step's body, split for the clock (no spike guard or centring here)
            norm = torch.nn.utils.clip_grad_norm_(engine.model.parameters(), engine.max_norm)
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
            m.append(mark())
            for opt in engine.optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)
        else:  # DeepSpeed clips inside its step
            m.append(mark())
            engine.step(cfg.optim.lr)
        m.append(mark())
        return loss

    stamps, start = [], 0.0
    for i in range(plan.warmup + plan.steps):
        if i == plan.warmup:
            _sync(env.device)
            start = time.perf_counter()
        m = [mark()]
        loss = train_step(m)
        stamps += [m] if i >= plan.warmup else []
    _sync(env.device)
    wall = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU]) as prof:  # host-side op names: which kernels were called
        train_step([])
        _sync(env.device)
    ms = (lambda a, b: a.elapsed_time(b)) if cuda else (lambda a, b: (b - a) * 1e3)
    fb, clip, step = (sum(ms(m[j], m[j + 1]) for m in stamps) / len(stamps) for j in range(3))
    flops = engine.model.flops_per_token(seq) * micro * seq  # attention non-causal (PaLM convention)
    causal = engine.model.flops_per_token(seq, causal=True) * micro * seq  # what flash attention executes
    # ZeRO: the MuonFamily its owner ranks step (orscale.distributed.zero keeps it as `_muon`).
    optimizers = engine.optimizers if torch_engine else [getattr(engine.optimizer, "_muon", None)]
    ran = optimizer_ran([o for o in optimizers if o is not None], env.device)
    shapes = [tuple(p.shape) for _, p in route_parameters(engine.model, cfg.optim).matrices]
    ns_executed, ns_model = ns_work(shapes, cfg.optim.own(MuonOptions).ns_steps, ran["ns"])
    peak = peak_tflops(env.device)  # dense bf16 TFLOP/s of the device by name (None: unknown, or a CPU)
    mfu = lambda f: f * plan.steps / wall / (peak * 1e12) if peak else None
    peak_mem = torch.cuda.max_memory_allocated(env.device) / 2**30 if cuda else None
    what = {
        "preset": preset,
        "optim": optim,
        "backend": env.backend,
        "compile": cfg.parallel.compile,
        "dtype": str(dtype),
    }
    what |= {
        "attention": cfg.train.attention,  # asked for
        "attention_ran": attention_ran(e.name for e in prof.events()),
        "head_loss": "eager" if eager_head or cfg.parallel.compile == "none" else "compiled",
        **ran,
    }
    fsdp = cfg.parallel.own(FSDPOptions)
    bf16 = env.backend == "fsdp" and fsdp_mixed_precision(fsdp.param_dtype, dtype, env.device).param_dtype
    what["param_dtype"] = "bf16" if bf16 else "fp32"
    size = {"context": seq, "micro_batch": micro, "steps": plan.steps, "tokens_per_s": micro * seq * plan.steps / wall}
    work = {"model_tflop_per_step": flops / 1e12, "ns_tflop_executed": ns_executed / 1e12}
    work |= {"ns_tflop_model": ns_model / 1e12, "mfu_model": mfu(flops), "mfu_model_causal": mfu(causal)}
    rates = {
        "mfu_ns_executed": mfu(ns_executed),
        "mfu_ns_model": mfu(ns_model),
        "mfu_total": mfu(flops + ns_model),
        "peak_mem_gib": peak_mem,
        "resident_before_gib": resident,
    }
    split = {"fwd_bwd_ms": fb, "clip_ms": clip, "opt_ms": step, "step_ms": fb + clip + step}
    more = {"wall_step_ms": wall / plan.steps * 1e3, "loss": float(loss), "build_s": build_s}
    return what | size | work | rates | split | more | {"new_graphs": counters["stats"]["unique_graphs"] - graphs0}


def ns_flops(shape: tuple[int, ...], steps: int) -> float:
    """Newton-Schulz FLOPs of one m x n matrix (m the smaller side) per optimizer step: per iteration
    X Xᵀ (2m²n), A² (2m³), B·X (2m²n)."""
    m, n = sorted(shape[-2:])
    return steps * (4 * m * m * n + 2 * m**3)


# ---------------------------------------------------------------- the orchestrator
