"""The ranks' side of tests/orscale/test_library_distributed.py (jobs for the pool of ranks).

`user_loops`: a loop a user writes around ``OrScaleLM`` on a Hugging Face GPT2 under FSDP2 (the
optimizer built over the sharded model, or before it as accelerate's FSDP2 prepare does) and under
DDP, each rank on its half of the batch, against the one-process loop on the whole batch (computed
on every rank). `docs_example`: a docs/library.md example run as written, as under torchrun.
"""

from __future__ import annotations

import contextlib
import io
import os

import torch
import torch.distributed as dist

from orscale import OrScaleLM
from tests.orscale.optim_helpers import hf_gpt2

STEPS = 3
LRS = dict(lr=0.02, adamw_lr=0.005)


def _batches() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(0, 96, (4, 16), generator=gen) for _ in range(STEPS)]


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def _loop(model: torch.nn.Module, opt: OrScaleLM, rows: slice) -> list[dict[str, torch.Tensor]]:
    """The user's loop: forward, backward, step, zero_grad; the full weights after each step."""
    out = []
    for batch in _batches():
        part = batch[rows]
        model(part, labels=part).loss.backward()
        opt.step()
        opt.zero_grad()
        out.append({n: _full(p) for n, p in model.named_parameters()})
    return out


def _errors(run: list[dict[str, torch.Tensor]], ref: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """The largest relative difference of a hidden matrix, and of any other parameter, at any step."""
    worst = {"muon": 0.0, "adamw": 0.0}
    for got, want in zip(run, ref, strict=True):
        for name, w in want.items():
            g = got.get(name, got.get(f"module.{name}"))
            kind = "muon" if w.ndim == 2 and ".h." in name else "adamw"
            worst[kind] = max(worst[kind], float((g - w).norm() / w.norm().clamp_min(1e-30)))
    return worst


def user_loops() -> dict:
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    rows = slice(rank * 4 // world, (rank + 1) * 4 // world)
    reference = hf_gpt2()
    ref = _loop(reference, OrScaleLM(reference, ns_dtype="fp32", **LRS), slice(None))
    start = {n: p.detach().clone() for n, p in hf_gpt2().named_parameters()}
    moved = all(not torch.equal(ref[-1][n], w) for n, w in start.items())

    sharded = hf_gpt2()
    for block in sharded.transformer.h:
        fully_shard(block)
    fully_shard(sharded)
    fsdp_opt = OrScaleLM(sharded, ns_dtype="fp32", **LRS)
    fsdp = _loop(sharded, fsdp_opt, rows)

    # accelerate's FSDP2 order: the optimizer first, then the model sharded and the optimizer's
    # groups given the sharded parameters (fsdp2_switch_optimizer_parameters)
    late = hf_gpt2()
    late_opt = OrScaleLM(late, ns_dtype="fp32", **LRS)
    for block in late.transformer.h:
        fully_shard(block)
    fully_shard(late)
    new = dict(late.named_parameters())
    for group in late_opt.param_groups:
        group["params"] = [new[n] for n in group["param_names"]]
    swapped = _loop(late, late_opt, rows)

    replicated = DDP(hf_gpt2())
    ddp_opt = OrScaleLM(replicated, ns_dtype="fp32", **LRS)
    ddp = _loop(replicated, ddp_opt, rows)
    return {
        "moved": moved,
        "fsdp_class": type(fsdp_opt.muon).__name__,
        "fsdp_err": _errors(fsdp, ref),
        "fsdp_ns_calls": fsdp_opt.muon.ns_calls,
        "swapped_class": type(late_opt.muon).__name__,
        "swapped_err": _errors(swapped, ref),
        "ddp_class": type(ddp_opt.muon).__name__,
        "ddp_err": _errors(ddp, ref),
        "ddp_ns_calls": ddp_opt.muon.ns_calls,
        "matrices": len(fsdp_opt.param_groups[0]["params"]),
    }


def docs_example(code: str) -> str:
    """Run `code` (which calls ``dist.init_process_group()`` itself) as torchrun would: this job's
    group is taken down first, and the example's env:// rendezvous meets at a store of its own (a
    fresh port from the kernel, shared over the job's group before it goes), which every rank joins
    as a client (TORCHELASTIC_USE_AGENT_STORE, as under torchrun). Returns what it printed."""
    store = None
    if dist.get_rank() == 0:
        store = dist.TCPStore("127.0.0.1", 0, dist.get_world_size(), is_master=True, wait_for_workers=False)
    port = [store.port if store is not None else None]
    dist.broadcast_object_list(port, src=0)
    dist.barrier()
    dist.destroy_process_group()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port[0]), TORCHELASTIC_USE_AGENT_STORE="True")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "docs/library.md", "exec"), {"__name__": "__main__"})
    del store  # the rendezvous store outlives the example
    return printed.getvalue()
