"""The prepared device check: each phase in a process of its own with its own timeout, so one failure
(an OOM, a compile error) is that phase's error line and the others still run. Writes ONE
`<out>/gpu_check.json` and ONE `<out>/gpu_check.md`, both rewritten after every phase (docs/gpu.md).

    bash bench/gpu_check.sh --out DIR                  # one GPU, under 10 minutes
    bash bench/gpu_check.sh --out DIR --device cpu     # the same phases at tiny sizes (a test)

Phases: preflight (device, versions, bf16, a tiny torch.compile, flash and cuDNN SDPA, a process
group); throughput with the defaults of one process, one process per preset (compiling two presets
in one process recompiles with dynamic shapes) x adamw / muon_moonlight / orscale_lm, the step split
into forward+backward / clip / optimizer; the A/B rows of each change (bench/gpu_ab.py: loss eager,
compile model, flash and cuDNN attention); Newton–Schulz before / after on its own; FSDP2 on one
device against no sharding; ZeRO-2 with DeepSpeed from a wheelhouse (not run without one); train.py
on GPT-2 token shards of the bundled corpus (prepared in the background from the start). Token
shards, the run dir and logs go to --scratch, outside --out by default, so that --out holds the two
result files only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu_ab import ab_markdown, ab_rows, ns_ab, table, unpack_wheelhouse, zero2_rows
from bench.gpu_phases import COMPARED, LIMITS, OPTIMS, PLANS, RESERVE_S, ROOT, DevicePlan, preflight, throughput


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/gpu_check.sh", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="gets gpu_check.json and gpu_check.md")
    p.add_argument("--scratch", help="token shards, the run dir and logs (default: a new directory under $TMPDIR)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--compile", choices=["blocks", "model", "none"], help="default: blocks on cuda, none on cpu")
    p.add_argument("--budget", type=int, help="seconds for the whole check (default: 600 on cuda)")
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
class Check:
    plan: DevicePlan
    out: Path
    scratch: Path
    deadline: float
    result: dict[str, Any]
    started: float = field(default_factory=time.monotonic)

    def env(self, extra_path: str = "") -> dict[str, str]:
        # Keep what is on PYTHONPATH already (a test's import blocker): the repo root goes first.
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", ""), extra_path) if p)
        quiet = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
        return {**os.environ, **quiet, "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": path}

    def phase(
        self, name: str, cmd: list[str], keep_s: float, rows: bool = True, extra_path: str = ""
    ) -> list[dict[str, Any]]:
        """One phase's process under its timeout (its own, capped so that the phases still to come
        keep `keep_s` seconds); records status, seconds, error line; returns the rows it wrote.
        `extra_path`: appended to the process's PYTHONPATH (the unpacked wheelhouse)."""
        left = self.deadline - time.monotonic() - keep_s
        timeout = min(self.plan.timeouts.get(name, self.plan.budget_s), left)
        record: dict[str, Any] = self.result["phases"].setdefault(name, {})
        record.update(status="skipped", timeout_s=round(max(timeout, 0)), error=None)
        stem = self.scratch / "logs" / name.replace(" ", "_").replace("/", "")
        rows_path, log = stem.with_suffix(".jsonl"), stem.with_suffix(".log")
        rows_path.unlink(missing_ok=True)
        if timeout < 20:
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


# The throughput table's columns (row keys); MFU in %.
COLUMNS = (
    "preset optim backend variant param_dtype micro_batch context tokens_per_s mfu_model mfu_model_causal mfu_opt "
)
COLUMNS += "mfu_total model_tflop_per_step "
COLUMNS += "opt_tflop_per_step peak_mem_gib fwd_bwd_ms clip_ms opt_ms step_ms notes"


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
        "half that flash attention executes (6N + 6·L·d·T). mfu_opt and opt_tflop: Newton-Schulz; mfu_total: model "
        "(non-causal) + Newton-Schulz."
    )


