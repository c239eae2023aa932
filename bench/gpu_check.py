"""The prepared device check: each phase in a process of its own with its own timeout, so one failure
(an OOM, a compile error) is that phase's error line and the others still run. Writes ONE
`<out>/gpu_check.json` and ONE `<out>/gpu_check.md`, both rewritten after every phase, and each
phase's full log under `<out>/logs/` (docs/gpu.md).

    bash bench/gpu_check.sh --out DIR                  # one GPU, within 540 s
    bash bench/gpu_check.sh --out DIR --device cpu     # the same phases at tiny sizes (a test)
    bash bench/gpu_check.sh --out DIR --plan           # the timetable only: nothing runs

Phases, in this order (bench/gpu_phases.phase_order): preflight (device, versions, bf16, a tiny
torch.compile, flash and cuDNN SDPA, a process group); Newton–Schulz before / after on its own; the
defaults of one process at the A/B preset x adamw / muon_moonlight / orscale_lm, the step split into
forward+backward / clip / optimizer; the A/B rows of each change (bench/gpu_ab.py: loss eager,
compile model, flash and cuDNN attention); the other presets (one process each: compiling two
presets in one process recompiles with dynamic shapes); ZeRO-2 with DeepSpeed from a wheelhouse (not
run without one); FSDP2 on one device against no sharding; train.py on GPT-2 token shards of the
bundled corpus (prepared in the background from the start). Every row records what ran: the SDPA
kernel executed, Newton–Schulz's products, the optimizer's passes. Token shards, the run dir and the
unpacked wheelhouse go to --scratch, outside --out by default.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu_ab import ab_markdown, ab_rows, ns_ab, table, unpack_wheelhouse, zero2_rows
from bench.gpu_phases import (
    COMPARED,
    LIMITS,
    MIN_PHASE_S,
    OPTIMS,
    PLANS,
    ROOT,
    DevicePlan,
    phase_order,
    preflight,
    throughput,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/gpu_check.sh", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="gets gpu_check.json and gpu_check.md")
    p.add_argument(
        "--scratch", help="token shards, the run dir, the wheelhouse (default: a new directory under $TMPDIR)"
    )
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--compile", choices=["blocks", "model", "none"], help="default: blocks on cuda, none on cpu")
    p.add_argument("--budget", type=int, help="seconds for the whole check (default: 520 on cuda)")
    p.add_argument("--plan", action="store_true", help="print the phases' timetable and exit: nothing runs")
    p.add_argument(
        "--wheelhouse",
        help="DeepSpeed's wheels for the zero2 rows (default: bench/wheelhouse if present; bench/make_wheelhouse.sh)",
    )
    workers = ["preflight", "throughput", "fsdp_vs_none", "ab", "ns_ab", "zero2"]
    p.add_argument("--worker", choices=workers, help=argparse.SUPPRESS)
    p.add_argument("--preset", help=argparse.SUPPRESS)
    p.add_argument("--rows", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.compile = args.compile or ("blocks" if args.device == "cuda" else "none")
    return args


def error_line(text: str) -> str:
    """What went wrong, in one line: the last exception or `error:` line of a log."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    found = [line for line in lines if re.match(r"^([\w.]+(Error|Exception|Interrupt)\b|error:)", line)]
    return (found or lines or [""])[-1][:300]


def effective_compile(requested: str, preflight_compile: str | None) -> tuple[str, str]:
    """The compile mode of the later phases, and why: eager when the preflight's tiny compile failed."""
    if requested != "none" and not str(preflight_compile).startswith("ok"):
        return "none", f"{requested} requested, but the preflight compile gave {preflight_compile!r}: ran eager"
    return requested, ""


