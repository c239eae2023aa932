"""`train.sample`: a generated sample every `train.sample.every` steps (0, the default: never), logged by
rank 0, as nanoGPT prints one while it trains. The model continues `train.sample.prompt` for
`max_new_tokens` tokens: greedy at `temperature` 0, else sampled at that temperature from a generator
seeded with `train.sample.seed` (the same weights give the same text). Every rank runs the forwards (a
sharded model gathers its weights inside forward), each on one window shape (the context right-padded:
causal attention leaves the positions before the padding as they are), so a compiled model compiles it
once. Decoding lives here, not in the model: models/gpt.py stays a pure forward."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from data import TextTokenizer
from launch.engine.base import Engine
from launch.features.base import Feature
from launch.train_config import at_least

if TYPE_CHECKING:
    from launch.config import Config
    from launch.trainer import Trainer

log = logging.getLogger("orscale")


@dataclass
class SampleConfig:
    """`train.sample`: a generated sample logged every `every` steps."""

    section: ClassVar[str] = "sample"
    resume_policy: ClassVar[str] = "routine"  # it reads the model; it changes nothing in training
    every: int = 0  # 0: never
    prompt: str = "The"
    max_new_tokens: int = 32
    temperature: float = 0.0  # 0: greedy; else sampled at this temperature, seeded
    seed: int = 0

    def __post_init__(self) -> None:
        at_least("train.sample", self, every=(0, "0: never"), max_new_tokens=1, temperature=(0, "0: greedy"))


@torch.no_grad()
def generate(engine: Engine, ids: list[int], max_new_tokens: int, temperature: float, seed: int) -> list[int]:
    """`max_new_tokens` token ids continuing `ids` (greedy at temperature 0, else sampled, seeded).
    Collective on a sharded model: every rank calls it with the same arguments."""
    device = engine.env.device
    window = min(len(ids) + max_new_tokens, engine.model.cfg.max_seq_len)
    generator = torch.Generator(device=device).manual_seed(seed)
    out = list(ids)
    engine.module.eval()
    try:
        for _ in range(max_new_tokens):
            context = out[-window:]
            x = torch.zeros(1, window, dtype=torch.long, device=device)
            x[0, : len(context)] = torch.tensor(context, device=device)
            with engine.autocast():
                logits = engine.module(x)[0, len(context) - 1].float()
            if temperature == 0:
                token = int(logits.argmax())
            else:
                probs = torch.softmax(logits / temperature, dim=-1)
                token = int(torch.multinomial(probs, 1, generator=generator))
            out.append(token)
    finally:
        engine.module.train()
    return out[len(ids) :]


def decode(tokenizer: TextTokenizer, ids: list[int]) -> str:
    """The text of `ids` (a Hugging Face tokenizer's or a SentencePiece model's own decode)."""
    return str(tokenizer.backend.decode(ids))


class Sample(Feature):
    name = "sample"
    after = ("downstream", "validation")  # a step's sample follows its evaluation in the log
    Options = SampleConfig

    @classmethod
    def enabled(cls, cfg: Config) -> bool:
        return cls.options_of(cfg).every > 0

    def evaluate(self, trainer: Trainer, step: int) -> None:
        s: SampleConfig = self.options
        if not (s.every and step % s.every == 0):
            return
        tokenizer = trainer.tokenizer
        ids = tokenizer.encode_batch([s.prompt])[0] or [tokenizer.eos_id]
        with trainer.meter.paused():  # sampling time is not training throughput
            new = generate(trainer.engine, ids, s.max_new_tokens, s.temperature, s.seed)
        if trainer.env.is_main:
            log.info("step %d: sample %r", step, s.prompt + decode(tokenizer, new))
