"""Where a run starts: a fresh run directory, or the newest complete checkpoint in it.

`run.resume`: `auto` (default) resumes from the newest complete checkpoint of `run.dir` if there
is one; `none` starts fresh; a path resumes from that checkpoint. A run directory that already
holds metrics is never silently restarted over: that needs `run.overwrite=true`, and even then
the old metrics file is kept under a new name.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Optional

from launch.checkpoint import FORMAT, find_checkpoint, latest_checkpoint
from launch.config import Config, ConfigError
from launch.runlog import RunDir

log = logging.getLogger("orscale")

# A change here makes the checkpoint meaningless for this run: refuse.
MUST_MATCH = ("model", "tokenizer", "config.optim.name", "config.data.source", "config.data.subset",
              "config.data.data_files", "config.data.text_field", "config.data.seq_len",
              "config.data.val_tokens", "config.data.logical_shards", "config.data.piece_bytes",
              "config.data.shuffle", "config.data.shuffle_buffer", "config.data.seed")
# Changing these is routine (extend a run, log more often): no warning.
HARMLESS = ("config.run.", "config.train.max_steps", "config.train.log_every", "config.train.eval_every",
            "config.train.ckpt_every", "config.train.progress", "config.data.encode_batch_docs",
            "config.data.val_batch_size", "config.data.prefetch_steps")


def find_resume_point(cfg: Config, run: RunDir) -> Optional[Path]:
    ckpt_root = run.path / "checkpoints"
    has_run = run.metrics_path.exists()
    mode = cfg.run.resume
    if mode == "none":
        if has_run and not cfg.run.overwrite:
            raise ConfigError(f"run.dir '{run.path}' already holds a run; use run.resume=auto to continue it, "
                              "another run.dir, or run.overwrite=true to start over (old metrics are kept)")
        return None
    if mode == "auto":
        found = latest_checkpoint(ckpt_root)
        if found is None and has_run and not cfg.run.overwrite:
            raise ConfigError(f"run.dir '{run.path}' already holds a run (metrics.jsonl) but no complete "
                              "checkpoint; choose another run.dir or pass run.overwrite=true")
        return found
    found = find_checkpoint(mode)
    if found is None:
        raise ConfigError(f"run.resume='{mode}' is not a complete checkpoint (no meta.json and dcp/ inside)")
    return found


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def check_resume_compatible(saved: dict[str, Any], current: dict[str, Any]) -> None:
    """ConfigError if the checkpoint cannot continue this run; a warning for changed settings."""
    if saved.get("format", 1) != FORMAT:
        raise ConfigError(f"cannot resume: the checkpoint is in format {saved.get('format', 1)} of an older trainer "
                          f"(this one reads {FORMAT}: data addressed by piece and row); its weights still export "
                          "(python -m launch.export); start a new run.dir")
    old, new = _flatten({k: saved.get(k) for k in ("model", "tokenizer", "config")}), \
        _flatten({k: current.get(k) for k in ("model", "tokenizer", "config")})
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    fatal = [k for k in changed if any(k == m or k.startswith(m + ".") for m in MUST_MATCH)]
    if fatal:
        key = fatal[0]
        raise ConfigError(f"cannot resume: the checkpoint has {key}={old.get(key)!r} but this run has "
                          f"{new.get(key)!r}; keep it the same or start a new run.dir")
    routine = [k for k in changed if not any(k.startswith(h) for h in HARMLESS)]
    if routine:
        log.warning("resuming with changed settings: %s", ", ".join(
            f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in routine))


def prepare_run_dir(cfg: Config, run: RunDir, start_step: int) -> None:
    """Make metrics.jsonl continue at `start_step` with no duplicate steps (rank 0 only)."""
    if not run.active or not run.metrics_path.exists():
        return
    if start_step == 0:  # run.overwrite=true: keep the old file under a new name
        kept = run.metrics_path.with_name(f"metrics.{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
        os.replace(run.metrics_path, kept)
        log.warning("run.overwrite: previous metrics kept as %s", kept.name)
        return
    import json

    lines = run.metrics_path.read_text().splitlines()
    keep = [line for line in lines if line.strip() and json.loads(line).get("step", 0) <= start_step]
    tmp = run.metrics_path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    os.replace(tmp, run.metrics_path)
