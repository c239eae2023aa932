"""Reading run directories back: the one place config.yaml, run.log and metrics.jsonl are parsed.

* `read_metrics(path)`: every record of a metrics.jsonl and the lines that do not parse (a resume
  rewrites the file up to its step with it).
* `read_run(dir)`: config.yaml, run.log provenance and metrics, quickly, for `launch.sweep` (is a
  cell finished?) and the report (everything else). A 20,000-step run logs ~2,000 training lines
  of ~3 KB (the `diag/...` keys) but only ~20 evaluation lines, so this reader never parses every
  line: it finds the evaluation lines with a byte search and json-parses a few evenly spaced
  training lines (enough for throughput medians and diagnostic curves).

A metrics.jsonl line says what it is: its first key, `"kind"` ("train", "val", "eval", or a loop
feature's own), which the byte searches look for (`"kind": "val"`). Lines written before lines had
one come first in a file (the trainer appends) and are read by one rule, `earlier_format_kind`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeGuard

import yaml

from records.config_keys import MOVED

TRAIN_SAMPLES = 64  # training lines parsed per run (evenly spaced, plus the last one)
# Training-line keys the report uses; everything else in a line is dropped right after parsing.
TRAIN_KEYS = tuple(
    "step tokens tokens_per_s mfu mfu_causal peak_mem_gib data_wait_frac params non_embedding_params "
    "chinchilla_multiple diag/all/r diag/all/cum_frac_rmax diag/all/frac_rmin".split()
)
# The kinds read_run reads itself; the last record of any other kind (a loop feature's own) is kept whole.
KINDS_READ = ("train", "val", "eval")
_KIND_FIRST = b'{"kind": "'  # how a line that says its kind begins (launch.trainer.Trainer.record)
_OTHER_KIND = rb'\{"kind": "(?!(?:' + b"|".join(k.encode() for k in KINDS_READ) + rb')")([a-z][a-z0-9_]*)"'
_OTHER_AT_START, _OTHER_AFTER_NEWLINE = re.compile(_OTHER_KIND), re.compile(rb"\n" + _OTHER_KIND)
# Lines of the earlier format (no "kind"): the bytes that marked each kind but training, which had none.
EARLIER_FORMAT_MARKS = (("val", b'"val_loss"'), ("eval", b'"eval/'))
_COMMIT = re.compile(r"git commit (\S+)")
_SETUP = re.compile(r"setup: (\{.*\})\s*$", re.M)
# config.yaml is the trainer's yaml.safe_dump, which PyYAML's safe loader reads back exactly.
_Loader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


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


def strict_json(value: Any) -> Any:
    """`value` as strict JSON for any reader: every non-finite number as null (a field holds a
    number or null, never a string or a bare NaN), tuples as lists, numpy scalars as Python's.
    metrics.jsonl's lines and the report's summary.json both go through it."""
    if hasattr(value, "item") and not isinstance(value, (dict, list, tuple)):
        value = value.item()  # a numpy scalar
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


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
    other_kinds: dict[str, dict] = field(default_factory=dict)  # kind -> its last record (a feature's own)
    torn: bool = False  # the last line of metrics.jsonl is an incomplete write
    bad_lines: int = 0  # unparseable lines other than a torn last one
    problem: str | None = None  # why the run is not finished (None: finished)

    def cfg(self, dotted: str, default: Any = None) -> Any:
        """config["a"]["b"] for "a.b", or `default` where a level is missing; a key that moved
        (records/config_keys.py) is read where a config.yaml of the earlier layout has it."""
        for key in (dotted, *(old for old, new in MOVED.items() if dotted in new and old != dotted)):
            node: Any = self.config or {}
            for part in key.split("."):
                if not isinstance(node, dict) or part not in node:
                    break
                node = node[part]
            else:
                return node
        return default

    @property
    def finished(self) -> bool:
        return self.problem is None

    @property
    def final_val(self) -> float | None:
        """Final validation loss (NaN when the logged value is null/NaN) of a finished run."""
        if not self.finished:
            return None
        v = self.evals[-1].get("val_loss")
        return float(v) if v is not None and finite(v) else math.nan

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


def earlier_format_kind(line: bytes) -> str:
    """The kind of a metrics.jsonl line of the earlier format, which had no "kind": "val" if it holds
    `val_loss`, "eval" if it holds `eval/<task>/<key>` numbers, else "train"."""
    return next((kind for kind, mark in EARLIER_FORMAT_MARKS if mark in line), "train")


def line_kind(line: bytes, record: dict | None = None) -> str:
    """What a metrics.jsonl line is: its "kind" (of `record`, the line parsed, or the line's first
    key when it does not parse), else `earlier_format_kind`."""
    kind = record.get("kind") if record is not None else None
    if isinstance(kind, str):
        return kind
    if line.startswith(_KIND_FIRST) and (stop := line.find(b'"', len(_KIND_FIRST))) != -1:
        return line[len(_KIND_FIRST) : stop].decode(errors="replace")
    return earlier_format_kind(line)


def _earlier_end(data: bytes, end: int) -> int:
    """Where the lines that say their kind begin: the lines of the earlier format (a run begun before
    lines had a kind, resumed after) all come before, as the trainer appends."""
    if data.startswith(_KIND_FIRST):
        return 0
    if not data.startswith(_KIND_FIRST, data.rfind(b"\n", 0, end - 1) + 1 if end > 1 else 0):
        return end  # not even the last line says its kind: none does
    found = data.find(b"\n" + _KIND_FIRST, 0, end)
    return end if found == -1 else found + 1


def _line_at(data: bytes, start: int, end: int) -> tuple[bytes, int]:
    stop = data.find(b"\n", start, end)
    stop = end if stop == -1 else stop
    return data[start:stop], stop


def _lines_of_kind(data: bytes, kind: str, earlier: int, end: int) -> list[tuple[bytes, dict | None]]:
    """The lines of `kind` before `end`, each with its record (None: it does not parse), found by a
    byte search: `"kind": "<kind>"`, and the earlier format's mark of the kind before `earlier`
    (`_earlier_end`)."""
    found = []
    marks = ((0, earlier, dict(EARLIER_FORMAT_MARKS).get(kind)), (earlier, end, b'"kind": "%s"' % kind.encode()))
    for start, stop, mark in marks:
        if mark is None:  # a kind the earlier format did not have
            continue
        pos = data.find(mark, start, stop)
        while pos != -1:
            line, line_end = _line_at(data, data.rfind(b"\n", 0, pos) + 1, end)
            obj = _loads(line)
            if line_kind(line, obj) == kind:
                found.append((line, obj))
            pos = data.find(mark, line_end, stop)
    return found


def _other_kinds(data: bytes, start: int, end: int) -> dict[str, dict]:
    """The last record of each kind read_run does not read itself, by kind, from `start` on (the
    lines that say their kind: the earlier format had no other kinds)."""
    last: dict[str, int] = {}
    if first := _OTHER_AT_START.match(data, start, end):
        last[first.group(1).decode()] = start
    for match in _OTHER_AFTER_NEWLINE.finditer(data, start, end):
        last[match.group(1).decode()] = match.start() + 1
    records = {kind: _loads(_line_at(data, start, end)[0]) for kind, start in last.items()}
    return {kind: obj for kind, obj in sorted(records.items()) if obj is not None}


def _sample_metrics(run: RunRecord, data: bytes) -> None:
    """Fill run.evals / run.train / run.last_train / run.other_kinds / run.torn from metrics.jsonl's bytes."""
    end = len(data)
    if data and not data.endswith(b"\n"):  # every write ends in a newline: the tail is torn
        cut = data.rfind(b"\n") + 1
        if _loads(data[cut:]) is None:
            run.torn, end = True, cut
    evals: dict[int, dict] = {}
    earlier = _earlier_end(data, end)
    for _, obj in _lines_of_kind(data, "val", earlier, end):
        if obj is None or not isinstance(obj.get("step"), int):
            run.bad_lines += 1
        else:
            evals[obj["step"]] = obj  # a resumed run may repeat a step: the later line wins
    run.evals = [evals[s] for s in sorted(evals)]

    # Evenly spaced training lines by byte offset, then the last training line.
    samples: dict[int, dict] = {}
    if end:
        offsets = {int(i * end / TRAIN_SAMPLES) for i in range(TRAIN_SAMPLES)}
        starts = sorted({0 if o == 0 else data.rfind(b"\n", 0, o) + 1 for o in offsets})
        starts.append(data.rfind(b"\n", 0, end - 1) + 1 if end > 1 else 0)
        for s in starts:
            line, _ = _line_at(data, s, end)
            obj = _loads(line) if line.strip() else None
            if not line.strip() or line_kind(line, obj) != "train":
                continue
            if obj is None or not isinstance(obj.get("step"), int):
                run.bad_lines += 1
                continue
            samples[obj["step"]] = _slim(obj)
    run.train = [samples[s] for s in sorted(samples)]
    # The last training line: walk back from the end past the lines of other kinds.
    stop = end
    while stop > 0 and run.last_train is None:
        start = data.rfind(b"\n", 0, stop - 1) + 1 if stop > 1 else 0
        line = data[start:stop].strip()
        obj = _loads(line) if line else None
        if line and line_kind(line, obj) == "train":
            if obj is not None:
                run.last_train = _slim(obj)
            break
        stop = start
    run.other_kinds = _other_kinds(data, earlier, end)


