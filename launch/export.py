"""Export a trained GPT as a Hugging Face `transformers` model directory (ArceeForCausalLM).

    python -m launch.export --checkpoint runs/tiny --out exports/tiny-hf

`--checkpoint` takes a step directory, a checkpoints root or a run directory (its newest complete
checkpoint, found by `launch.checkpoint.find_checkpoint`). The export itself is `launch/hf_export.py`,
imported once the arguments are read: `--help` and a usage error answer before torch is imported.
"""

from __future__ import annotations

import argparse
import sys


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m launch.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="step directory, checkpoints root or run directory")
    parser.add_argument("--out", required=True, help="output directory (must be empty or absent)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default: as stored")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from launch.hf_export import run  # torch, transformers and the checkpoint readers: seconds to import

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
