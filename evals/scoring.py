"""Ranked-classification scoring (OLMES "rc"), independent of the model and of the world size.

Each choice is scored by the summed log-likelihood of its continuation given its context; a doc is
correct when the gold choice has the highest score, raw (acc), per character of the continuation
string (acc_norm, OLMES acc_per_char) or per continuation token (acc_per_token).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from evals.task_data import Task

LogProbFn = Callable[[Tensor, Tensor], Tensor]
ENCODE_CHUNK = 4096  # strings per encode call: bounds the tokenizer's memory on 80k-request tasks


@dataclass(frozen=True)
class EncodedChoice:
    tokens: list[int]  # context + continuation ids (possibly cut on the left to fit max_len + 1)
    cont_start: int  # index in `tokens` of the first scored continuation token (>= 1)
    n_tokens: int  # scored continuation tokens: tokens[cont_start:]
    n_chars: int  # characters of the continuation string (OLMES's per-character normaliser)
    truncated: bool  # context tokens (or, for a continuation longer than max_len, its head) were dropped


@dataclass(frozen=True)
class EncodedDoc:
    doc_id: int
    label: int
    choices: list[EncodedChoice]


@dataclass
class Batch:
    """Whole docs, one row per choice: right-padded, so a causal model's real positions are unaffected."""

    inputs: Tensor  # [B, T] int64, padded with 0
    targets: Tensor  # [B, T] int64, inputs shifted by one; -100 at padding
    mask: Tensor  # [B, T] bool: target positions inside the continuation
    docs: list[EncodedDoc]  # rows are these docs' choices, in order


@dataclass(frozen=True)
class DocResult:
    doc_id: int
    label: int
    logliks: list[float]  # summed in fp64, per choice
    n_chars: list[int]
    n_tokens: list[int]
    pred: int  # argmax of the raw sum (ties: lowest index)
    pred_per_char: int
    pred_per_token: int

    @property
    def correct(self) -> bool:
        return self.pred == self.label

    @property
    def correct_per_char(self) -> bool:
        return self.pred_per_char == self.label

    @property
    def correct_per_token(self) -> bool:
        return self.pred_per_token == self.label


def _fit(ctx: list[int], cont: list[int], max_len: int) -> tuple[list[int], int, bool]:
    """Cut from the left to max_len + 1 tokens; the continuation stays whole unless it alone is too long."""
    seq = ctx + cont
    drop = max(0, len(seq) - (max_len + 1))
    seq, start = seq[drop:], len(ctx) - drop
    if start >= 1:
        return seq, start, drop > 0
    # The continuation starts the sequence (empty context, or a continuation longer than max_len kept as
    # its last max_len + 1 tokens): nothing predicts its first token, which only conditions the rest.
    return seq, 1, True


def encode_task(task: Task, encode: Callable[[list[str]], list[list[int]]], max_len: int) -> list[EncodedDoc]:
    """Tokenise contexts and continuations separately (as OLMES does) and join them per choice."""
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    index: dict[str, int] = {}
    for doc in task.docs:
        for ctx, cont in doc.choices:
            index.setdefault(ctx, len(index))
            index.setdefault(cont, len(index))
    texts = list(index)
    ids: list[list[int]] = []
    for i in range(0, len(texts), ENCODE_CHUNK):
        ids.extend(encode(texts[i : i + ENCODE_CHUNK]))
    if len(ids) != len(texts):
        raise ValueError(f"encode returned {len(ids)} token lists for {len(texts)} texts")
    out = []
    for doc in task.docs:
        choices = []
        for ctx, cont in doc.choices:
            tokens, start, truncated = _fit(list(ids[index[ctx]]), list(ids[index[cont]]), max_len)
            choices.append(EncodedChoice(tokens, start, len(tokens) - start, len(cont), truncated))
        out.append(EncodedDoc(doc.doc_id, doc.label, choices))
    return out


