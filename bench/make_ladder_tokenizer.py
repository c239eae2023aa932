"""The CPU ladder's tokenizer: a 4096-token byte-level BPE trained on the bundled corpus.

    python -m bench.make_ladder_tokenizer      # writes assets/tokenizers/bpe4k_ladder/tokenizer.json

With GPT-2's 50,257-token vocabulary the output layer is 85-95% of a small model's compute, so a
CPU ladder would mostly measure the embedding; a 4k vocabulary makes the transformer blocks (what
the optimizers differ on) most of the work, as at the paper's scales. The validation documents are
left out of the tokenizer's training text: the first 30 documents of the FineWeb-Edu file, well past
where the ladder's 16,384 validation tokens end (the first ~15).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parents[1]
CORPUS = [
    ROOT / "assets/corpus/fineweb_edu_sample10BT_first150.jsonl",
    ROOT / "assets/corpus/fineweb_sample10BT_first300.jsonl",
]
OUT = ROOT / "assets/tokenizers/bpe4k_ladder"
HELD_OUT = 30  # documents at the start of the first file (the validation set comes from there)


def texts() -> list[str]:
    out = []
    for k, path in enumerate(CORPUS):
        rows = [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]
        out += rows[HELD_OUT:] if k == 0 else rows
    return out


def main() -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4096,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts(), trainer)
    OUT.mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "tokenizer.json"))
    n = sum(len(e.ids) for e in tok.encode_batch(texts()))
    print(f"wrote {OUT / 'tokenizer.json'}: {tok.get_vocab_size()} tokens; the training text is {n:,} tokens")


if __name__ == "__main__":
    main()
