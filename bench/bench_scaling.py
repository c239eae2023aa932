"""The cluster on paper (docs/scaling.md, "The cluster on paper"): bytes per rank per step on NVLink
and on the inter-node network, Newton–Schulz FLOPs per rank, and the predicted optimizer share of
a step, for the paper's 125m / 545m / 1.1b configs on 8–512 GPUs (8 per node), under FSDP2 over
every rank, HSDP (shard within a node, replicate across nodes) and HSDP with the NS work split
across the replica groups. Printed as the tables of docs/scaling.md (about 10 minutes on 2 CPU
cores: one dry run per row).

    python -m bench.bench_scaling [--gpus 8 64 256 512] [--out docs/scaling_tables.md]

What the code can answer comes from the code: each row is `launch.dryrun` (rank 0 of that world
set up and stepped on a fake process group), so the micro-batch and accumulation, FSDP2's
collectives (which, how many, how large, over which ranks: all-gathers per micro-batch, the
gradient reduce-scatter and HSDP's all-reduce once a step) and every rank's NS FLOPs are what the
run does. The owner exchange is counted per link from the optimizer's own plan
(`orscale.distributed.owners.exchange_plan`), checked against `ShardedMuonFamily`'s `bytes_sent`
on 2 and 4 CPU ranks (tests/orscale/test_hsdp_optim.py). What it cannot answer is modelled: each
collective as the ring NCCL runs (a ring over several nodes leaves each node through every GPU's
own NIC, rail-aligned channels, so 1/8 of a rank's ring bytes cross the network), times as bytes
over the achievable bandwidth of the link they use (the slower of the two bounds each
collective), FLOPs over the peak times an assumed efficiency; every figure and its source is in
`HARDWARE` and docs/scaling.md.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import astuple, dataclass, replace
from pathlib import Path

import torch

from launch.dryrun.fake_world import Collective
from launch.dryrun.measure import dry_run
from launch.dryrun.report import batch_for
from launch.plan import load_config
from models import GPT
from models.gpt import GPTConfig
from orscale import OptimConfig
from orscale.distributed.owners import Layout, assign_owners, exchange_plan, row_split
from orscale.muon_family import N_COLS
from orscale.routing import route_parameters

ROOT = Path(__file__).resolve().parents[1]
GPUS_PER_NODE = 8
SIZES = ("125m", "545m", "1.1b")
LAYOUTS = ("fsdp2", "hsdp", "hsdp+split")


@dataclass(frozen=True)
class Hardware:
    """Per-GPU figures. Datasheets: H100 SXM and H200 SXM both 989.4 dense BF16 TFLOP/s and 900
    GB/s NVLink 4 (both directions: 450 GB/s each way) (nvidia.com/en-us/data-center/h100, /h200);
    a DGX/HGX H100 or H200 node has 8 ConnectX-7 NICs at 400 Gb/s = 50 GB/s each way, one per GPU
    (DGX H100/H200 user guide). Achieved: `link_eff` of the wire rate (nccl-tests' bus bandwidth;
    a 2-node 8 x H100 all_reduce at 8 GiB reached 90% of its 25 GB/s NICs, see docs/scaling.md);
    `mfu` and `ns_eff`: assumed shares of the BF16 peak for the model's forward/backward and for
    NS's matmuls (replace them with bench/gpu_check.sh's measured ones)."""

    name: str
    bf16_flops: float = 989.4e12
    nvlink_bw: float = 450e9  # bytes/s per direction per GPU
    nic_bw: float = 50e9  # bytes/s per direction per GPU
    link_eff: float = 0.8
    hop_intra_s: float = 2e-6  # latency per step of a collective (assumed; see docs/scaling.md)
    hop_inter_s: float = 6e-6
    mfu: float = 0.4
    ns_eff: float = 0.5


HARDWARE = {
    "h100/h200, 8x400G IB": Hardware("H100/H200 SXM, 8 x 400 Gb/s per node"),
    "h100/h200, 8x200G": Hardware("H100/H200 SXM, 8 x 200 Gb/s per node", nic_bw=25e9),
}


@dataclass
class Traffic:
    """One rank's part of some collectives: bytes it sends over NVLink and through its NIC, and the
    latency steps on their critical path (a ring over n ranks: n − 1 of them; a small all-reduce's
    tree: 2·log₂ n; an all_to_all: 1)."""

    intra: float = 0.0
    inter: float = 0.0
    hops_intra: float = 0.0
    hops_inter: float = 0.0

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def __mul__(self, k: float) -> Traffic:
        return Traffic(*(a * k for a in astuple(self)))

    def seconds(self, hw: Hardware) -> float:
        """NVLink and the NICs work at once: the slower of the two, plus the latency steps."""
        bw = max(self.intra / hw.nvlink_bw, self.inter / hw.nic_bw) / hw.link_eff
        return bw + self.hops_intra * hw.hop_intra_s + self.hops_inter * hw.hop_inter_s


def muon_shapes(cfg: GPTConfig) -> list[tuple[int, ...]]:
    """The Muon family's matrices, in the order its optimizer holds them (owner assignment)."""
    with torch.device("meta"):
        model = GPT(cfg)
    return [tuple(p.shape) for _, p in route_parameters(model, OptimConfig(name="orscale_lm")).matrices]