@dataclass
class Timetable:
    """How long each phase may run: its cap (`plan.timeouts`), or what is left of the budget once the
    phases after it keep their estimates (`plan.estimates`; MIN_PHASE_S for one without), whichever
    is less. So a phase that overruns eats the slack, never the estimated time of a later phase, and
    a phase that hangs is cut where the ones after it still get theirs."""

    plan: DevicePlan
    order: list[str]
    deadline: float
    clock: Callable[[], float] = time.monotonic

    def allow(self, name: str) -> float:
        later = self.order[self.order.index(name) + 1 :]
        keep = sum(self.plan.estimates.get(n, MIN_PHASE_S) for n in later)
        return min(self.plan.timeouts.get(name, self.plan.budget_s), self.deadline - self.clock() - keep)


def rehearse(plan: DevicePlan, order: list[str], budget: float, took: Callable[[str], float]) -> dict[str, Any]:
    """The check's timetable with nothing run: per phase its start, timeout and seconds, when phase
    `name` would take `took(name)` seconds (math.inf: it hangs until killed at its timeout)."""
    now = 0.0
    table = Timetable(plan, order, budget, clock=lambda: now)
    out: dict[str, Any] = {}
    for name in order:
        allowed = table.allow(name)
        seconds = min(took(name), allowed) if allowed >= MIN_PHASE_S else 0.0
        out[name] = {"start": now, "timeout": allowed, "seconds": seconds, "ran": allowed >= MIN_PHASE_S}
        now += seconds
    return out


def plan_markdown(plan: DevicePlan, order: list[str], budget: float) -> str:
    """The timetable `--plan` prints: each phase's cap and estimate, and its timeout and end when every
    phase takes its estimate, and when every phase hangs until it is killed."""
    on_time = rehearse(plan, order, budget, lambda n: plan.estimates.get(n, MIN_PHASE_S))
    hanging = rehearse(plan, order, budget, lambda n: math.inf)
    head = ["phase", "cap s", "estimate s", "on time: timeout s", "ends at s", "all hang: timeout s", "ends at s"]
    cells = []
    for n in order:
        a, b = on_time[n], hanging[n]
        cells.append(
            [n, str(plan.timeouts.get(n, "—")), str(plan.estimates.get(n, "—"))]
            + [f"{a['timeout']:.0f}", f"{a['start'] + a['seconds']:.0f}", f"{b['timeout']:.0f}"]
            + [f"{b['start'] + b['seconds']:.0f}"]
        )
    return "\n".join([f"Budget {budget:.0f} s; phases in the order they run.", "", *table(head, cells)])


@dataclass
class Check:
    plan: DevicePlan
    out: Path
    timetable: Timetable
    result: dict[str, Any]
    started: float = field(default_factory=time.monotonic)

    def env(self, extra_path: str = "") -> dict[str, str]:
        # Keep what is on PYTHONPATH already (a test's import blocker): the repo root goes first.
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", ""), extra_path) if p)
        quiet = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
        return {**os.environ, **quiet, "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": path}

    def log(self, name: str) -> Path:
        """A phase's full log, in the results folder beside the tables."""
        return self.out / "logs" / (name.replace(" ", "_").replace("/", "") + ".log")

    def phase(self, name: str, cmd: list[str], rows: bool = True, extra_path: str = "") -> list[dict[str, Any]]:
        """One phase's process under the timeout its timetable allows; records status, seconds, error
        line; returns the rows it wrote. `extra_path`: appended to the process's PYTHONPATH (the
        unpacked wheelhouse)."""
        timeout = self.timetable.allow(name)
        record: dict[str, Any] = self.result["phases"].setdefault(name, {})
        record.update(status="skipped", timeout_s=round(max(timeout, 0)), error=None)
        log = self.log(name)
        rows_path = log.with_suffix(".jsonl")
        rows_path.unlink(missing_ok=True)
        if timeout < MIN_PHASE_S:
            record["error"] = "skipped: the check's time budget is spent"
        else:
            t0 = time.monotonic()
            with open(log, "w") as fh:  # a session of its own: a timeout takes its children (compile workers) along
                full = [*cmd, "--rows", str(rows_path)] if rows else cmd
                env = self.env(extra_path)
                proc = subprocess.Popen(full, cwd=ROOT, env=env, stdout=fh, stderr=fh, start_new_session=True)
                try:
                    rc = proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    rc = proc.wait()
                    record["error"] = f"timed out after {timeout:.0f} s"
            record["seconds"] = round(time.monotonic() - t0, 1)
            record["status"] = "ok" if rc == 0 else "timeout" if record["error"] else "failed"
            record["log"] = str(log.relative_to(self.out))
            if rc != 0:
                text = log.read_text(errors="replace")
                record["error"] = record["error"] or error_line(text) or f"exit code {rc}"
                record["log_tail"] = text.splitlines()[-25:]
        self.write()
        return [json.loads(line) for line in rows_path.read_text().splitlines()] if rows_path.is_file() else []

    def write(self) -> None:
        """Both files, each replaced atomically: a check stopped later keeps what it had."""
        self.result["total_s"] = round(time.monotonic() - self.started, 1)
        files = {"gpu_check.json": json.dumps(self.result, indent=1), "gpu_check.md": markdown(self.result)}
        for name, text in files.items():
            (self.out / (name + ".tmp")).write_text(text + "\n")
            os.replace(self.out / (name + ".tmp"), self.out / name)


