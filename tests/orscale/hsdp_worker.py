"""The 4-rank side of tests/orscale/test_hsdp_optim.py (also runnable by hand):

    OMP_NUM_THREADS=1 torchrun --nproc_per_node=4 tests/orscale/hsdp_worker.py --out r.json

The Muon family on HSDP's 2 × 2 mesh ("replicate", "shard"), with owners inside the shard group
(NS once per matrix per replica group) and with the replica split (owners across all 4 ranks),
and plain FSDP2 over the 4 ranks: each against the single-process reference that every rank
runs itself (synthetic gradients, fp32 NS; tests/orscale/sharded_worker.py's machinery); small
buckets pipelined and one at a time. Rank 0 writes one JSON file with every rank's numbers.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
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
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, results)
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"ranks": gathered}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