def markdown(res: dict[str, Any]) -> str:
    pre = res.get("preflight") or {}
    # A check that could not compile measured eager throughput: the reader must see that first.
    lines = [f"**Every phase ran eager, not compiled: {res['compile_note']}.**", ""] if res["compile_note"] else []
    lines += [f"# Device check: {pre.get('device', res['device'])}, torch {pre.get('torch', '?')}", ""]
    lines += [f"{res['total_s']:.0f} s of a {res['budget_s']} s budget; compile: {res['compile']}"]
    if res.get("scratch"):
        lines += ["", f"Scratch (token shards, the run, logs): `{res['scratch']}`"]
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
    # Outside --out by default: the realtext run's checkpoint (~1 GB at 125m) is not a result file.
    scratch = Path(args.scratch).resolve() if args.scratch else Path(tempfile.mkdtemp(prefix="orscale-gpu-check-"))
    (scratch / "logs").mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    budget = args.budget or plan.budget_s
    result = {"device": args.device, "budget_s": budget, "compile": args.compile, "compile_note": "", "phases": {}}
    result["scratch"] = str(scratch)
    check = Check(plan, out, scratch, time.monotonic() + budget, result)
    # The token shards, in the background from the start: CPU work that overlaps the device phases.
    shards, prep_t0 = scratch / "tokens", time.monotonic()
    prep_cmd = [sys.executable, "-m", "data.prepare", "--config", "configs/tiny.yaml", "--out", str(shards)]
    with open(scratch / "logs" / "prepare.log", "w") as fh:
        prep = subprocess.Popen([*prep_cmd, "--no-progress"], cwd=ROOT, env=check.env(), stdout=fh, stderr=fh)
    me = [sys.executable, "-m", "bench.gpu_check", "--out", str(out), "--device", args.device]
    # What the phases still to come keep: RESERVE_S each, and the realtext phase a floor of its own
    # (it compiles an evaluation graph and writes a checkpoint, so it cannot live on leftovers).
    keep = lambda phases_left: RESERVE_S * phases_left + plan.realtext_floor_s
    wheelhouse = Path(args.wheelhouse) if args.wheelhouse else ROOT / "bench" / "wheelhouse"
    later = ["a/b", "newton-schulz a/b", "fsdp_vs_none"] + (["zero2"] if wheelhouse.is_dir() else [])
    first = [*me, "--worker", "preflight", "--compile", args.compile]
    pre = check.phase("preflight", first, keep(len(plan.presets) + len(later)))
    result["preflight"] = pre[0] if pre else None
    result["compile"], result["compile_note"] = effective_compile(args.compile, pre[0].get("compile") if pre else None)
    ok = result["phases"]["preflight"]["status"] == "ok"  # else no device: the device phases are not run
    me += ["--compile", result["compile"]]
    result["throughput"] = []
    for i, preset in enumerate(plan.presets if ok else []):
        worker = [*me, "--worker", "throughput", "--preset", preset]
        result["throughput"] += check.phase(
            f"throughput {preset}", worker, keep(len(plan.presets) - i - 1 + len(later))
        )
        result["comparisons"] = comparisons(result["throughput"], plan)
    if ok:
        result["ab"] = check.phase(f"a/b {plan.ab_preset}", [*me, "--worker", "ab"], keep(len(later) - 1))
        result["ns_ab"] = check.phase("newton-schulz a/b", [*me, "--worker", "ns_ab"], keep(len(later) - 2))
        result["fsdp_vs_none"] = check.phase("fsdp_vs_none", [*me, "--worker", "fsdp_vs_none"], keep(len(later) - 3))
    if ok and wheelhouse.is_dir():  # DeepSpeed from its wheels, unpacked into the scratch (no pip, no network)
        site = scratch / "site"
        result["wheelhouse"] = unpack_wheelhouse(wheelhouse, site)
        result["zero2"] = check.phase("zero2", [*me, "--worker", "zero2"], keep(0), extra_path=str(site))
    elif ok:
        result["phases"]["zero2"] = {"status": "not run", "timeout_s": "—", "error": f"no wheelhouse at {wheelhouse}"}
    try:
        rc = prep.wait(timeout=max(check.deadline - time.monotonic() - plan.realtext_floor_s, 1))
    except subprocess.TimeoutExpired:
        prep.kill()
        rc = prep.wait()
    text = (scratch / "logs" / "prepare.log").read_text(errors="replace")
    result["phases"]["prepare (background)"] = {
        "status": "ok" if rc == 0 else "failed",
        "timeout_s": "—",
        "seconds": round(time.monotonic() - prep_t0, 1),
        "error": None if rc == 0 else error_line(text) or f"exit code {rc}",
    }
    if ok and rc == 0:
        run_dir = scratch / "run"
        shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run every time the check runs
        real = f"data.source=tokens data.data_files=[{shards}] optim.name=orscale_lm "
        real += f"parallel.compile={result['compile']} train.device={args.device} train.eval_every=0 "
        real += f"train.progress=false run.dir={run_dir}"
        cmd = [sys.executable, "train.py", "--config", "configs/tiny.yaml", *plan.real, *real.split()]
        check.phase("realtext", cmd, 0, rows=False)
        if result["phases"]["realtext"]["status"] == "ok":
            result["realtext"] = {"command": " ".join(cmd[1:]), **realtext_summary(run_dir, shards)}
    check.write()
    print(markdown(result))
    failed = [n for n, p in result["phases"].items() if p["status"] not in ("ok", "not run")]
    print(f"\nwrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'}; phases not ok: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = PLANS[args.device]
    if args.worker is None:
        return orchestrate(args)
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
