"""Reading run directories back: the one place metrics.jsonl is parsed.

* `read_metrics(path)`: every record of a metrics.jsonl and the lines that do not parse (a resume
  rewrites the file up to its step with it).
* `read_run(dir)`: config.yaml, run.log provenance and metrics, quickly, for `launch.sweep` (is a
  cell finished?) and `launch.report` (everything else). A 20,000-step run logs ~2,000 training
  lines of ~3 KB (the `diag/...` keys) but only ~20 evaluation lines, so this reader never parses
  every line: it finds the evaluation lines with a byte search and json-parses a few evenly spaced
  training lines (enough for throughput medians and diagnostic curves).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from launch.nested import dotted_get, load_yaml

TRAIN_SAMPLES = 64  # training lines parsed per run (evenly spaced, plus the last one)
# Training-line keys the report uses; everything else in a line is dropped right after parsing.
TRAIN_KEYS = (
    "step",
    "tokens",
    "tokens_per_s",
    "mfu",
    "mfu_causal",
    "peak_mem_gib",
    "data_wait_frac",
    "params",
    "non_embedding_params",
    "chinchilla_multiple",
    "diag/all/r",
    "diag/all/cum_frac_rmax",
    "diag/all/frac_rmin",
)
_COMMIT = re.compile(r"git commit (\S+)")
_SETUP = re.compile(r"setup: (\{.*\})\s*$", re.M)


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The records of a metrics.jsonl and the line numbers that do not parse (a kill during a
    write leaves a torn last line)."""
    records, bad = [], []
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            bad.append(i)
    return records, bad


def finite(x: Any) -> bool:
    """JSON null, NaN and infinities all count as non-finite."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class RunRecord:
    path: Path
    config: dict | None = None
    cfg_hash: str = "-"  # first 8 hex of sha256(config.yaml): `sha256sum config.yaml` reproduces it
    commits: list[str] = field(default_factory=list)
    setup: dict = field(default_factory=dict)  # the last `setup: {...}` of run.log (params, ...)
    evals: list[dict] = field(default_factory=list)  # eval lines, sorted by step, one per step
    train: list[dict] = field(default_factory=list)  # sampled training lines (TRAIN_KEYS only)
    last_train: dict | None = None
    torn: bool = False  # the last line of metrics.jsonl is an incomplete write
    bad_lines: int = 0  # unparseable lines other than a torn last one
    problem: str | None = None  # why the run is not finished (None: finished)

    def cfg(self, dotted: str, default: Any = None) -> Any:
        return dotted_get(self.config or {}, dotted, default)

    @property
    def finished(self) -> bool:
        return self.problem is None

    @property
    def final_val(self) -> float | None:
        """Final validation loss (NaN when the logged value is null/NaN) of a finished run."""
        if not self.finished:
            return None
        v = self.evals[-1].get("val_loss")
        return float(v) if finite(v) else math.nan

    @property
    def final_tokens(self) -> int | None:
        return self.evals[-1].get("tokens") if self.evals else None

    @property
    def val_tokens(self) -> int | None:
        for ev in reversed(self.evals):
            if finite(ev.get("val_tokens")):
                return int(ev["val_tokens"])
        return self.cfg("data.val_tokens")


def _loads(line: bytes) -> dict | None:
    try:
        obj = json.loads(line)  # Python's json reads bare NaN/Infinity as floats, null as None
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _slim(obj: dict) -> dict:
    return {k: obj[k] for k in TRAIN_KEYS if k in obj}


def _not_training(line: bytes) -> bool:
    """An evaluation line: validation loss, or downstream accuracies (`eval/<task>/...`)."""
    return b'"val_loss"' in line or b'"eval/' in line


def _sample_metrics(run: RunRecord, data: bytes) -> None:
    """Fill run.evals / run.train / run.last_train / run.torn from metrics.jsonl's bytes."""
    end = len(data)
    if data and not data.endswith(b"\n"):  # every write ends in a newline: the tail is torn
        cut = data.rfind(b"\n") + 1
        tail = _loads(data[cut:])
        if tail is None:
            run.torn = True
            end = cut
    evals: dict[int, dict] = {}
    eval_spans = []
    pos = data.find(b'"val_loss"', 0, end)
    while pos != -1:
        start = data.rfind(b"\n", 0, pos) + 1
        stop = data.find(b"\n", pos, end)
        stop = end if stop == -1 else stop
        obj = _loads(data[start:stop])
        if obj is None or not isinstance(obj.get("step"), int):
            run.bad_lines += 1
        else:
            evals[obj["step"]] = obj  # a resumed run may repeat a step: the later line wins
        eval_spans.append((start, stop))
        pos = data.find(b'"val_loss"', stop, end)
    run.evals = [evals[s] for s in sorted(evals)]

    # Evenly spaced training lines by byte offset, then the last training line.
    samples: dict[int, dict] = {}
    if end:
        offsets = {int(i * end / TRAIN_SAMPLES) for i in range(TRAIN_SAMPLES)}
        starts = sorted({0 if o == 0 else data.rfind(b"\n", 0, o) + 1 for o in offsets})
        last_start = data.rfind(b"\n", 0, end - 1) + 1 if end > 1 else 0
        starts.append(last_start)
        for s in starts:
            stop = data.find(b"\n", s, end)
            stop = end if stop == -1 else stop
            line = data[s:stop]
            if not line.strip() or _not_training(line):
                continue
            obj = _loads(line)
            if obj is None or not isinstance(obj.get("step"), int):
                run.bad_lines += 1
                continue
            samples[obj["step"]] = _slim(obj)
    run.train = [samples[s] for s in sorted(samples)]
    # The last training line: walk back from the end past evaluation lines.
    stop = end
    while stop > 0 and run.last_train is None:
        start = data.rfind(b"\n", 0, stop - 1) + 1 if stop > 1 else 0
        line = data[start:stop].strip()
        if line and not _not_training(line):
            obj = _loads(line)
            if obj is not None:
                run.last_train = _slim(obj)
            break
        stop = start


