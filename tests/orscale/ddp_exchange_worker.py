"""The ranks' side of tests/orscale/test_ddp_exchange.py (`run`, a job for the pool of ranks).

``ReplicatedMuonFamily`` (DDP's owner exchange) on matrices larger than the bucket, every
collective it starts watched: what each rank contributes to each all_gather or broadcast (elements,
and how many of them are zeros), its counters, and its weights against one process's MuonFamily.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from orscale import MuonFamily, ReplicatedMuonFamily

# Two sizes and an odd count: owners get uneven runs and some buckets a rank owns nothing in.
SHAPES = [(64, 48)] * 6 + [(48, 32)] * 3
BUCKET = 1000  # elements: every matrix is larger, as every matrix of 125m and up is than 2^21


def _params(seed: int = 0) -> list[tuple[str, nn.Parameter]]:
    gen = torch.Generator().manual_seed(seed)
    return [(f"blocks.{i}.w", nn.Parameter(torch.randn(s, generator=gen))) for i, s in enumerate(SHAPES)]


class Spy:
    """Wraps the collectives the exchange may call; records what this rank puts into each."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.saved: dict[str, Callable] = {}

    def __enter__(self) -> Spy:
        for name in ("all_gather_single", "all_gather_into_tensor", "broadcast"):
            if hasattr(dist, name):
                self.saved[name] = fn = getattr(dist, name)
                setattr(dist, name, self._wrap(name, fn))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, fn in self.saved.items():
            setattr(dist, name, fn)

    def _wrap(self, name: str, fn: Callable) -> Callable:
        def spy(*args: Any, **kwargs: Any) -> Any:
            if name == "broadcast":
                t, src = args[0], args[1]
                mine = src == dist.get_rank()
            else:
                t, mine = args[1], True  # all_gather: (out, inp)
            if mine:
                self.calls.append({"op": name, "numel": t.numel(), "zeros": int((t == 0).sum())})
            return fn(*args, **kwargs)

        return spy


def run(overlap: bool = True) -> dict:
    """Six steps of synthetic gradients (fp32 NS) on this rank; the same steps in one process."""
    torch.set_num_threads(1)
    mine, ref = _params(), _params()
    opt = ReplicatedMuonFamily(
        mine, lr=0.02, variant="orscale_lm", ns_dtype="fp32", bucket_numel=BUCKET, overlap=overlap
    )
    single = MuonFamily(ref, lr=0.02, variant="orscale_lm", ns_dtype="fp32")
    steps, err = [], 0.0
    for t in range(6):
        gen = torch.Generator().manual_seed(100 + t)
        for (_, p), (_, q) in zip(mine, ref, strict=True):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        with Spy() as spy:
            opt.step()
        single.step()
        steps.append({"calls": spy.calls, "bytes_sent": opt.bytes_sent, "collectives": opt.n_collectives})
        err = max(err, *(float((p - q).norm() / q.norm()) for (_, p), (_, q) in zip(mine, ref, strict=True)))
    # (getattr: the code before the plan existed still runs this job, and fails on the zeros)
    planned = getattr(opt, "planned_bytes_sent", lambda r: None)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for _, p in mine)).hexdigest()
    return json.loads(
        json.dumps(
            {
                "steps": steps,
                "err": err,
                "ns_calls": opt.ns_calls,
                "planned": [planned(r) for r in range(dist.get_world_size())],
                "digest": digest,
            }
        )
    )