def layouts(shapes: list[tuple[int, ...]], replicas: int, shards: int) -> list[Layout]:
    """The optimizer's layouts: owners over the shard group, or over every rank (replica split)."""
    owners = assign_owners(shapes, replicas * shards, replicas)
    return [Layout(o, m, n, *row_split(m, shards)) for (m, n), o in zip(shapes, owners, strict=True)]


def exchange_traffic(
    shapes: list[tuple[int, ...]],
    replicas: int,
    shards: int,
    rank: int,
    q_bytes: int,
    gpus_per_node: int = GPUS_PER_NODE,
) -> Traffic:
    """What `rank` (global; replicas > 1: the replica split) sends in one step's owner exchange:
    fp32 M̂ rows to owners and Q rows in the NS dtype back, inside the shard group (all_to_all,
    counted per destination by the destination's node), then the replica split's all_gather of Q
    rows across "replicate" (a ring over one rank per replica group)."""
    xrank = rank if replicas > 1 else rank % shards  # this rank among the owner slots
    plan = exchange_plan(layouts(shapes, replicas, shards), xrank, shards, replicas)
    base, me = rank - rank % shards, rank % shards  # the shard group's first global rank
    spans = base // gpus_per_node != (base + shards - 1) // gpus_per_node
    out = Traffic(hops_inter=2) if spans else Traffic(hops_intra=2)  # two all_to_all (one bucket)
    for d in range(shards):
        if d != me:
            nbytes = 4 * plan.to_owner[d] + q_bytes * plan.at_owner[d]
            if (base + d) // gpus_per_node == rank // gpus_per_node:
                out.intra += nbytes
            else:
                out.inter += nbytes
    if replicas > 1:
        out = out + ring(
            replicas * max(plan.shared) * q_bytes, (replicas - 1) / replicas, list(range(me, replicas * shards, shards))
        )
    return out


def norm_bytes(n_matrices: int, shards: int) -> int:
    """The trust ratio's one all_reduce of [N, N_COLS] fp32 sums over the shard group (as counted)."""
    return int(2 * (shards - 1) / shards * n_matrices * N_COLS * 4) if shards > 1 else 0


def optimizer_bytes_sent(shapes: list[tuple[int, ...]], replicas: int, shards: int, rank: int, q_bytes: int) -> int:
    """What `ShardedMuonFamily.bytes_sent` reads after a step in which every matrix had a gradient
    (`replicas` > 1: with the replica split)."""
    t = exchange_traffic(shapes, replicas, shards, rank, q_bytes)
    return round(t.intra + t.inter) + norm_bytes(len(shapes), shards)


