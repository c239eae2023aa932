"""The dry run of one rank: the run's own setup (config checks, micro-batch and accumulation,
`launch.engine`'s engine: model, parallelism, `orscale.build_optimizers`) and one real training
step (forward and backward of one micro-batch, clip, optimizer step) in a fake world
(`launch.dryrun.fake_world`), measured: memory by torch's `MemTracker`, collectives from the log,
and every rank's share of the optimizer's work from its own owner layout. docs/scaling.md, "The
dry run", says what each figure is and how it was checked.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.distributed._tools.mem_tracker import MemTracker
from torch.nn.parallel import DistributedDataParallel

from launch.backends.base import Backend
from launch.backends.registry import backend_for, resolve_auto
from launch.backends.torch_native import DDPBackend, FSDPOptions
from launch.backends.zero import ZeroBackend
from launch.config import read_config
from launch.dryrun.fake_world import (
    Collective,
    CollectiveLog,
    check_world,
    fake_allreduce_hook,
    fake_world,
    is_fake_world,
)
from launch.engine.torch_engine import TorchEngine
from launch.environment import EnvFacts
from launch.errors import ConfigError
from launch.plan import Plan, resolve
from launch.runtime.process_group import DistEnv
from models import GPT
from orscale.distributed.owners import OwnerMuonFamily
from orscale.muon_spec import MuonOptions

# The backends the fake world cannot run, by family, and why (the one line the dry run gives for them).
UNSUPPORTED: dict[type[Backend], str] = {
    ZeroBackend: "DeepSpeed builds and runs forward/backward on the fake group, but its ZeRO step reads "
    "the gradient norm's value (stage_1_and_2.py: is_invalid_grad_norm) and our layout check compares "
    "partition values (orscale/distributed/zero.py: bind), which fake tensors do not have",
}


def unsupported(backend: str) -> str | None:
    """Why the fake world cannot run `parallel.backend`, or None when it can."""
    return next((why for kind, why in UNSUPPORTED.items() if isinstance(backend_for(backend), kind)), None)


@dataclass
class DryRun:
    """One rank's dry run. Lists are per global rank (bytes, FLOPs); the scalars are this rank's."""

    config: str
    backend: str  # parallel.backend: ddp | fsdp (HSDP where replicate > 1)
    world: int
    replicate: int
    rank: int
    micro_batch: int
    seq_len: int
    accum: int
    param_dtype: str
    reshard: bool
    params: list[int] = field(default_factory=list)  # parameter storage (FSDP2's padded shards)
    grads: list[int] = field(default_factory=list)
    opt_state: list[int] = field(default_factory=list)
    ns_flops: list[float] = field(default_factory=list)  # Newton–Schulz FLOPs each rank owns
    exchange: list[int] = field(default_factory=list)  # owner exchange bytes sent (the optimizer's plan)
    exchange_measured: int = 0  # this rank's optimizer counter after the real step
    opt_state_measured: int = 0  # this rank's optimizer state, its storages counted
    ns_calls: int = 0
    gather: int = 0  # bytes this rank sends per micro-batch in parameter all-gathers
    reduce: int = 0  # per step: gradient reduce-scatters and all-reduces
    step_other: int = 0  # per step: the step's collectives besides the owner exchange (clip's norm)
    activations: int = 0  # tensors made in forward and still held at its end
    peak: int = 0  # steady state: the larger of forward/backward's peak with the optimizer state, the step's
    notes: list[str] = field(default_factory=list)
    calls: list[Collective] = field(default_factory=list)  # forward/backward's collectives, one micro-batch
    seconds: float = 0.0

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one training step over all ranks (every rank is a data-parallel one)."""
        return self.micro_batch * self.seq_len * self.accum * self.world

    @property
    def per_step(self) -> int:
        """Bytes this rank sends in one training step (accum micro-batches of all-gathers)."""
        return self.gather * self.accum + self.reduce + self.exchange[self.rank] + self.step_other


