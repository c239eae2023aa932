"""The 4-rank side of tests/orscale/test_hsdp_optim.py (`run_all`, a job for the pool of ranks).

The Muon family on HSDP's 2 × 2 mesh ("replicate", "shard"), with owners inside the shard group
(NS once per matrix per replica group) and with the replica split (owners across all 4 ranks),
and plain FSDP2 over the 4 ranks: each against the single-process reference that every rank
runs itself (synthetic gradients, fp32 NS; tests/orscale/sharded_worker.py's machinery); small
buckets pipelined and one at a time. Each rank returns its numbers.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from tests.orscale.sharded_worker import reference, sharded_run

# key -> (backend, mode, HSDP mesh?, replica_split, also bucketed: pipelined and one at a time)
FLAVOURS = {
    "hsdp/owner": ("fsdp", "owner", True, False, True),
    "hsdp/split": ("fsdp", "owner", True, True, True),
    "hsdp/replicate": ("fsdp", "replicate", True, False, False),
    "fsdp/owner": ("fsdp", "owner", False, False, False),  # 1-D over 4 ranks: the toy's 1-row matrix on 1 of 4
}
BUCKET = {"toy": 40, "gpt": 12288}  # whole-matrix elements: several buckets per step
PRESET = "orscale_lm"  # the trust ratio's norm sums and calibration: what HSDP could get wrong


def run_all() -> dict:
    """Every flavour on this rank of 4 (a job for the pool of ranks, tests/pool.py), as JSON carries it."""
    torch.set_num_threads(1)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    results: dict = {"world": dist.get_world_size(), "runs": {}}
    for kind in ("toy", "gpt"):
        ref = reference(kind, PRESET)
        for flavour, (backend, mode, hsdp, split, bucketed) in FLAVOURS.items():
            variants = [("", None, True)] + (
                [("/bucketed", BUCKET[kind], True), ("/bucketed_sync", BUCKET[kind], False)] if bucketed else []
            )
            for suffix, bucket, overlap in variants:
                run = sharded_run(
                    kind,
                    PRESET,
                    backend,
                    mode,
                    ref,
                    bucket,
                    mesh=mesh if hsdp else None,
                    overlap=overlap,
                    replica_split=split,
                )
                results["runs"][f"{kind}/{flavour}{suffix}"] = dict(run, ref_c=ref["c"])
    return json.loads(json.dumps(results))
