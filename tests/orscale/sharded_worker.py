"""The 2-rank side of tests/orscale/test_sharded_optim.py (`run_all`, a job for the pool of ranks).

Every rank runs the single-process reference itself (plain ``MuonFamily`` + AdamW on the whole
model, no collectives), then FSDP2 (owner and replicate mode) and DDP runs from the same initial
weights with the same synthetic gradients (fp32 Newton–Schulz), comparing every step; a DCP
round-trip of the sharded optimizer state; and short real forward/backward runs. Each rank returns
its numbers; the tests assert on them. Besides a choice of the family's variants, every other member
of the Muon family in the optimizer table runs here too (on the owner exchanges, and DCP's round trip).
"""

from __future__ import annotations

import hashlib
import json

import torch
import torch.distributed as dist
from torch import nn

from orscale import (
    MuonFamily,
    OptimConfig,
    build_optimizers,
    set_lr,
)
from orscale.distributed.owners import row_split
from orscale.muon_spec import MuonOptions
from orscale.routing import canonical_name
from tests.orscale.optim_helpers import muon_family_members

PRESETS = ["muon_moonlight", "orscale_lm", "mutrust", "orscale_lm_decoupled"]
MEMBERS = muon_family_members()  # the table's other members of the Muon family
LRS = [0.0, 0.02, 0.05, 0.03, 0.01, 0.02]  # step 0 has lr = 0: no update, no calibration
DROP_STEP = 3  # at this step one matrix has no gradient (the partial path)
DROP = {"toy": "blocks.1.b.weight", "gpt": "blocks.1.attn.out.weight"}
FLAVOURS = [("fsdp", "owner"), ("fsdp", "replicate"), ("ddp", "owner"), ("ddp", "replicate")]
# (optimizer, the flavours it runs on): the variants on all, the other members on the owner exchanges.
CASES = [(p, FLAVOURS) for p in PRESETS] + [(m, [f for f in FLAVOURS if f[1] == "owner"]) for m in MEMBERS]
_SYNCING = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


class ToyBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 1, bias=False)  # 1 row: rank 1's shard is EMPTY
        self.b = nn.Linear(7, 5, bias=False)  # 5 rows: 3 + 2 (uneven)
        self.c = nn.Linear(6, 6, bias=False)
        self.d = nn.Linear(3, 10, bias=False)  # tall: NS works on the transpose


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(9, 6)
        self.blocks = nn.ModuleList([ToyBlock(), ToyBlock()])
        self.final_norm = nn.Parameter(torch.ones(5))  # 1-D, 3 + 2 rows: AdamW on DTensors


def make_model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "toy":
        return Toy()
    from models.gpt import GPT
    from models.presets import get_preset

    return GPT(get_preset("tiny", n_layer=2, d_model=64, n_head=4, max_seq_len=32, vocab_size=512))


def muon_shapes(kind: str) -> list[tuple[int, int]]:
    """The shapes `make_model(kind)`'s Muon family holds, in its order (bench/bench_scaling.py's input)."""
    from orscale.routing import route_parameters

    return [tuple(p.shape) for _, p in route_parameters(make_model(kind), OptimConfig(name="orscale_lm")).matrices]


def synthetic_grads(model: nn.Module, kind: str, t: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + t)
    out = {}
    for name, p in model.named_parameters():
        name = canonical_name(name)
        g = 0.5 * torch.randn(p.shape, generator=gen)
        if not (t == DROP_STEP and name == DROP[kind]):
            out[name] = g
    return out


def is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if is_dtensor(t) else t.detach()


def set_grads(model: nn.Module, grads: dict[str, torch.Tensor]) -> None:
    from torch.distributed.tensor import DTensor

    for name, p in model.named_parameters():
        g = grads.get(canonical_name(name))
        if g is None:
            p.grad = None
        elif is_dtensor(p):
            mesh = p.device_mesh  # 1-D (FSDP2) or HSDP's 2-D: rows split over the last dim
            rows, starts = row_split(p.shape[0], mesh.size(mesh.ndim - 1))
            r = mesh.get_local_rank(mesh.ndim - 1)
            local = g[starts[r] : starts[r] + rows[r]].clone()
            p.grad = DTensor.from_local(local, mesh, p.placements, shape=p.shape, stride=p.stride())
        else:
            p.grad = g.clone()