def storage_bytes(tensors: Iterable[Tensor | None]) -> int:
    """Bytes of the storages behind `tensors` (a DTensor's local shard), each storage once."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        st = local.untyped_storage()
        seen[st._cdata] = st.nbytes()
    return sum(seen.values())


def bytes_on_every_rank(tensors: Iterable[Tensor], world: int) -> list[int]:
    """Bytes of `tensors` on each global rank: a DTensor's shard as DTensor lays it out at that
    rank's mesh coordinate (`Shard.local_shard_size_and_offset`: uneven and empty shards
    included); other tensors alike everywhere."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    out = [0] * world
    for t in tensors:
        if not isinstance(t, DTensor):
            out = [b + t.numel() * t.element_size() for b in out]
            continue
        shape = tuple(t.device_mesh.shape)
        with unset_fake_temporarily():  # the mesh's rank map is a real tensor
            ranks = t.device_mesh.mesh.flatten().tolist()  # the rank at each coordinate, row-major
        cache: dict[tuple[int, ...], int] = {}
        for i, g in enumerate(ranks):
            coord = tuple(i // math.prod(shape[d + 1 :]) % shape[d] for d in range(len(shape)))
            if coord not in cache:
                local = list(t.shape)
                for d, placement in enumerate(t.placements):
                    if isinstance(placement, Shard):
                        local[placement.dim] = int(
                            Shard.local_shard_size_and_offset(local[placement.dim], shape[d], coord[d])[0]
                        )
                    elif not isinstance(placement, Replicate):
                        raise NotImplementedError(f"a state tensor placed {placement}")
                cache[coord] = math.prod(local) * t.element_size()
            out[g] += cache[coord]
    return out


def _plan(path: str | Path, world: int, replicate: int, backend: str | None, overrides: list[str]) -> Plan:
    """The run's plan in this (fake) world, as train.py makes it, after the dry run's own refusals."""
    extra = [f"parallel.dp_replicate={replicate}"] if replicate > 1 else []
    cfg = read_config(str(path), [*overrides, *([f"parallel.backend={backend}"] if backend else []), *extra])
    name = resolve_auto(cfg.parallel.backend, world)
    why = unsupported(name)
    if why is not None:
        raise ConfigError(f"the dry run cannot run parallel.backend={name}: {why}")
    if not backend_for(name).many_processes and world > 1:
        raise ConfigError(f"parallel.backend={name} runs one process; pass --backend fsdp or ddp for {world} ranks")
    return resolve(cfg, EnvFacts.from_env(cfg.train))


def dry_run(
    config: str | Path,
    world: int,
    *,
    replicate: int = 1,
    backend: str | None = None,
    rank: int = 0,
    overrides: Iterable[str] = (),
    gpus_per_node: int = 8,
    memory: bool = True,
) -> DryRun:
    """Set up and step rank `rank` of `world` as `python train.py --config <config> <overrides>`
    would on GPUs (bf16 compute, FSDP2's bf16 parameters and bf16 Newton–Schulz where `auto` would
    pick them there), in a fake world; measured. `memory=False`: no memory tracking, and forward/
    backward on one short sequence (every collective is the same; activations and peak stay 0)."""
    check_world(world, rank, gpus_per_node, replicate)
    start = time.perf_counter()
    with fake_world(world, rank, gpus_per_node) as log:
        result = step_rank(
            config,
            world,
            rank,
            log,
            replicate=replicate,
            backend=backend,
            overrides=overrides,
            gpus_per_node=gpus_per_node,
            memory=memory,
        )
    result.seconds = time.perf_counter() - start
    return result


def step_rank(
    config: str | Path,
    world: int,
    rank: int,
    log: CollectiveLog,
    *,
    replicate: int = 1,
    backend: str | None = None,
    overrides: Iterable[str] = (),
    gpus_per_node: int = 8,
    memory: bool = True,
) -> DryRun:
    """Build and step this rank in the world that exists (fake, or a real process group with the
    log active: the tests compare the two), measured."""
    notes: list[str] = []
    plan = _plan(config, world, replicate, backend, list(overrides))
    cfg, chosen, accum = plan.cfg, plan.backend, plan.accum_steps
    par, train = cfg.parallel, cfg.train
    model_cfg = cfg.model.resolve()
    dtype = torch.float32 if train.dtype == "fp32" else torch.bfloat16  # `auto` on a bf16 GPU
    fsdp = par.own(FSDPOptions)
    if fsdp.param_dtype == "auto" and chosen.shards_parameters:  # fsdp_mixed_precision on CUDA
        fsdp = dataclasses.replace(fsdp, param_dtype="bf16" if dtype == torch.bfloat16 else "fp32")
        par.sections = {**par.sections, fsdp.section: fsdp}
    ns = cfg.optim.own(MuonOptions)
    if ns.ns_dtype == "auto":  # what the Muon family picks on CUDA
        cfg.optim = cfg.optim.with_options(dataclasses.replace(ns, ns_dtype="bf16"))
    if par.compile != "none":
        notes.append(f"parallel.compile={par.compile}: inductor's partition of each graph, run eager")
        if isinstance(chosen, DDPBackend):  # dynamo's DDPOptimizer trips on fake tensors
            notes.append("DDP's compiled graphs are not split at bucket boundaries (dynamo's optimize_ddp off)")
    local = min(gpus_per_node, world)
    env = DistEnv(rank, world, rank % local, torch.device("cpu"), par.backend, local)
    with _compiled_without_codegen():
        engine = chosen.build_engine(model_cfg, par, cfg.optim, train, env, dtype, accum)
    assert isinstance(engine, TorchEngine)  # ZeRO was refused above (UNSUPPORTED)
    if isinstance(engine.module, DistributedDataParallel) and is_fake_world():
        engine.module.register_comm_hook(None, fake_allreduce_hook)
    muon = next((o for o in engine.optimizers if isinstance(o, OwnerMuonFamily)), None)
    gen = torch.Generator().manual_seed(0)
    shape = (train.micro_batch_size, cfg.data.seq_len + 1) if memory else (1, 17)
    batch = torch.randint(0, model_cfg.vocab_size, shape, generator=gen)

    tracker = _Tracker() if memory else _NoTracker()
    tracker.track_external(engine.module, *engine.optimizers)
    at_forward_end: dict[str, Any] = {}
    hook = engine.module.register_forward_hook(
        lambda *_: at_forward_end.update(_totals(tracker.get_tracker_snapshot("current")))
    )
    with tracker, torch._dynamo.config.patch(optimize_ddp=par.compile == "none" or not isinstance(chosen, DDPBackend)):
        log.phase = "forward/backward"
        engine.forward_backward(batch, last_micro_batch=True)
        forward_backward_peak = _totals(tracker.get_tracker_snapshot("peak"))["Total"]
        params = list(engine.model.parameters())
        grads = storage_bytes(p.grad for p in params)
        log.phase = "step"
        engine.step(cfg.optim.lr)
        step_peak = _totals(tracker.get_tracker_snapshot("peak"))["Total"]
    hook.remove()
    states = [t for opt in engine.optimizers for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    opt_state = bytes_on_every_rank(states, world)
    result = DryRun(
        config=Path(config).stem,
        backend=par.backend,
        world=world,
        replicate=par.dp_replicate,
        rank=rank,
        micro_batch=train.micro_batch_size,
        seq_len=cfg.data.seq_len,
        accum=accum,
        param_dtype=fsdp.param_dtype if chosen.shards_parameters else "fp32",
        reshard=_reshards(engine.model),
        params=[storage_bytes(params)] * world,  # FSDP2 pads every rank's shard to the largest
        grads=[grads] * world,
        opt_state=opt_state,
        gather=log.sent("forward/backward", ("all_gather",)),
        reduce=log.sent("forward/backward", ("reduce_scatter", "all_reduce")),
        activations=at_forward_end.get("Activation", 0),
        calls=[c for c in log.calls if c.phase == "forward/backward"],
        peak=max(forward_backward_peak + opt_state[rank], step_peak),
        notes=notes,
    )
    _owner_work(result, muon, log.sent("step"))
    result.opt_state_measured = storage_bytes(states)
    return result


class _NoTracker:
    """The tracker's interface, tracking nothing (`memory=False`)."""

    def track_external(self, *_: Any) -> None: ...

    def get_tracker_snapshot(self, kind: str = "current") -> dict:
        return {"none": {"Total": 0}}

    def __enter__(self) -> _NoTracker:
        return self

    def __exit__(self, *exc: object) -> None: ...


class _Tracker(MemTracker):
    """torch's MemTracker, off while torch.compile traces (its tracing tensors are not the run's)
    and on for the ops the compiled graphs run."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def _update_peak_stats(self, peak_state: Any) -> None:
        # The global peak only (torch's second half of this method): the per-module peaks, which
        # the dry run does not read, cost a pass over every module at every op.
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap["Total"]:
                self._peak_mem[dev] = snap["Total"]
                self._peak_mem_snap[dev] = dict(snap)


@contextmanager
def _compiled_without_codegen() -> Iterator[None]:
    """`parallel.compile` with torch's `aot_eager_decomp_partition` backend: the graphs, the
    decompositions and the min-cut partition (what backward keeps) that inductor would use, run
    op by op on the fake tensors instead of as generated kernels (which need real memory)."""
    import launch.engine.parallelize as parallelize

    original = parallelize._compile_forward
    parallelize._compile_forward = lambda module, backend: original(module, "aot_eager_decomp_partition")
    try:
        yield
    finally:
        parallelize._compile_forward = original
        torch._dynamo.reset()  # the next dry run (another world, other shapes) compiles afresh


def _owner_work(result: DryRun, muon: OwnerMuonFamily | None, step_sent: int) -> None:
    """Every rank's NS FLOPs and owner-exchange bytes, from the optimizer's own owner layout
    (global rank g is owner slot g % owner_slots: HSDP without the split repeats its shard group)."""
    world = result.world
    if muon is None:
        result.ns_flops, result.exchange, result.step_other = [0.0] * world, [0] * world, step_sent
        return
    slots = muon.owner_slots
    result.ns_flops = [muon.planned_ns_flops(g % slots) for g in range(world)]
    result.exchange = [muon.planned_bytes_sent(g % slots) for g in range(world)]
    result.exchange_measured, result.ns_calls = muon.bytes_sent, muon.ns_calls
    result.step_other = step_sent - muon.bytes_sent


def _totals(snapshot: dict) -> dict[str, int]:
    """MemTracker's snapshot summed over devices, per category (and "Total")."""
    out: dict[str, int] = {}
    for per_device in snapshot.values():
        for key, value in per_device.items():
            name = str(getattr(key, "value", key))  # MemTracker's categories are str enums
            out[name] = out.get(name, 0) + int(value)
    return out


def _reshards(model: GPT) -> bool:
    """Whether FSDP2 frees each block's gathered parameters after its forward (the `auto` rule)."""
    state = getattr(model.blocks[0], "_get_fsdp_state", None)
    if state is None:
        return False
    group = state()._fsdp_param_group
    return bool(group is not None and group.post_forward_mesh_info is not None)