def comparisons(rows: list[dict[str, Any]], plan: DevicePlan) -> list[dict[str, Any]]:
    """Per preset, orscale_lm's step time over muon_moonlight's and adamw's: as measured (one
    micro-batch a step) and at configs/<preset>.yaml's tokens per step, where forward+backward
    scales with the accumulation and clip + optimizer stay once a step (an extrapolation)."""
    import yaml

    out = []
    for preset in plan.presets:
        by = {r["optim"]: r for r in rows if r["preset"] == preset and "error" not in r}
        config = ROOT / "configs" / f"{preset}.yaml"
        tokens = yaml.safe_load(config.read_text())["train"]["tokens_per_step"] if config.is_file() else None
        for other, limit in LIMITS.items():
            if "orscale_lm" not in by or other not in by:
                continue
            o, b = by["orscale_lm"], by[other]
            accum = tokens / (o["micro_batch"] * o["context"]) if tokens else None
            at = (lambda r, a=accum: r["fwd_bwd_ms"] * a + r["clip_ms"] + r["opt_ms"]) if accum else None
            ratio = o["step_ms"] / b["step_ms"]
            out.append(
                {"preset": preset, "against": other, "ratio": ratio, "limit": limit, "within": ratio <= limit}
                | {"comparable": o["micro_batch"] == b["micro_batch"], "config_tokens_per_step": tokens}
                | {"ratio_at_config": at(o) / at(b) if at else None}
            )
    return out


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        return f"{value:.2g}" if 0 < abs(value) < 10**-digits else f"{value:,.{digits}f}"
    return str(value)


def _percent(key: str, value: Any) -> Any:
    return value * 100 if key.startswith("mfu") and value is not None else value


# The throughput table's columns (row keys); MFU in %. What ran: attention_ran (the SDPA kernel the
# profiled step executed), ns (Newton–Schulz's products), passes (the Muon family's elementwise passes).
COLUMNS = "preset optim backend variant attention_ran ns passes param_dtype micro_batch context tokens_per_s "
COLUMNS += "mfu_model mfu_model_causal mfu_ns_executed mfu_ns_model mfu_total model_tflop_per_step "
COLUMNS += "ns_tflop_executed ns_tflop_model peak_mem_gib fwd_bwd_ms clip_ms opt_ms step_ms notes"


def _digits(key: str) -> int:
    return 2 if key.endswith("_ms") else 3 if "tflop" in key else 0 if key == "tokens_per_s" else 1


