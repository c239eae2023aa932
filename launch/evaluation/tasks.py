"""Downstream evaluation of a live model: the `eval:` tasks scored on every rank's share of the
batches, one all-reduce for all tasks, the same numbers on every backend and world size.

`launch.loop` calls `score_tasks` at the validation steps; `launch.evaluation.offline` (a checkpoint or an HF
export, one process) uses the pieces below it (`prepare_tasks`, `score_prepared`) to also keep every example's
log-likelihoods. The scoring itself is `evals/`; this module only adds the model and the ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from evals import (
    Batch,
    DocResult,
    EvalConfig,
    Task,
    chance_note,
    counts,
    encode_task,
    load_task,
    make_batches,
    score_batches,
)
from evals import summarize as summarize_task
from evals.scoring import LogProbFn
from launch.runtime.process_group import DistEnv, all_reduce_sum
from models.fused_loss import IGNORE_INDEX

Encode = Callable[[list[str]], list[list[int]]]
# The per-task numbers that go to metrics.jsonl as eval/<task>/<key> (intervals stay in the CLI's JSON).
METRIC_KEYS: tuple[str, ...] = ("acc", "acc_norm", "acc_per_token", "n", "chance")


@dataclass(frozen=True)
class Prepared:
    """One task encoded and cut into global, doc-aligned batches (the same on every rank)."""

    task: Task
    batches: list[Batch]


# Encoded batches per (task, shots, max_examples, tokenizer, max_len, batch_size): the loop scores the
# same tasks at every evaluation step, and encoding 40k HellaSwag requests each time would cost more
# than a small model's forwards.
_PREPARED: dict[tuple[str, int, int, str, int, int, bool], Prepared] = {}


def prepare_tasks(
    names: Sequence[str],
    shots: int,
    max_examples: int,
    encode: Encode,
    max_len: int,
    batch_size: int,
    tokenizer_key: str | None = None,
    static_shapes: bool = False,
) -> list[Prepared]:
    """Load, encode and batch each task. `tokenizer_key` (e.g. `TextTokenizer.fingerprint()`) names
    the tokenizer for the cache; None: no caching (an encoder without a stable identity).
    `static_shapes`: batches padded to a few shapes (evals.make_batches), for a compiled model."""
    out = []
    for name in names:
        key = (name, shots, max_examples, tokenizer_key or "", max_len, batch_size, static_shapes)
        found = _PREPARED.get(key) if tokenizer_key is not None else None
        if found is None:
            task = load_task(name, shots, max_examples)  # parsed once per process (evals' own cache)
            batches = make_batches(encode_task(task, encode, max_len), batch_size, max_len if static_shapes else None)
            for b in batches:  # only continuation tokens are scored: the rest never meet the head
                b.targets = torch.where(b.mask, b.targets, torch.full_like(b.targets, IGNORE_INDEX))
            found = Prepared(task, batches)
            if tokenizer_key is not None:
                _PREPARED[key] = found
        out.append(found)
    return out


def forwards_per_rank(prepared: Sequence[Prepared], world_size: int) -> int:
    """Forward calls each rank makes for `prepared` (score_batches pads every rank to the same count)."""
    return sum(-(-len(p.batches) // world_size) for p in prepared)


def score_prepared(
    logprobs: LogProbFn, prepared: Sequence[Prepared], env: DistEnv, on_forward: Callable[[], None] | None = None
) -> tuple[dict[str, dict[str, Any]], dict[str, list[DocResult]]]:
    """(summary per task, this rank's per-doc results per task). Collective: every rank makes the
    same forward calls, then ONE all-reduce carries every task's counts. `on_forward`: called after
    each forward (a progress bar)."""

    def fn(inputs: Tensor, targets: Tensor) -> Tensor:
        out = logprobs(inputs, targets)
        if on_forward is not None:
            on_forward()
        return out

    results = {p.task.name: score_batches(fn, p.batches, env.rank, env.world_size, env.device) for p in prepared}
    none = torch.zeros(0, 5, device="cpu")
    total = torch.stack([counts(results[p.task.name]) for p in prepared]) if prepared else none
    # Counts are integers (and sums of 1/k) in float64: the sum over ranks is exact in any order.
    total = all_reduce_sum(total.to(env.device, torch.float64)).cpu()
    summaries = {p.task.name: summarize_task(p.task, total[i]) for i, p in enumerate(prepared)}
    return summaries, results


def native_logprobs(module: nn.Module, autocast: Callable[[], AbstractContextManager]) -> LogProbFn:
    """Per-token log-probs from the project's GPT, however wrapped: `module(idx, targets,
    per_token=True)` goes through the wrapper's forward (FSDP2 unshards there; DDP and DeepSpeed
    pass the keyword on) and never forms the full logits; the head runs on the scored rows only."""

    def logprobs(inputs: Tensor, targets: Tensor) -> Tensor:
        with autocast():
            losses = module(inputs, targets, per_token=True)
        return -losses.float()  # 0 at -100 targets (everything outside the continuations)

    return logprobs


def score_tasks(
    module: nn.Module,
    autocast: Callable[[], AbstractContextManager],
    tokenizer: Any,
    eval_cfg: EvalConfig,
    env: DistEnv,
    max_len: int,
    static_shapes: bool = False,
) -> dict[str, dict[str, Any]]:
    """The summary (evals.summarize) of every task in `eval_cfg.tasks`, encoded with the training
    `tokenizer` (a data.TextTokenizer) and cut to `max_len` tokens. Collective. The module is in eval
    mode for the duration and in train mode afterwards, as the loop's validation leaves it.
    `static_shapes`: the module is compiled with static shapes (parallel.compile): its batches come
    in at most four shapes, so evaluation compiles a few graphs, not one per length."""
    prepared = prepare_tasks(
        eval_cfg.tasks,
        eval_cfg.shots,
        eval_cfg.max_examples,
        tokenizer.encode_batch,
        max_len,
        eval_cfg.batch_size,
        tokenizer_key=tokenizer.fingerprint(),
        static_shapes=static_shapes,
    )
    module.eval()
    try:
        summaries, _ = score_prepared(native_logprobs(module, autocast), prepared, env)
    finally:
        module.train()
    return summaries


def eval_metrics(summaries: dict[str, dict[str, Any]]) -> dict[str, float | int]:
    """The flat `eval/<task>/<key>` numbers of metrics.jsonl (plain floats; n an int)."""
    out: dict[str, float | int] = {}
    for name, s in summaries.items():
        for key in METRIC_KEYS:
            out[f"eval/{name}/{key}"] = int(s[key]) if key == "n" else float(s[key])
    return out


def summary_line(summary: dict[str, Any]) -> str:
    """One log line per task, with `chance_note` ("at chance", "below chance")."""
    s = summary
    note = f", {chance_note(s)}" if chance_note(s) else ""
    return (
        f"{s['task']} ({s['shots']}-shot) acc {s['acc']:.3f} acc_norm {s['acc_norm']:.3f} "
        f"(n {s['n']}, chance {s['chance']:.3f}{note})"
    )