def shard(model: nn.Module, backend: str, mesh=None) -> nn.Module:
    """FSDP2 (on `mesh`: default the 1-D world; a 2-D one is HSDP) or DDP."""
    if backend == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model)


def muon_of(opts: list) -> MuonFamily:
    return next(o for o in opts if isinstance(o, MuonFamily))


def c_values(opt: MuonFamily) -> list[float]:
    return [float(opt.state[p]["c"]) if "c" in opt.state[p] else 1.0 for p in opt.param_groups[0]["params"]]


def cfg_for(preset: str) -> OptimConfig:
    return OptimConfig(name=preset, lr=0.02).with_options(MuonOptions(ns_dtype="fp32"))


def matrix_states(opt: MuonFamily) -> dict[str, dict[str, torch.Tensor]]:
    """Each matrix's optimizer-state tensors but the 0-d ones (momentum, a member's own state, the
    clip counters), whole, by canonical name."""
    names, params = opt.param_groups[0]["param_names"], opt.param_groups[0]["params"]
    return {
        canonical_name(n): {k: full(v).clone() for k, v in opt.state[p].items() if torch.is_tensor(v) and v.ndim}
        for n, p in zip(names, params, strict=True)
    }


def reference(kind: str, preset: str) -> dict:
    """Single-process run: per step, full weights (by canonical name) and c."""
    model = make_model(kind)
    opts = build_optimizers(model, cfg_for(preset))
    weights, cs = [], []
    for t, lr in enumerate(LRS):
        set_grads(model, synthetic_grads(model, kind, t))
        set_lr(opts, lr)
        for o in opts:
            o.step()
        weights.append({canonical_name(n): p.detach().clone() for n, p in model.named_parameters()})
        cs.append(c_values(muon_of(opts)))
    muon = muon_of(opts)
    return {"weights": weights, "c": cs, "state": matrix_states(muon), "ns_calls": muon.ns_calls}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


class _NoHostSync:
    """Inside: any Python-level host sync on a tensor (``.item()``, ``bool(t)``, ...) raises."""

    def __enter__(self):
        self.saved = {a: getattr(torch.Tensor, a) for a in _SYNCING}

        def forbidden(*args, **kwargs):
            raise AssertionError("host sync inside the optimizer step")

        for a in _SYNCING:
            setattr(torch.Tensor, a, forbidden)

    def __exit__(self, *exc):
        for a, f in self.saved.items():
            setattr(torch.Tensor, a, f)


