"""One rank of a world of any size, inside this process: torch's fake process group (every rank's
collectives return at once and move nothing: ``torch.testing._internal.distributed.fake_pg``) and
``FakeTensorMode`` (tensors carry shape, dtype and device but no storage), as torchtitan's memory
estimator runs its model. The project's own code then builds and steps as it would on that rank.

Three things the fake world needs that a real one does not, each kept to this context:

* Device meshes are built outside the fake mode: ``init_device_mesh`` reads its rank map's values
  (``tolist``), which a fake tensor does not have.
* Meta-device factories (``GPT`` is built on meta, then materialised) make real meta tensors: a
  parameter made of a fake tensor carries the fake mode's weak reference, and ``Module.to_empty``
  must swap it, which ``torch.utils.swap_tensors`` refuses.
* DDP's start-up check that every rank's parameters have the same shapes reads their values; it is
  skipped (one process: they do). DDP's gradient hook is ``fake_allreduce_hook`` (the fake group's
  Work carries no result for DDP's default hook to read).

``CollectiveLog`` records every c10d collective the code starts, with what this rank sends.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from launch.errors import ConfigError


@dataclass
class Collective:
    """One collective as this rank starts it: `kind` (all_gather, reduce_scatter, all_reduce,
    all_to_all, broadcast), its group's size, the buffer's bytes (an all-gather's input chunk,
    the others' input) and what this rank puts on the wire (ring algorithms: an all-gather sends
    n − 1 chunks, a reduce-scatter (n−1)/n and an all-reduce 2(n−1)/n of the buffer; an all_to_all
    what goes to the others; a broadcast the buffer, unless this rank is the root's predecessor)."""

    kind: str
    group_size: int
    nbytes: int
    sent: int
    phase: str
    ranks: tuple[int, ...] = ()  # the group's global ranks (which links it crosses)


# (namespace, op) -> (kind, position of the tensors it sends, of its group, of the split sizes or root)
OPS: dict[tuple[str, str], tuple[str, int, int, int | None]] = {
    ("c10d", "_allgather_base_"): ("all_gather", 1, 2, None),
    ("c10d", "allgather_into_tensor_coalesced_"): ("all_gather", 1, 2, None),
    ("c10d", "allgather_"): ("all_gather", 1, 2, None),
    ("c10d", "_reduce_scatter_base_"): ("reduce_scatter", 1, 2, None),
    ("c10d", "reduce_scatter_tensor_coalesced_"): ("reduce_scatter", 1, 2, None),
    ("c10d", "allreduce_"): ("all_reduce", 0, 1, None),
    ("c10d", "allreduce_coalesced_"): ("all_reduce", 0, 1, None),
    ("c10d", "alltoall_base_"): ("all_to_all", 1, 2, 4),
    ("c10d", "broadcast_"): ("broadcast", 0, 1, 2),
    ("_c10d_functional", "all_gather_into_tensor"): ("all_gather", 0, 2, None),
    ("_c10d_functional", "all_gather_into_tensor_out"): ("all_gather", 0, 2, None),
    ("_c10d_functional", "all_gather_into_tensor_coalesced"): ("all_gather", 0, 2, None),
    ("_c10d_functional", "reduce_scatter_tensor"): ("reduce_scatter", 0, 3, None),
    ("_c10d_functional", "reduce_scatter_tensor_coalesced"): ("reduce_scatter", 0, 3, None),
    ("_c10d_functional", "all_reduce"): ("all_reduce", 0, 2, None),
    ("_c10d_functional", "all_reduce_"): ("all_reduce", 0, 2, None),
    ("_c10d_functional", "all_reduce_coalesced"): ("all_reduce", 0, 2, None),
    ("_c10d_functional", "all_reduce_coalesced_"): ("all_reduce", 0, 2, None),
    ("_c10d_functional", "all_to_all_single"): ("all_to_all", 0, 3, 2),
    ("_c10d_functional", "broadcast"): ("broadcast", 0, 2, 1),
    ("_c10d_functional", "broadcast_"): ("broadcast", 0, 2, 1),
}


def _nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(tensors) if isinstance(t, torch.Tensor))


def _group(arg: Any) -> dist.ProcessGroup:
    """A c10d op's group argument (a boxed ProcessGroup, or a functional collective's name)."""
    if isinstance(arg, torch.ScriptObject):
        return dist.ProcessGroup.unbox(arg)
    return dist.distributed_c10d._resolve_process_group(arg)


