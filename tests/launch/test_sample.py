"""The sample feature (launch/features/sample.py): decoding on a live model (greedy, seeded sampling),
and a tiny CPU run that logs a sample at its steps, and none with `train.sample.every` at its default."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch

from launch.features.sample import generate
from launch.loop import main as train_main
from models import GPT, GPTConfig
from tests.helpers import SMALL, TINY


def _engine(max_seq_len: int = 16) -> SimpleNamespace:
    """What `generate` reads of an engine: a one-process GPT with random weights."""
    model = GPT(GPTConfig(n_layer=1, d_model=32, n_head=2, max_seq_len=max_seq_len, vocab_size=64), seed=0)
    return SimpleNamespace(
        env=SimpleNamespace(device=torch.device("cpu")), model=model, module=model, autocast=contextlib.nullcontext
    )


def test_greedy_decoding_is_the_argmax_of_the_unpadded_context_and_sampling_is_seeded():
    engine = _engine()
    prompt = [3, 1, 4]
    greedy = generate(engine, prompt, 8, temperature=0.0, seed=0)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(8):  # what greedy decoding is, without the padded window
            ids.append(int(engine.model(torch.tensor([ids]))[0, -1].argmax()))
    assert greedy == ids[len(prompt) :]
    sampled = [generate(engine, prompt, 12, temperature=1.0, seed=s) for s in (7, 7, 8)]
    assert sampled[0] == sampled[1] and sampled[0] != sampled[2]
    assert engine.module.training  # evaluation mode only while it decodes


def test_decoding_past_the_models_window_slides_it():
    engine = _engine(max_seq_len=6)
    out = generate(engine, [1, 2, 3, 4], 5, temperature=0.0, seed=0)
    assert len(out) == 5 and all(0 <= t < 64 for t in out)


def _sample_lines(run_dir, capfd, *extra: str) -> list[str]:
    base = ["--config", TINY, *SMALL, "optim.name=adamw", "train.max_steps=2", "train.eval_every=0"]
    assert train_main([*base, f"run.dir={run_dir}", *extra]) == 0
    return [line for line in capfd.readouterr().err.splitlines() if ": sample " in line]


def test_a_run_logs_a_sample_at_its_steps_and_none_by_default(tmp_path, capfd):
    on = ["train.sample.every=1", "train.sample.max_new_tokens=4", "train.sample.prompt=Once upon"]
    lines = _sample_lines(tmp_path / "on", capfd, *on)
    assert [line.split("step ")[1].split(":")[0] for line in lines] == ["1", "2"], lines
    assert all("sample 'Once upon" in line for line in lines), lines
    assert _sample_lines(tmp_path / "off", capfd) == []