def weights_digest(model: nn.Module) -> str:
    """A hash of this rank's weights (its shards, or whole replicas): bit-identity of two runs."""
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters(), key=lambda item: canonical_name(item[0])):
        h.update((p.to_local() if is_dtensor(p) else p).detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def sharded_run(
    kind: str, preset: str, backend: str, mode: str, ref: dict, bucket_numel: int | None = None, mesh=None, **kw
) -> dict:
    """`mesh`: FSDP2's (HSDP when 2-D); `kw`: more build_optimizers arguments (replica_split, overlap)."""
    model = shard(make_model(kind), backend, mesh)
    opts = build_optimizers(model, cfg_for(preset), backend=backend, mode=mode, **kw)
    muon = muon_of(opts)
    if bucket_numel is not None:
        muon.bucket_numel = bucket_numel
    err_m = err_a = c_err = 0.0
    ns_calls, n_active, bytes_sent, collectives, cs = [], [], [], [], []
    for t, lr in enumerate(LRS):
        set_grads(model, synthetic_grads(model, kind, t))
        set_lr(opts, lr)
        with _NoHostSync():
            muon.step()
        for o in opts:
            if o is not muon:
                o.step()
        for n, p in model.named_parameters():
            e = rel(full(p), ref["weights"][t][canonical_name(n)])
            if p.ndim == 2 and canonical_name(n).startswith("blocks."):
                err_m = max(err_m, e)
            else:
                err_a = max(err_a, e)
        c = c_values(muon)
        cs.append(c)
        c_err = max([c_err] + [abs(x - y) / max(abs(y), 1e-30) for x, y in zip(c, ref["c"][t], strict=True)])
        ns_calls.append(muon.ns_calls)
        n_active.append(sum(1 for p in muon.param_groups[0]["params"] if p.grad is not None))
        bytes_sent.append(muon.bytes_sent)
        collectives.append(muon.n_collectives)
    names = muon.param_groups[0]["param_names"]
    states = matrix_states(muon)
    assert {n: st.keys() for n, st in states.items()} == {n: st.keys() for n, st in ref["state"].items()}
    state_err = max(rel(t, ref["state"][n][k]) for n, st in states.items() for k, t in st.items())
    # FSDP2: every state laid out by the matrix's rows (momentum, a member's per-row state) is a DTensor
    rows_dtensor = [
        is_dtensor(v)
        for p in muon.param_groups[0]["params"]
        for v in muon.state[p].values()
        if torch.is_tensor(v) and v.ndim == 2
    ]
    c_plain = all(
        not is_dtensor(muon.state[p]["c"]) and muon.state[p]["c"].dtype == torch.float32
        for p in muon.param_groups[0]["params"]
        if "c" in muon.state[p]
    )
    return dict(
        err_matrix=err_m,
        err_adamw=err_a,
        c_err=c_err,
        c=cs,
        ns_calls=ns_calls,
        n_active=n_active,
        bytes_sent=bytes_sent,
        collectives=collectives,
        state_err=state_err,
        row_states_are_dtensors=all(rows_dtensor),
        row_states_are_plain=not any(rows_dtensor),
        planned_bytes=muon.planned_bytes_sent(dist.get_rank() % muon.owner_slots),
        c_plain=c_plain,
        n_matrices=len(names),
        owners=muon.owners()[0],
        digest=weights_digest(model),
    )


def dcp_roundtrip(kind: str, ckpt: str, preset: str = "orscale_lm") -> dict:
    """FSDP2 `kind` model, `preset`: 3 steps, save, load into a fresh model/optimizers, compare
    every state tensor (momentum and a member's own state: DTensor shards, incl. an empty one; c:
    0-d fp32); then one more identical step on both; and load the same files into one plain
    process (the toy model has an empty shard on rank 1 of 2)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def build():
        model = shard(make_model(kind), "fsdp")
        return model, build_optimizers(model, cfg_for(preset), backend="fsdp")

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if is_dtensor(t) else t

    def same_state(x: dict, y: dict) -> bool:
        return x.keys() == y.keys() and all(torch.equal(local(x[k]), local(y[k])) for k in x if torch.is_tensor(x[k]))

    model, opts = build()
    for t in range(1, 4):
        set_grads(model, synthetic_grads(model, kind, t))
        set_lr(opts, LRS[t])
        for o in opts:
            o.step()
    msd, osd = get_state_dict(model, opts)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)
    fresh, fresh_opts = build()
    msd, osd = get_state_dict(fresh, fresh_opts)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(fresh, fresh_opts, model_state_dict=state["model"], optim_state_dict=state["optim"])
    a, b = muon_of(opts), muon_of(fresh_opts)
    pa, pb = a.param_groups[0]["params"], b.param_groups[0]["params"]
    calibrated = [q for q in pb if "c" in b.state[q]]
    out = {
        "state_equal": all(same_state(a.state[p], b.state[q]) for p, q in zip(pa, pb, strict=True)),
        "row_states_are_dtensors": all(
            is_dtensor(v) for q in pb for v in b.state[q].values() if torch.is_tensor(v) and v.ndim == 2
        ),
        "c_positive": all(float(b.state[q]["c"]) > 0 for q in calibrated),
        "c_plain_fp32": all(
            not is_dtensor(b.state[q]["c"]) and b.state[q]["c"].dtype == torch.float32 and b.state[q]["c"].ndim == 0
            for q in calibrated
        ),
    }
    saved = matrix_states(a)
    grads = synthetic_grads(model, kind, 4)
    for m, os_ in ((model, opts), (fresh, fresh_opts)):
        set_grads(m, grads)
        set_lr(os_, LRS[4])
        for o in os_:
            o.step()
    out["next_step_equal"] = all(
        torch.equal(p.to_local(), q.to_local()) for p, q in zip(model.parameters(), fresh.parameters(), strict=True)
    )
    # The sharded checkpoint into one plain (unsharded) process: every state tensor whole, and c.
    plain = make_model(kind)
    plain_opts = build_optimizers(plain, cfg_for(preset))
    msd, osd = get_state_dict(plain, plain_opts)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=ckpt, no_dist=True)
    set_state_dict(plain, plain_opts, model_state_dict=state["model"], optim_state_dict=state["optim"])
    c = muon_of(plain_opts)
    out["plain_state_equal"] = all(
        same_state(saved[n], st) and not any(is_dtensor(v) for v in st.values()) for n, st in matrix_states(c).items()
    )
    pc = c.param_groups[0]["params"]
    out["plain_c_equal"] = all(
        torch.equal(a.state[p]["c"], c.state[q]["c"]) for p, q in zip(pa, pc, strict=True) if "c" in a.state[p]
    )
    return out


def real_backward(backend: str) -> dict:
    """GPT, orscale_lm, 3 steps with real batches: each rank backpropagates half of the batch
    (the backend averages the gradients); the reference sees the whole batch."""
    rank, world = dist.get_rank(), dist.get_world_size()

    def batch(t):
        gen = torch.Generator().manual_seed(77 + t)
        return torch.randint(0, 512, (12, 32), generator=gen)  # splits evenly over 1–4 ranks

    def loss_of(m, idx):
        logits = m(idx)
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), torch.roll(idx, -1, 1).flatten())

    ref = make_model("gpt")
    ref_opts = build_optimizers(ref, cfg_for("orscale_lm"))
    model = shard(make_model("gpt"), backend)
    opts = build_optimizers(model, cfg_for("orscale_lm"), backend=backend)
    err = {"matrix": 0.0, "adamw": 0.0}
    for t in range(3):
        idx = batch(t)
        for m, os_, x in ((ref, ref_opts, idx), (model, opts, idx.chunk(world)[rank])):
            for o in os_:
                o.zero_grad(set_to_none=True)
            loss_of(m, x).backward()
            set_lr(os_, 0.02)
            for o in os_:
                o.step()
        ref_w = {canonical_name(n): p.detach() for n, p in ref.named_parameters()}
        for n, p in model.named_parameters():
            k = "matrix" if p.ndim == 2 and canonical_name(n).startswith("blocks.") else "adamw"
            err[k] = max(err[k], rel(full(p), ref_w[canonical_name(n)]))
    return err


def bucketed_runs(kind: str) -> list[tuple[str, str, bool]]:
    """(key, backend, overlap) of the small-bucket runs: pipelined (the default) and one bucket at a
    time (`_sync`), whose weights must be bit-identical."""
    return [
        (f"{kind}/orscale_lm/{backend}/owner_bucketed{'' if overlap else '_sync'}", backend, overlap)
        for backend in ("fsdp", "ddp")
        for overlap in (True, False)
    ]


def run_all(ckpt: str) -> dict:
    """Every comparison of this file on this rank (a job for 2 ranks of the pool, tests/pool.py),
    as JSON would carry it."""
    torch.set_num_threads(1)
    results: dict = {"world": dist.get_world_size(), "runs": {}}
    for kind in ("toy", "gpt"):
        for preset, flavours in CASES:
            ref = reference(kind, preset)
            for backend, mode in flavours:
                key = f"{kind}/{preset}/{backend}/{mode}"
                results["runs"][key] = sharded_run(kind, preset, backend, mode, ref)
                results["runs"][key]["ref_c"] = ref["c"]
                results["runs"][key]["ref_ns_calls"] = ref["ns_calls"]
            if preset == "orscale_lm":  # several buckets, some where a rank owns nothing
                for key, backend, overlap in bucketed_runs(kind):
                    # DDP's buckets take a run of matrices from every owner, so its cap is one matrix
                    cap = {"fsdp": {"toy": 40, "gpt": 12288}, "ddp": {"toy": 8, "gpt": 4096}}[backend][kind]
                    results["runs"][key] = sharded_run(kind, preset, backend, "owner", ref, cap, overlap=overlap)
                    results["runs"][key]["ref_c"] = ref["c"]
    # the other members on the toy model alone: its uneven and empty row shards are what their state adds
    dcp_runs = [(kind, "orscale_lm") for kind in ("toy", "gpt")] + [("toy", m) for m in MEMBERS]
    results["dcp"] = {f"{k}/{p}": dcp_roundtrip(k, f"{ckpt}_{k}_{p}", p) for k, p in dcp_runs}
    results["real"] = {b: real_backward(b) for b in ("fsdp", "ddp")}
    return json.loads(json.dumps(results))