def read_run(path: Path, expected_steps: int | None = None) -> RunRecord:
    """Everything the report needs from one run directory; never raises on a broken run."""
    run = RunRecord(path=Path(path))
    cfg_path, metrics_path, log_path = run.path / "config.yaml", run.path / "metrics.jsonl", run.path / "run.log"
    if cfg_path.is_file():
        raw = cfg_path.read_bytes()
        run.cfg_hash = hashlib.sha256(raw).hexdigest()[:8]
        try:
            loaded = yaml.load(raw, Loader=_Loader)
            run.config = loaded if isinstance(loaded, dict) else None
        except yaml.YAMLError:
            run.config = None
    if log_path.is_file():
        text = log_path.read_text(errors="replace")
        run.commits = list(dict.fromkeys(_COMMIT.findall(text)))
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


# ---- read on demand, for the runs a figure or table shows (the best point's seeds), each file once:
# the Muon-family diagnostics per matrix class (read_run keeps `diag/all/*` only) and the downstream
# accuracies (the loop's `eval/<task>/*` records, or the offline evaluation's JSON on the final checkpoint).
CLASSES = ("attn_qkv", "attn_out", "mlp_up", "mlp_down")
DIAG_SAMPLES = 96  # training lines with diagnostics kept per run (evenly spaced, plus the last)
_STEP_JSON = re.compile(r"^step_(\d+)\.json$")


