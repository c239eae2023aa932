"""Benchmark (prints, does not assert): what a `torch.profiler.record_function` label costs when no
profiler runs, the claim behind labelling the training step (`forward`, `backward`,
`optimizer_step`) and Newton–Schulz (`newton_schulz`) unconditionally.

    python -m bench.bench_record_function [--calls 200000] [--rounds 5]

Reported: the median over rounds of (a) an empty `with record_function(...)` block minus an empty
loop, per call; (b) the labelled `newton_schulz_many` against the same function unlabelled
(`__wrapped__`) on the tiny default's 4 matrix shapes per layer (d 128: 384×128, 128×128, 512×128,
128×512), the smallest Newton–Schulz call the trainer makes, i.e. the largest relative cost.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import record_function

from orscale.newton_schulz import newton_schulz_many

SHAPES_TINY = [(384, 128), (128, 128), (512, 128), (128, 512)]


def _per_call(fn, calls: int) -> float:
    started = time.perf_counter()
    fn(calls)
    return (time.perf_counter() - started) / calls


def _empty(calls: int) -> None:
    for _ in range(calls):
        pass


def _labelled(calls: int) -> None:
    for _ in range(calls):
        with record_function("label"):
            pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    label = []
    for _ in range(args.rounds):
        label.append(_per_call(_labelled, args.calls) - _per_call(_empty, args.calls))
    print(f"record_function, no profiler running: {statistics.median(label) * 1e6:.2f} µs per label (median)")

    mats = [torch.randn(shape) for shape in SHAPES_TINY]
    bare = newton_schulz_many.__wrapped__  # type: ignore[attr-defined]  # the undecorated function
    ns_calls = max(20, args.calls // 2000)
    with_label, without = [], []
    for _ in range(args.rounds):
        without.append(_per_call(lambda n: [bare(mats, 5, "polar_express", "fp32") for _ in range(n)], ns_calls))
        with_label.append(
            _per_call(lambda n: [newton_schulz_many(mats, 5, "polar_express", "fp32") for _ in range(n)], ns_calls)
        )
    a, b = statistics.median(with_label), statistics.median(without)
    print(
        f"newton_schulz_many on the tiny default's shapes: {a * 1e3:.3f} ms labelled, {b * 1e3:.3f} ms bare "
        f"(difference {(a - b) * 1e6:+.1f} µs, {100 * (a - b) / b:+.2f}%; rounds spread "
        f"{(max(with_label) - min(with_label)) * 1e6:.0f} µs)"
    )


if __name__ == "__main__":
    main()
