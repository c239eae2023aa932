"""What the dry run prints: one rank's figures with every rank's spread (`describe`), and the table
of many configurations for docs/scaling.md (`table`, `batch_for`)."""

from __future__ import annotations

from pathlib import Path

from launch.backends.registry import BACKENDS, backend_for
from launch.dryrun.measure import UNSUPPORTED, DryRun
from launch.plan import load_config

GIB, MIB, GB, MB = 2**30, 2**20, 1e9, 1e6
# The table's layouts, in its order: (parallel.backend, replicated across nodes: HSDP).
LAYOUTS: tuple[tuple[str, bool], ...] = (("fsdp", False), ("fsdp", True), ("ddp", False))


def _spread(values: list, scale: float, fmt: str = ",.2f") -> str:
    lo, hi, mean = min(values), max(values), sum(values) / len(values)
    return f"{lo / scale:{fmt}} / {mean / scale:{fmt}} / {hi / scale:{fmt}}"


def _layout(r: DryRun) -> str:
    """The layout's name; HSDP's as replicas × shards (replica groups × the ranks each shards over)."""
    if r.replicate > 1:
        return f"HSDP {r.replicate} × {r.world // r.replicate}"
    return backend_for(r.backend).label + f" over {r.world}"


# What the peak and the memory figures leave out (the dry run counts tensors only).
NOT_COUNTED = (
    "the CUDA context, NCCL's buffers, cuBLAS workspaces and the caching allocator's rounding and fragmentation"
)


def describe(r: DryRun) -> str:
    """The per-rank account of one dry run (min / mean / max over every rank of the world)."""
    per_step = [r.gather * r.accum + r.reduce + x + r.step_other for x in r.exchange]
    flags = (
        f"FSDP2 parameters {r.param_dtype} in forward/backward, resharded after forward: {'yes' if r.reshard else 'no'}"
    )
    hsdp = (
        f" ({r.replicate} replica groups × {r.world // r.replicate} ranks each parameter is sharded over)"
        if r.replicate > 1
        else ""
    )
    lines = [
        f"dry run of {r.config}: {_layout(r)} ranks{hsdp}; rank {r.rank} set up and stepped on a fake process "
        f"group in {r.seconds:.1f} s",
        f"micro-batch {r.micro_batch} × {r.seq_len} tokens, {r.accum} micro-batch{'es' * (r.accum != 1)} per step "
        f"on each rank (gradient accumulation): {r.tokens_per_step:,} tokens per step over all {r.world} ranks",
        flags if backend_for(r.backend).shards_parameters else "DDP: fp32 parameters, bf16 autocast",
        *[f"note: {n}" for n in r.notes],
        "",
        "per rank                              min / mean / max over ranks",
        f"parameters (GiB)                      {_spread(r.params, GIB)}",
        f"gradients (GiB)                       {_spread(r.grads, GIB)}",
        f"optimizer state (GiB)                 {_spread(r.opt_state, GIB)}",
        f"Newton-Schulz (GFLOP per step)        {_spread(r.ns_flops, 1e9, ',.0f')}",
        f"owner exchange (MB sent per step)     {_spread(r.exchange, MB, ',.1f')}",
        f"all collectives (GB sent per step)    {_spread(per_step, GB)}",
        f"  parameter all-gathers               {r.gather * r.accum / GB:,.2f} ({r.accum} x {r.gather / GB:,.2f})",
        f"  gradient reduce-scatter/all-reduce  {r.reduce / GB:,.2f}",
        f"  the step's others (clip norm)       {r.step_other / GB:,.6f}",
        f"activations, micro-batch (GiB)        {r.activations / GIB:,.2f}   (rank {r.rank})",
        f"peak, steady state (GiB)              {r.peak / GIB:,.2f}   (rank {r.rank})",
        f"not counted: {NOT_COUNTED}",
        "",
        f"check: rank {r.rank}'s optimizer counted {r.exchange_measured:,} bytes in its real step; "
        f"its plan says {r.exchange[r.rank]:,}"
        + (" (equal)" if r.exchange_measured == r.exchange[r.rank] else " (DIFFERENT)"),
    ]
    return "\n".join(lines)


def batch_for(config: str | Path, world: int) -> list[str]:
    """Overrides that let the config's step run on `world` ranks, as a user would set them: the
    config's step, or, when its sequences do not split evenly over the ranks, the next step that
    does (one sequence per rank when there are more ranks than sequences); the largest micro-batch
    up to the config's that divides a rank's share; as many logical data shards as ranks where the
    config's do not split over them and the step (launch/config.py, launch/plan.py)."""
    cfg = load_config(str(config))
    seq, micro, shards = cfg.data.seq_len, cfg.train.micro_batch_size, cfg.data.logical_shards
    sequences = cfg.train.tokens_per_step // seq
    share = -(-sequences // world)
    out = [] if sequences == share * world else [f"train.tokens_per_step={share * world * seq}"]
    out.insert(0, f"train.micro_batch_size={max(m for m in range(1, min(micro, share) + 1) if share % m == 0)}")
    if shards % world or (share * world) % shards:
        out.append(f"data.logical_shards={world}")
    return out


TABLE_HEAD = (
    "| model | ranks | layout (HSDP: replicas × shards) | micro-batch × accum | tokens/step | params MiB "
    "| grads MiB | optimizer state MiB (max) | NS GFLOP max / mean | owner exchange MB max / mean "
    "| all collectives GB/step (max) | activations GiB | peak GiB | s |\n" + "| --- " * 14 + "|"
)
TABLE_NOTE = (
    "micro-batch × accum: sequences per micro-batch × micro-batches per step on each rank (gradient "
    "accumulation); tokens/step: one step over all ranks; HSDP R × S: R replica groups, each sharding the "
    f"model over S ranks; memory: tensors only, not {NOT_COUNTED}."
)


def table_row(r: DryRun) -> str:
    per_step = max(r.gather * r.accum + r.reduce + x + r.step_other for x in r.exchange)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return (
        f"| {r.config} | {r.world} | {_layout(r).split(' over')[0]} | {r.micro_batch} × {r.accum} "
        f"| {r.tokens_per_step:,} "
        f"| {max(r.params) / MIB:,.0f} | {max(r.grads) / MIB:,.0f} | {max(r.opt_state) / MIB:,.0f} "
        f"| {max(r.ns_flops) / 1e9:,.0f} / {mean(r.ns_flops) / 1e9:,.0f} "
        f"| {max(r.exchange) / MB:,.1f} / {mean(r.exchange) / MB:,.1f} | {per_step / GB:,.2f} "
        f"| {r.activations / GIB:.2f} | {r.peak / GIB:.2f} | {r.seconds:.0f} |"
    )


def unsupported_rows() -> list[str]:
    """A line for each family of backends the dry run cannot run, naming its last backend (ZeRO-1/2: zero2)."""
    rows = []
    for kind, why in UNSUPPORTED.items():
        last = [name for name, cls in BACKENDS.items() if issubclass(cls, kind)][-1]
        rows.append(f"ZeRO-1/2 (`parallel.backend={last}`): not run; {why}.")
    return rows