def read_run(path: Path, expected_steps: int | None = None) -> RunRecord:
    """Everything the report needs from one run directory; never raises on a broken run."""
    run = RunRecord(path=Path(path))
    cfg_path, metrics_path, log_path = run.path / "config.yaml", run.path / "metrics.jsonl", run.path / "run.log"
    if cfg_path.is_file():
        raw = cfg_path.read_bytes()
        run.cfg_hash = hashlib.sha256(raw).hexdigest()[:8]
        try:
            loaded = load_yaml(raw)
            run.config = loaded if isinstance(loaded, dict) else None
        except yaml.YAMLError:
            run.config = None
    if log_path.is_file():
        text = log_path.read_text(errors="replace")
        for c in _COMMIT.findall(text):
            if c not in run.commits:
                run.commits.append(c)
        setups = _SETUP.findall(text)
        if setups:
            try:
                run.setup = json.loads(setups[-1])
            except ValueError:
                pass
    if metrics_path.is_file():
        _sample_metrics(run, metrics_path.read_bytes())
    run.problem = _problem(run, metrics_path.is_file(), expected_steps)
    return run


def _problem(run: RunRecord, has_metrics: bool, expected_steps: int | None) -> str | None:
    if run.config is None:
        return "config.yaml missing or unreadable"
    if not has_metrics:
        return "metrics.jsonl missing"
    max_steps = expected_steps if expected_steps is not None else run.cfg("train.max_steps")
    if not isinstance(max_steps, int):
        return "config.yaml has no train.max_steps"
    last = max((m["step"] for m in (run.evals + run.train + ([run.last_train] if run.last_train else []))), default=0)
    torn = " (last line torn)" if run.torn else ""
    if not run.evals or run.evals[-1]["step"] != max_steps:
        return f"no final evaluation at step {max_steps}: logged up to step {last}{torn}"
    return None


def find_run_dirs(root: Path) -> list[Path]:
    """Directories under `root` holding config.yaml or metrics.jsonl (checkpoints/ not entered)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        if "config.yaml" in filenames or "metrics.jsonl" in filenames:
            found.append(Path(dirpath))
            dirnames[:] = []  # a run dir holds no nested runs; skip its checkpoints
            continue
        dirnames[:] = sorted(d for d in dirnames if d not in ("checkpoints", "slurm", "__pycache__"))
    return sorted(found)