def length_buckets(max_len: int, count: int = 4) -> list[int]:
    """`count` padded lengths up to max_len (max_len/8, /4, /2, max_len): a compiled model with
    static shapes meets at most these, instead of one graph per distinct length."""
    return sorted({max(1, -(-max_len // 2**k)) for k in range(count)})


def _collate(docs: list[EncodedDoc], shape: tuple[int, list[int]] | None = None) -> Batch:
    """`shape`: (rows, length buckets) to pad to (extra rows score nothing); None: the tightest."""
    rows = [c for d in docs for c in d.choices]
    T = max(1, max(len(c.tokens) for c in rows) - 1)
    B = len(rows)
    if shape is not None:
        B = max(B, shape[0])
        T = next((b for b in shape[1] if b >= T), T)
    inputs = torch.zeros(B, T, dtype=torch.long, device="cpu")
    targets = torch.full((B, T), -100, dtype=torch.long, device="cpu")
    mask = torch.zeros(B, T, dtype=torch.bool, device="cpu")
    for i, c in enumerate(rows):
        n = len(c.tokens) - 1
        if n > 0:
            seq = torch.tensor(c.tokens, dtype=torch.long, device="cpu")
            inputs[i, :n], targets[i, :n] = seq[:-1], seq[1:]
        mask[i, c.cont_start - 1 : c.cont_start - 1 + c.n_tokens] = True
    return Batch(inputs, targets, mask, docs)


def make_batches(docs: Sequence[EncodedDoc], batch_size: int, max_len: int | None = None) -> list[Batch]:
    """Consecutive whole docs per batch, up to batch_size rows: fixed by the docs alone, not the world
    size. `max_len`: pad every batch to batch_size rows and one of `length_buckets(max_len)` (for a
    model compiled with static shapes); None: each batch as tight as its docs allow."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    shape = (batch_size, length_buckets(max_len)) if max_len is not None else None
    batches: list[Batch] = []
    current: list[EncodedDoc] = []
    rows = 0
    for doc in docs:
        if current and rows + len(doc.choices) > batch_size:
            batches.append(_collate(current, shape))
            current, rows = [], 0
        current.append(doc)
        rows += len(doc.choices)
    if current:
        batches.append(_collate(current, shape))
    return batches


def _argmax(values: list[float]) -> int:
    """Lowest index among the maxima; NaN never wins."""
    best = 0
    clean = [v if not math.isnan(v) else -math.inf for v in values]
    for i in range(1, len(clean)):
        if clean[i] > clean[best]:
            best = i
    return best


def _results(batch: Batch, sums: list[float]) -> list[DocResult]:
    out, row = [], 0
    for doc in batch.docs:
        k = len(doc.choices)
        ll = sums[row : row + k]
        row += k
        chars = [c.n_chars for c in doc.choices]
        toks = [c.n_tokens for c in doc.choices]
        per_char = [v / max(n, 1) for v, n in zip(ll, chars, strict=True)]
        per_token = [v / max(n, 1) for v, n in zip(ll, toks, strict=True)]
        preds = _argmax(ll), _argmax(per_char), _argmax(per_token)
        out.append(DocResult(doc.doc_id, doc.label, ll, chars, toks, *preds))
    return out


def score_batches(
    logprobs: LogProbFn,
    batches: Sequence[Batch],
    rank: int = 0,
    world_size: int = 1,
    device: torch.device | str = "cpu",
) -> list[DocResult]:
    """Score batches b with b % world_size == rank. Every rank makes the same number of forward calls
    (a sharded model gathers weights inside forward): a rank short of batches reruns one and discards it.
    The caller sets the model's mode; this only disables autograd."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    steps = -(-len(batches) // world_size)
    mine = list(range(rank, len(batches), world_size))
    filler = batches[mine[-1]] if mine else (batches[0] if batches else None)
    results: list[DocResult] = []
    # no_grad rather than inference_mode: FSDP's gathered parameters must not become inference tensors.
    with torch.no_grad():
        for step in range(steps):
            b = step * world_size + rank
            real = b < len(batches)
            batch = batches[b] if real else filler
            assert batch is not None  # steps > 0 implies batches is not empty
            lp = logprobs(batch.inputs.to(device), batch.targets.to(device))
            if not real:
                continue
            if tuple(lp.shape) != tuple(batch.inputs.shape):
                raise ValueError(f"logprobs returned shape {tuple(lp.shape)}, expected {tuple(batch.inputs.shape)}")
            mask = batch.mask.to(lp.device)
            sums = torch.where(mask, lp.double(), torch.zeros((), dtype=torch.float64, device=lp.device)).sum(1)
            results.extend(_results(batch, sums.cpu().tolist()))
    return results


def counts(results: Sequence[DocResult]) -> Tensor:
    """[n_docs, correct_raw, correct_per_char, correct_per_token, sum of 1/n_choices] in float64: one
    tensor to all_reduce across ranks before summarize."""
    return torch.tensor(
        [
            len(results),
            sum(r.correct for r in results),
            sum(r.correct_per_char for r in results),
            sum(r.correct_per_token for r in results),
            sum(1.0 / len(r.logliks) for r in results),
        ],
        dtype=torch.float64,
        device="cpu",
    )


def logits_logprobs(forward: Callable[[Tensor], Tensor]) -> LogProbFn:
    """Adapt `forward(inputs) -> logits [B, T, V]` (e.g. the project's GPT) to per-token log-probs."""

    def logprobs(inputs: Tensor, targets: Tensor) -> Tensor:
        logits = forward(inputs)
        targets = targets.to(logits.device)
        safe = targets.clamp(min=0)  # -100 (padding) would break the gather; masked below
        out = torch.empty(targets.shape, dtype=torch.float32, device=logits.device)
        for i in range(logits.shape[0]):  # a float32 copy of one row's [T, V], not of the whole batch
            row = logits[i].float()
            out[i] = row.gather(-1, safe[i].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(row, dim=-1)
        return out.masked_fill(targets < 0, 0.0)

    return logprobs


def hf_logprobs(model: torch.nn.Module) -> LogProbFn:
    """Adapt a Hugging Face causal LM; no attention mask is needed as padding is on the right."""
    return logits_logprobs(lambda inputs: model(input_ids=inputs, use_cache=False).logits)