def mfu_legend(pre: dict[str, Any]) -> str:
    """What the MFU columns mean, and the two ceilings they can be read against."""
    peak, found = pre.get("peak_tflops"), pre.get("matmul_tflops")
    ceiling = f"{found:.3g} TFLOP/s" if isinstance(found, (int, float)) else "not measured"
    share = f" ({found / peak:.0%} of the datasheet)" if isinstance(found, (int, float)) and peak else ""
    return (
        f"MFU in % of the device's dense bf16 datasheet peak ({_fmt(peak, 0)} TFLOP/s; the preflight's measured "
        f"{pre.get('matmul', '8192³ bf16')} matmul: {ceiling}{share}). mfu_model counts attention over the "
        "whole T×T square (the PaLM/nanoGPT convention, 6N + 12·L·d·T per token); mfu_model_causal the causal "
        "half that flash attention executes (6N + 6·L·d·T). Newton–Schulz (ns_tflop, mfu_ns): _executed counts "
        "what ran (with `ns` = symmetric kernels, the upper triangle of tiles of X Xᵀ and A²: fewer FLOPs), "
        "_model the full products 5·(4m²n + 2m³) a matrix whatever computes them; mfu_total: mfu_model + "
        "mfu_ns_model (both model FLOPs). attention_ran, ns and passes say what the row ran, not what it asked for."
    )


def markdown(res: dict[str, Any]) -> str:
    pre = res.get("preflight") or {}
    # A check that could not compile measured eager throughput: the reader must see that first.
    lines = [f"**Every phase ran eager, not compiled: {res['compile_note']}.**", ""] if res["compile_note"] else []
    lines += [f"# Device check: {pre.get('device', res['device'])}, torch {pre.get('torch', '?')}", ""]
    lines += [f"{res['total_s']:.0f} s of a {res['budget_s']} s budget; compile: {res['compile']}"]
    if res.get("scratch"):
        lines += ["", f"Each phase's full log: `{res.get('logs', 'logs/')}`; scratch (token shards, the run): "]
        lines[-1] += f"`{res['scratch']}`"
    head = ["phase", "status", "seconds", "timeout s", "error"]
    phases = [
        [n, p["status"], _fmt(p.get("seconds")), str(p.get("timeout_s", "—")), p.get("error") or ""]
        for n, p in res["phases"].items()
    ]
    lines += ["", *table(head, phases)]
    if pre:
        lines += ["", "## Preflight", "", *table(["", ""], [[k, _fmt(v, 2)] for k, v in pre.items()])]
    rows = [*res.get("throughput", []), *res.get("ab", []), *res.get("fsdp_vs_none", []), *res.get("zero2", [])]
    if rows:
        keys = COLUMNS.split()
        lines += ["", "## Throughput (synthetic tokens; train.dtype auto: bf16 autocast on CUDA)", ""]
        lines += [mfu_legend(pre), ""]
        lines += table(keys, [[_fmt(_percent(k, r.get(k)), _digits(k)) for k in keys] for r in rows])
    if res.get("comparisons"):
        titles = "preset;orscale_lm over;step time ratio;limit;within;at the config's tokens/step;same micro-batch"
        fields = ("preset", "against", "ratio", "limit", "within", "ratio_at_config", "comparable")
        cells = [[_fmt(c[k], 3) for k in fields] for c in res["comparisons"]]
        lines += ["", "## OrScale-LM's step time", "", *table(titles.split(";"), cells)]
    fsdp = {(r["optim"], r["backend"]): r["tokens_per_s"] for r in res.get("fsdp_vs_none", []) if "error" not in r}
    pairs = [
        [o, _fmt(fsdp[o, "none"], 0), _fmt(fsdp[o, "fsdp"], 0), _fmt(fsdp[o, "fsdp"] / fsdp[o, "none"], 3)]
        for o in COMPARED
        if (o, "none") in fsdp and (o, "fsdp") in fsdp
    ]
    if pairs:
        lines += ["", "## FSDP2 on one device against no sharding", ""]
        lines += [
            "Both sides fp32 parameters under bf16 autocast (FSDP2's param_dtype=fp32 here): only the layout differs."
        ]
        lines += [""]
        lines += table(["optimizer", "none tokens/s", "fsdp tokens/s", "fsdp / none"], pairs)
    lines += ab_markdown(res)
    if res.get("realtext"):
        lines += ["", "## Real text: train.py, data.source=tokens, the bundled corpus", ""]
        lines += table(["", ""], [[k, _fmt(v, 4)] for k, v in res["realtext"].items()])
    return "\n".join(lines)


