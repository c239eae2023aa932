"""What the report reads from a run directory beyond launch/run/records.py's fast summary: the
Muon-family diagnostics per matrix class (records keeps `diag/all/*` only) and the downstream
accuracies (the loop's `eval/<task>/*` records, or `launch.evaluate`'s JSON on the final checkpoint).
Read only for the runs a figure or table shows (the best LR's seeds), each file once.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from launch.run.records import RunRecord, finite

CLASSES = ("attn_qkv", "attn_out", "mlp_up", "mlp_down")
CLASS_NAMES = {"attn_qkv": "attention QKV", "attn_out": "attention out", "mlp_up": "MLP up", "mlp_down": "MLP down"}
DIAG_SAMPLES = 96  # training lines with diagnostics kept per run (evenly spaced, plus the last)
_STEP_JSON = re.compile(r"^step_(\d+)\.json$")


@lru_cache(maxsize=512)
def _lines(path: Path, needle: bytes) -> tuple[bytes, ...]:
    try:
        data = path.read_bytes()
    except OSError:
        return ()
    return tuple(line for line in data.split(b"\n") if needle in line)


def _parse(line: bytes) -> dict | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and isinstance(obj.get("step"), int) else None


def diag_series(run: RunRecord) -> list[dict[str, Any]]:
    """Evenly spaced training records carrying `diag/<class>/<field>` (step, tokens, diag keys)."""
    lines = _lines(run.path / "metrics.jsonl", b'"diag/')
    if not lines:
        return []
    n, k = len(lines), min(DIAG_SAMPLES, len(lines))
    picks = sorted({round(i * (n - 1) / max(k - 1, 1)) for i in range(k)} | {n - 1})
    out: dict[int, dict] = {}
    for i in picks:
        obj = _parse(lines[i])
        if obj is not None:
            out[obj["step"]] = {k: v for k, v in obj.items() if k in ("step", "tokens") or k.startswith("diag/")}
    return [out[s] for s in sorted(out)]


def _from_json(path: Path) -> dict[str, dict] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if isinstance(doc, dict):
        summ = doc.get("summaries", doc.get("tasks", doc))
    else:
        summ = doc
    if isinstance(summ, list):
        summ = {s.get("task"): s for s in summ if isinstance(s, dict)}
    if not isinstance(summ, dict):
        return None
    out = {str(k): dict(v) for k, v in summ.items() if isinstance(v, dict) and finite(v.get("acc"))}
    for v in out.values():
        v["source"] = path.name
    return out or None


def downstream(run: RunRecord) -> dict[str, dict[str, Any]]:
    """task -> {acc, acc_norm, acc_per_token, n, chance, [acc_ci, ...], primary_metric?, source} at
    the end of training: `downstream.json`, else `downstream/step_<max_steps>.json` (launch.evaluate
    on the final checkpoint), else the last `eval/<task>/*` record of metrics.jsonl at max_steps."""
    final = run.cfg("train.max_steps")
    candidates = [run.path / "downstream.json"]
    folder = run.path / "downstream"
    if folder.is_dir():
        steps = {int(m.group(1)): p for p in folder.iterdir() if (m := _STEP_JSON.match(p.name))}
        if final in steps:
            candidates.append(steps[final])
    for path in candidates:
        if path.is_file():
            got = _from_json(path)
            if got:
                return got
    records = [r for r in map(_parse, _lines(run.path / "metrics.jsonl", b'"eval/')) if r is not None]
    records = [r for r in records if r["step"] == final]
    if not records:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for key, value in records[-1].items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "eval" and finite(value):
            out.setdefault(parts[1], {"source": f"metrics.jsonl step {final}"})[parts[2]] = value
    return {t: v for t, v in out.items() if "acc" in v}