def ring(
    nbytes: float,
    factor: float,
    ranks: list[int],
    count: int = 1,
    tree: bool = False,
    gpus_per_node: int = GPUS_PER_NODE,
) -> Traffic:
    """A rank's share of `count` ring collectives over global `ranks` (factor (n−1)/n, or 2(n−1)/n
    for an all-reduce): all NVLink within a node; across nodes, 1/gpus_per_node of it through the
    NIC when the group holds whole nodes (rail-aligned rings), all of it when it holds one rank per
    node. `tree`: a small all-reduce (NCCL's tree: 2·log₂ n latency steps instead of the ring's)."""
    n, nodes = len(ranks), {r // gpus_per_node for r in ranks}
    bus = factor * nbytes * count
    steps = count * ((2 * math.ceil(math.log2(n)) if tree else n - 1) if n > 1 else 0)
    if len(nodes) == 1:
        return Traffic(intra=bus, hops_intra=steps)
    if len(nodes) == n:
        return Traffic(inter=bus, hops_inter=steps)
    return Traffic(intra=bus * (gpus_per_node - 1) / gpus_per_node, inter=bus / gpus_per_node, hops_inter=steps)


@dataclass
class Row:
    size: str
    gpus: int
    layout: str
    tokens_per_step: int
    accum: int
    param_gather: Traffic
    grad_reduce: Traffic
    exchange: Traffic
    norm: Traffic
    ns_flops: float  # per rank (the busiest)
    model_flops: float  # per rank

    def times(self, hw: Hardware) -> dict[str, float]:
        compute = self.model_flops / (hw.bf16_flops * hw.mfu)
        fsdp = (self.param_gather + self.grad_reduce).seconds(hw)
        ns = self.ns_flops / (hw.bf16_flops * hw.ns_eff)
        exchange = (self.exchange + self.norm).seconds(hw)
        serial = ns + exchange  # one bucket at a time
        piped = max(ns, exchange)  # the pipeline's bound (many buckets, perfect overlap)
        base = max(compute, fsdp)  # FSDP2 prefetches: its collectives hide under compute when they can
        return dict(
            compute=compute,
            fsdp=fsdp,
            ns=ns,
            exchange=exchange,
            step=base + serial,
            share=serial / (base + serial),
            step_piped=base + piped,
            piped=piped / (base + piped),
        )


def plan(size: str, gpus: int, layout: str) -> Row:
    """One configuration, its step as the code runs it: `launch.dryrun` sets up and steps rank 0 on
    a fake world of `gpus` ranks (the micro-batch and accumulation the run's setup picks for the
    paper's batch, or one sequence per GPU when there are more GPUs than sequences:
    `launch.dryrun.report.batch_for`) and logs every collective of one micro-batch's forward and
    backward (FSDP2's all-gathers, reduce-scatters and HSDP's all-reduces, with their groups); the
    owner exchange is counted per link from the optimizer's own plan (`exchange_plan`)."""
    config = ROOT / f"configs/{size}.yaml"
    shards = gpus if layout == "fsdp2" else min(GPUS_PER_NODE, gpus)
    replicas = gpus // shards
    split = layout == "hsdp+split" and replicas > 1
    overrides = [*batch_for(config, gpus), *(["parallel.muon_replica_split=true"] if split else [])]
    run = dry_run(config, gpus, replicate=replicas, backend="fsdp", overrides=overrides, memory=False)
    gather = sum((link_traffic(c) for c in run.calls if c.kind == "all_gather"), Traffic()) * run.accum
    reduce = sum((link_traffic(c) for c in run.calls if c.kind != "all_gather"), Traffic())  # once a step
    cfg = load_config(str(config))  # the model and its context
    model_cfg, seq = cfg.model.resolve(), cfg.data.seq_len
    with torch.device("meta"):
        model = GPT(model_cfg)
    shapes = muon_shapes(model_cfg)
    split_over = replicas if split else 1
    owners = assign_owners(shapes, split_over * shards, split_over)
    # The ranks that own something, and one that owns nothing (all non-owners send alike); the
    # busiest link of each kind over them (bf16 Q: the GPU default).
    others = [r for r in range(split_over * shards) if r not in owners][:1]
    per_rank = [exchange_traffic(shapes, split_over, shards, r, q_bytes=2) for r in {*owners, *others}]
    exchange = Traffic(max(t.intra for t in per_rank), max(t.inter for t in per_rank))
    sequences = run.micro_batch * run.accum  # per GPU per step
    return Row(
        size,
        gpus,
        layout,
        gpus * sequences * seq,
        run.accum,
        gather,
        reduce,
        exchange,
        ring(norm_bytes(len(shapes), shards), 1.0, list(range(shards)), tree=True),  # norm_bytes has the ring factor
        max(run.ns_flops),
        model.flops_per_token(seq, causal=True) * sequences * seq,
    )


def link_traffic(c: Collective) -> Traffic:
    """One logged collective as a ring over its group's ranks: what rank 0 sends, per link."""
    return ring(c.sent, 1.0, list(c.ranks))


def _gb(t: Traffic) -> str:
    return f"{t.intra / 1e9:.2f} / {t.inter / 1e9:.2f}"


def tables(rows: list[Row], hardware: list[Hardware]) -> str:
    head = (
        "| model | GPUs | layout | tokens/step (accum) | param all-gather GB | grad reduce GB | owner exchange MB "
        "| norm all_reduce B | NS GFLOP/rank |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    lines = [head]
    for r in rows:
        ex = f"{r.exchange.intra / 1e6:.1f} / {r.exchange.inter / 1e6:.1f}"
        lines.append(
            f"| {r.size} | {r.gpus} | {r.layout} | {r.tokens_per_step:,} ({r.accum}) | {_gb(r.param_gather)} "
            f"| {_gb(r.grad_reduce)} | {ex} | {r.norm.intra + r.norm.inter:,.0f} | {r.ns_flops / 1e9:,.0f} |"
        )
    out = ["Bytes per rank per step, NVLink / inter-node (the busiest rank):", "", *lines]
    for hw in hardware:
        out += ["", f"Predicted step, {hw.name} (ms; optimizer share = optimizer / step):", ""]
        out.append(
            "| model | GPUs | layout | fwd+bwd | FSDP2 comm | NS | exchange+norms | step | optimizer share "
            "| step, pipelined | share |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        )
        for r in rows:
            t = r.times(hw)
            out.append(
                f"| {r.size} | {r.gpus} | {r.layout} | {t['compute'] * 1e3:.1f} | {t['fsdp'] * 1e3:.1f} "
                f"| {t['ns'] * 1e3:.2f} | {t['exchange'] * 1e3:.2f} | {t['step'] * 1e3:.1f} | {t['share']:.1%} "
                f"| {t['step_piped'] * 1e3:.1f} | {t['piped']:.1%} |"
            )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[8, 64, 256, 512])
    ap.add_argument("--out", type=Path, help="also write the tables here (markdown)")
    ap.add_argument("--hop-inter-us", type=float, help="latency per inter-node collective step (default 6)")
    ap.add_argument("--mfu", type=float, help="forward/backward share of the BF16 peak (default 0.4)")
    ap.add_argument("--ns-eff", type=float, help="Newton-Schulz matmuls' share of the BF16 peak (default 0.5)")
    args = ap.parse_args()
    changes = {"hop_inter_s": args.hop_inter_us and args.hop_inter_us * 1e-6, "mfu": args.mfu, "ns_eff": args.ns_eff}
    hardware = [replace(hw, **{k: v for k, v in changes.items() if v}) for hw in HARDWARE.values()]
    rows = [
        plan(size, g, layout)
        for size in SIZES
        for g in args.gpus
        for layout in LAYOUTS
        if not (g <= GPUS_PER_NODE and layout != "fsdp2")  # one node: HSDP is FSDP2
    ]
    text = tables(rows, hardware)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