def _sent(kind: str, size: int, n: int, rank: int, extra: Any) -> int:
    """Bytes `rank` of `n` sends in a `kind` collective of `size` buffer bytes (see Collective)."""
    if kind == "all_gather":
        return (n - 1) * size
    if kind == "reduce_scatter":
        return (n - 1) * size // n
    if kind == "all_reduce":
        return 2 * (n - 1) * size // n
    if kind == "all_to_all":
        splits = list(extra)
        if not splits:
            return (n - 1) * size // n
        return (sum(splits) - splits[rank]) * (size // max(1, sum(splits)))
    return 0 if rank == (extra - 1) % n else size  # broadcast from group rank `extra`


class CollectiveLog(TorchDispatchMode):
    """Every collective dispatched while active (see OPS), tagged with `phase` (set by the caller)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Collective] = []
        self.phase = ""
        self._ranks: dict[dist.ProcessGroup, tuple[int, ...]] = {}

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # off while torch.compile traces; on for what its graphs run

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        spec = OPS.get((func.namespace, func._schema.name.split("::")[-1]))
        if spec is not None:
            kind, tensors, group_at, extra_at = spec
            group = _group(args[group_at])
            size = _nbytes(args[tensors])
            extra = args[extra_at] if extra_at is not None else None
            if group not in self._ranks:
                self._ranks[group] = tuple(dist.get_process_group_ranks(group))
            sent = _sent(kind, size, group.size(), group.rank(), extra)
            self.calls.append(Collective(kind, group.size(), size, sent, self.phase, self._ranks[group]))
        return func(*args, **(kwargs or {}))

    def sent(self, phase: str, kinds: tuple[str, ...] | None = None) -> int:
        """Bytes this rank sent in `phase` (in collectives of `kinds`, or all)."""
        return sum(c.sent for c in self.calls if c.phase == phase and (kinds is None or c.kind in kinds))


class _RealMetaFactories(TorchDispatchMode):
    """Tensor factories on the meta device (no tensor arguments) make real meta tensors."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "meta":
            if not any(isinstance(t, torch.Tensor) for t in tree_leaves((args, kwargs))):
                with unset_fake_temporarily():
                    return func(*args, **kwargs)
        return func(*args, **kwargs)


def _outside_fake_mode(fn: Any) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with unset_fake_temporarily():
            return fn(*args, **kwargs)

    return wrapped


@dataclass
class _Patches:
    """Attributes replaced for the fake world and put back after it."""

    saved: list[tuple[Any, str, Any]] = field(default_factory=list)

    def set(self, owner: Any, name: str, value: Any) -> None:
        self.saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def restore(self) -> None:
        for owner, name, value in reversed(self.saved):
            setattr(owner, name, value)


def check_world(world: int, rank: int = 0, gpus_per_node: int = 8, replicate: int = 1, flag: str = "--world") -> None:
    """A one-line ConfigError, naming the dry run's flag and what it allows, for a world that cannot
    be: `world` ranks (`flag`: the option that gave it), `gpus_per_node` of them per node, `replicate`
    HSDP replica groups, `rank` the one set up."""
    if world < 1:
        raise ConfigError(f"{flag} must be >= 1 (the run's ranks, GPUs), got {world}")
    if gpus_per_node < 1:
        raise ConfigError(
            f"--gpus-per-node must be >= 1 (ranks per node: torchrun's LOCAL_WORLD_SIZE), got {gpus_per_node}"
        )
    if replicate < 1:
        raise ConfigError(f"--replicate must be >= 1 (HSDP replica groups; 1: plain FSDP2), got {replicate}")
    if world % replicate:
        raise ConfigError(f"--replicate {replicate} must divide --world {world}")
    if not 0 <= rank < world:
        raise ConfigError(f"--rank must be in 0..{world - 1}, got {rank}")


@contextmanager
def fake_world(world: int, rank: int, gpus_per_node: int = 8) -> Iterator[CollectiveLog]:
    """This process as rank `rank` of `world` (`gpus_per_node` ranks per node, as torchrun's
    LOCAL_WORLD_SIZE tells the code), tensors fake; yields the collective log. Refuses a world that
    cannot be (`check_world`), and to start inside a process that already has a process group."""
    check_world(world, rank, gpus_per_node)
    import torch.distributed.device_mesh as device_mesh
    import torch.distributed.fsdp._fully_shard._fsdp_init as fsdp_init
    import torch.nn.parallel.distributed as ddp
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("the dry run needs a process without a process group")
    local = min(gpus_per_node, world)
    env = {
        "WORLD_SIZE": str(world),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % local),
        "LOCAL_WORLD_SIZE": str(local),
    }
    old_env = {k: os.environ.get(k) for k in env}
    patches = _Patches()
    patches.set(sys, "excepthook", sys.excepthook)  # init_process_group wraps it ("[rank0]: ..."), per world
    os.environ.update(env)
    try:
        mesh = _outside_fake_mode(device_mesh.init_device_mesh)
        patches.set(device_mesh, "init_device_mesh", mesh)
        patches.set(fsdp_init, "init_device_mesh", mesh)  # FSDP2's default 1-D mesh
        patches.set(ddp, "_verify_param_shape_across_processes", lambda *args, **kwargs: None)
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
        with ExitStack() as stack:
            stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
            stack.enter_context(_RealMetaFactories())
            yield stack.enter_context(CollectiveLog())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        # DTensor caches sharding decisions by mesh, and a mesh compares equal to the next world's
        # of the same shape: its cached specs would name this world's (destroyed) groups.
        _clear_sharding_prop_cache()
        patches.restore()
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def is_fake_world() -> bool:
    """Whether the default process group is the fake one."""
    return dist.is_initialized() and dist.get_backend() == "fake"


def fake_allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default gradient hook (average: divide, all-reduce) with a result the fake group's Work
    cannot give: the same all-reduce of the same bucket is started, the future is already done."""
    buffer = bucket.buffer().div_(dist.get_world_size())
    dist.all_reduce(buffer)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future


# DDP checks a hook's annotations against the objects (this module's are strings: `annotations`)
fake_allreduce_hook.__annotations__.update({"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]})