@lru_cache(maxsize=512)
def _lines(path: Path, needle: bytes) -> tuple[bytes, ...]:
    try:
        data = path.read_bytes()
    except OSError:
        return ()
    return tuple(line for line in data.split(b"\n") if needle in line)


@lru_cache(maxsize=512)
def _records_of_kind(path: Path, kind: str) -> tuple[dict, ...]:
    """The records of `kind` in a metrics.jsonl that carry a step (read once per file and kind)."""
    try:
        data = path.read_bytes()
    except OSError:
        return ()
    found = _lines_of_kind(data, kind, _earlier_end(data, len(data)), len(data))
    return tuple(obj for _, obj in found if _has_step(obj))


def _has_step(obj: dict | None) -> TypeGuard[dict]:
    return obj is not None and isinstance(obj.get("step"), int)


def diag_series(run: RunRecord) -> list[dict[str, Any]]:
    """Evenly spaced training records carrying `diag/<class>/<field>` (step, tokens, diag keys)."""
    # The kind from each line's first bytes: only the lines sampled are parsed.
    lines = [line for line in _lines(run.path / "metrics.jsonl", b'"diag/') if line_kind(line) == "train"]
    if not lines:
        return []
    n, k = len(lines), min(DIAG_SAMPLES, len(lines))
    out: dict[int, dict] = {}
    for i in sorted({round(i * (n - 1) / max(k - 1, 1)) for i in range(k)} | {n - 1}):
        obj = _loads(lines[i])
        if _has_step(obj):
            out[obj["step"]] = {k: v for k, v in obj.items() if k in ("step", "tokens") or k.startswith("diag/")}
    return [out[s] for s in sorted(out)]


def _from_json(path: Path) -> dict[str, dict] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    summ = doc.get("summaries", doc.get("tasks", doc)) if isinstance(doc, dict) else doc
    if isinstance(summ, list):
        summ = {s.get("task"): s for s in summ if isinstance(s, dict)}
    if not isinstance(summ, dict):
        return None
    out = {str(k): {**v, "source": path.name} for k, v in summ.items() if isinstance(v, dict) and finite(v.get("acc"))}
    return out or None


def read_downstream(run: RunRecord) -> dict[str, dict[str, Any]]:
    """task -> {acc, acc_norm, acc_per_token, n, chance, [acc_ci, ...], primary_metric?, source} at
    the end of training: `downstream.json`, else `downstream/step_<max_steps>.json` (the offline
    evaluation of the final checkpoint), else the last `eval/<task>/*` record at max_steps."""
    final = run.cfg("train.max_steps")
    folder = run.path / "downstream"
    steps = {int(m.group(1)): p for p in folder.iterdir() if (m := _STEP_JSON.match(p.name))} if folder.is_dir() else {}
    for path in (run.path / "downstream.json", steps.get(final)):
        got = _from_json(path) if path is not None and path.is_file() else None
        if got:
            return got
    records = [r for r in _records_of_kind(run.path / "metrics.jsonl", "eval") if r["step"] == final]
    out: dict[str, dict[str, Any]] = {}
    for key, value in (records[-1] if records else {}).items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "eval" and finite(value):
            out.setdefault(parts[1], {"source": f"metrics.jsonl step {final}"})[parts[2]] = value
    return {t: v for t, v in out.items() if "acc" in v}