def realtext_summary(run_dir: Path, shards: Path) -> dict[str, Any]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    train, val = [r for r in records if "train_loss" in r], [r for r in records if "val_loss" in r]
    corpus = json.loads((shards / "manifest.json").read_text())["tokens"]
    held_out = val[-1]["val_tokens"] if val else 0  # the validation windows come off the front of the stream
    return {
        "steps": train[-1]["step"],
        "tokens trained": train[-1]["tokens"],
        "corpus tokens (validation held out)": f"{corpus:,} ({held_out:,})",
        "times the run sees the training text": round(train[-1]["tokens"] / max(corpus - held_out, 1), 3),
        "first train loss": train[0]["train_loss"],
        "last train loss": train[-1]["train_loss"],
        "val loss": val[-1]["val_loss"] if val else None,
        "tokens/s (last log window)": f"{train[-1]['tokens_per_s']:,.0f}",
        "peak GiB": train[-1].get("peak_mem_gib"),
    }


def orchestrate(args: argparse.Namespace) -> int:
    plan, out = PLANS[args.device], Path(args.out).resolve()
    budget = args.budget or plan.budget_s
    wheelhouse = Path(args.wheelhouse) if args.wheelhouse else ROOT / "bench" / "wheelhouse"
    order = phase_order(plan, zero2=wheelhouse.is_dir())
    if args.plan:
        print(plan_markdown(plan, order, budget))
        return 0
    # Outside --out by default: the realtext run's checkpoint (~1 GB at 125m) is not a result file.
    scratch = Path(args.scratch).resolve() if args.scratch else Path(tempfile.mkdtemp(prefix="orscale-gpu-check-"))
    scratch.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    result = {"device": args.device, "budget_s": budget, "compile": args.compile, "compile_note": "", "phases": {}}
    result |= {"order": order, "scratch": str(scratch), "logs": str(out / "logs")}
    check = Check(plan, out, Timetable(plan, order, time.monotonic() + budget), result)
    # The token shards, in the background from the start: CPU work that overlaps the device phases.
    shards, prep_t0 = scratch / "tokens", time.monotonic()
    prep_cmd = [sys.executable, "-m", "data.prepare", "--config", "configs/tiny.yaml", "--out", str(shards)]
    with open(check.log("prepare"), "w") as fh:
        prep = subprocess.Popen([*prep_cmd, "--no-progress"], cwd=ROOT, env=check.env(), stdout=fh, stderr=fh)

    def prepared(wait_s: float) -> bool:
        """The token shards' process, waited for up to `wait_s` (then stopped), recorded as a phase."""
        if "prepare (background)" not in result["phases"]:
            try:
                rc = prep.wait(timeout=max(wait_s, 1))
            except subprocess.TimeoutExpired:
                prep.kill()
                rc = prep.wait()
            log = check.log("prepare")
            result["phases"]["prepare (background)"] = {
                "status": "ok" if rc == 0 else "failed",
                "timeout_s": "—",
                "seconds": round(time.monotonic() - prep_t0, 1),
                "error": None if rc == 0 else error_line(log.read_text(errors="replace")) or f"exit code {rc}",
                "log": str(log.relative_to(out)),
            }
        return result["phases"]["prepare (background)"]["status"] == "ok"

    me = [sys.executable, "-m", "bench.gpu_check", "--out", str(out), "--device", args.device]
    result["throughput"] = []
    for name in order:  # bench/gpu_phases.phase_order: what a first run must learn comes first
        if name == "preflight":
            pre = check.phase(name, [*me, "--worker", "preflight", "--compile", args.compile])
            result["preflight"] = pre[0] if pre else None
            compile_mode, result["compile_note"] = effective_compile(
                args.compile, pre[0].get("compile") if pre else None
            )
            result["compile"] = compile_mode
            me += ["--compile", compile_mode]
            if result["phases"]["preflight"]["status"] != "ok":
                break  # no device: the device phases are not run
        elif name.startswith("throughput "):
            preset = name.removeprefix("throughput ")
            result["throughput"] += check.phase(name, [*me, "--worker", "throughput", "--preset", preset])
            result["comparisons"] = comparisons(result["throughput"], plan)
        elif name.startswith("a/b "):
            result["ab"] = check.phase(name, [*me, "--worker", "ab"])
        elif name == "newton-schulz a/b":
            result["ns_ab"] = check.phase(name, [*me, "--worker", "ns_ab"])
        elif name == "zero2":  # DeepSpeed from its wheels, unpacked into the scratch (no pip, no network)
            site = scratch / "site"
            result["wheelhouse"] = unpack_wheelhouse(wheelhouse, site)
            result["zero2"] = check.phase(name, [*me, "--worker", "zero2"], extra_path=str(site))
        elif name == "fsdp_vs_none":
            result["fsdp_vs_none"] = check.phase(name, [*me, "--worker", "fsdp_vs_none"])
        elif name == "realtext" and not prepared(check.timetable.allow(name) - MIN_PHASE_S):
            result["phases"][name] = {"status": "skipped", "timeout_s": "—", "error": "no token shards (see prepare)"}
        elif name == "realtext":
            run_dir = scratch / "run"
            shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run every time the check runs
            real = f"data.source=tokens data.data_files=[{shards}] optim.name=orscale_lm "
            real += f"parallel.compile={result['compile']} train.device={args.device} train.eval_every=0 "
            real += f"train.progress=false run.dir={run_dir}"
            cmd = [sys.executable, "train.py", "--config", "configs/tiny.yaml", *plan.real, *real.split()]
            check.phase(name, cmd, rows=False)
            if result["phases"][name]["status"] == "ok":
                result["realtext"] = {"command": " ".join(cmd[1:]), **realtext_summary(run_dir, shards)}
    if "zero2" not in order and result["phases"]["preflight"]["status"] == "ok":
        result["phases"]["zero2"] = {"status": "not run", "timeout_s": "—", "error": f"no wheelhouse at {wheelhouse}"}
    prepared(check.timetable.deadline - time.monotonic())
    check.write()
    print(markdown(result))
    failed = [n for n, p in result["phases"].items() if p["status"] not in ("ok", "not run")]
    print(f"\nwrote {out / 'gpu_check.json'}, {out / 'gpu_check.md'} and {out / 'logs'}/; phases not ok: ", end="")
    print(", ".join(failed) or "none")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = PLANS[args.device]
    if args.worker is None:
        return orchestrate(args)
    # To the phase's log, and into the row they happened in (gpu_phases.logged_warnings).
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.worker == "preflight":
        preflight(args)
    elif args.worker == "throughput":  # the defaults of one process: no sharding
        throughput(args, plan, [args.preset], ["none"], OPTIMS)
    elif args.worker == "ab":
        ab_rows(args, plan)
    elif args.worker == "ns_ab":
        ns_ab(args, plan)
    elif args.worker == "zero2":
        zero2_rows(args, plan)
    else:
        throughput(args, plan, [plan.compared], ["none", "fsdp"], COMPARED, param_dtype="fp32")
    return 0


if __name__ == "__main__":
    sys.exit(main())
