"""metrics.jsonl read back by kind (records/read.py): every line says what it is; the lines of the
earlier format, with no kind, by their one rule; a loop feature's own records never taken for training
or evaluation lines."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from records.read import earlier_format_kind, line_kind, read_downstream, read_run


def _run(path: Path, lines: list[dict], steps: int = 4) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"train": {"max_steps": steps}}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _train(step: int, **kind: str) -> dict:
    return {**kind, "step": step, "tokens": 8 * step, "train_loss": 5.0, "tokens_per_s": 10.0 * step, "params": 99}


def test_lines_are_read_by_their_kind_not_by_the_keys_they_hold(tmp_path):
    """A feature's own records, even one holding a `val_loss` or `eval/` key and written last, are
    neither evaluations nor the last training line; the last of each such kind is kept whole."""
    lines = []
    for step in (1, 2, 3, 4):
        lines += [_train(step, kind="train"), {"kind": "weight_norms", "step": step, "tokens": 8 * step, "w": step}]
    lines.insert(-1, {"kind": "val", "step": 4, "tokens": 32, "val_loss": 3.5, "val_tokens": 64})
    lines += [{"kind": "eval", "step": 4, "tokens": 32, "eval/arc/acc": 0.5, "eval/arc/n": 10}]
    lines += [{"kind": "probe", "step": 4, "tokens": 32, "val_loss": 9.0, "eval/arc/acc": 0.9}]
    run = read_run(_run(tmp_path, lines))
    assert run.finished and [(e["step"], e["val_loss"]) for e in run.evals] == [(4, 3.5)]
    assert run.last_train == {"step": 4, "tokens": 32, "tokens_per_s": 40.0, "params": 99}
    assert [t["step"] for t in run.train] == [1, 2, 3, 4] and all("tokens_per_s" in t for t in run.train)
    assert run.other_kinds == {
        "probe": {"kind": "probe", "step": 4, "tokens": 32, "val_loss": 9.0, "eval/arc/acc": 0.9},
        "weight_norms": {"kind": "weight_norms", "step": 4, "tokens": 32, "w": 4},
    }
    assert read_downstream(run) == {"arc": {"source": "metrics.jsonl step 4", "acc": 0.5, "n": 10}}
    assert run.bad_lines == 0


def test_lines_of_the_earlier_format_are_read_by_its_rule_also_before_lines_with_a_kind(tmp_path):
    """A run begun before lines had a kind and resumed after holds both: the same records either way."""
    old = [
        _train(1),
        {"step": 2, "tokens": 16, "val_loss": 4.0},
        _train(2),
        {"step": 2, "tokens": 16, "eval/arc/acc": 0.4},
    ]
    new = [_train(3, kind="train"), _train(4, kind="train"), {"kind": "val", "step": 4, "tokens": 32, "val_loss": 3.0}]
    mixed = read_run(_run(tmp_path / "mixed", old + new))
    assert [(e["step"], e["val_loss"]) for e in mixed.evals] == [(2, 4.0), (4, 3.0)]
    assert [t["step"] for t in mixed.train] == [1, 2, 3, 4] and mixed.last_train is not None
    assert mixed.finished and mixed.last_train["step"] == 4 and mixed.other_kinds == {}
    earlier = read_run(_run(tmp_path / "earlier", old, steps=2))  # the earlier format alone: an eval line last
    assert earlier.finished and earlier.last_train == {"step": 2, "tokens": 16, "tokens_per_s": 20.0, "params": 99}
    assert read_downstream(earlier) == {"arc": {"source": "metrics.jsonl step 2", "acc": 0.4}}
    assert [earlier_format_kind(json.dumps(m).encode()) for m in old] == ["train", "val", "train", "eval"]
    assert line_kind(b'{"kind": "val", "step": 2, "val_lo') == "val"  # a torn line still says its kind
