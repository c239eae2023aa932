"""Parallelism applied from outside the model (torchtitan's way), so the model code never knows: FSDP2 (or
HSDP) or DDP, activation checkpointing and torch.compile (per block plus the head and loss, or the whole model)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from launch.environment import EnvFacts
from launch.parallel_config import ParallelConfig
from launch.runtime.process_group import DistEnv
from models import GPT, GPTConfig

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

    from launch.backends.base import Backend
    from launch.backends.torch_native import FSDPOptions


def build_model(
    model_cfg: GPTConfig,
    parallel: ParallelConfig,
    seed: int,
    env: DistEnv,
    dtype: torch.dtype = torch.float32,
    *,
    backend: Backend,
    compile_backend: str = "inductor",
) -> GPT:
    """Construct, shard (as `backend` does: FSDP2) and initialise the GPT, equal to a single-process run's
    at any world size (docs/determinism.md). FSDP2 with `parallel.fsdp.meta_init` builds on the meta device and
    fills each rank's shard after `fully_shard` (`init_sharded`), so a 1.1B model is never whole on one rank.
    `compile_backend`: torch.compile's backend for `parallel.compile` (tests pass `aot_eager`, which traces
    the same graphs without generating kernels)."""
    torch.manual_seed(seed)
    meta_init = backend.meta_init(parallel)
    with torch.device("meta" if meta_init else env.device):
        model = GPT(model_cfg) if meta_init else GPT(model_cfg, seed=seed)
    _apply(model, parallel, env, dtype, compile_backend, backend)
    if meta_init:
        model.to_empty(device=env.device)
        init_sharded(model, seed)
    return model


@torch.no_grad()
def init_sharded(model: GPT, seed: int) -> None:
    """`GPT.init_weights` for a model whose parameters may be DTensor shards: each rank draws one
    whole tensor at a time (never the whole model) and keeps its own shard of it."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    from orscale.routing import canonical_name

    for name, p in model.named_parameters():
        value = model.init_value(canonical_name(name), seed, tuple(p.shape))
        if isinstance(p, DTensor):  # src_data_rank=None: each rank cuts its shard of its own copy
            value = distribute_tensor(value, p.device_mesh, p.placements, src_data_rank=None).to_local()
            p.to_local().copy_(value)
        else:
            p.copy_(value)
    model.init_buffers()


def _apply(
    model: GPT, parallel: ParallelConfig, env: DistEnv, dtype: torch.dtype, compile_backend: str, backend: Backend
) -> None:
    if parallel.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for i, block in enumerate(model.blocks):
            model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False)
    compile_mode = parallel.compile
    if compile_mode == "auto":  # a ParallelConfig built directly: load_config resolves it for runs
        compile_mode = "blocks" if env.device.type == "cuda" else "none"
    if compile_mode == "blocks":
        for block in model.blocks:
            _compile_forward(block, compile_backend)
        # The head and the loss too: eager, its chunk loop is ~14 passes over each chunk of logits.
        _compile_method(model, "head_loss", compile_backend)
    backend.shard(model, parallel, env, dtype)
    if compile_mode == "model":
        _compile_forward(model, compile_backend)


def shard_fsdp(model: GPT, parallel: ParallelConfig, fsdp: FSDPOptions, env: DistEnv, dtype: torch.dtype) -> None:
    """FSDP2 (`fully_shard`) on each block, then on the whole model (the embedding, the head): on the
    1-D world or HSDP's 2-D mesh (`data_parallel_mesh`), in `parallel.fsdp.param_dtype`."""
    from torch.distributed.fsdp import fully_shard

    mp = fsdp_mixed_precision(fsdp.param_dtype, dtype, env.device)
    local = env.local_world_size or env.world_size
    reshard = reshard_after_forward(fsdp.reshard_after_forward, parallel.dp_shard, env.world_size, local)
    mesh = data_parallel_mesh(parallel, env)
    for block in model.blocks:
        # `true`: the last block's params are needed right away in backward: don't reshard them.
        last = block is model.blocks[-1]
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard and not last)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)


def _compile_forward(module: nn.Module, backend: str) -> None:
    """torch.compile `module.forward` in place. The forward, not `module.compile()` (which compiles
    `_call_impl`): FSDP2's hooks then run outside the graph, the parameter names stay, and the
    compiled code is `Block.forward`'s (or `GPT.forward`'s) own, so its recompile limit is not
    shared with every other compiled module. dynamic=False: evaluation's batch shapes get graphs of
    their own instead of turning the training graph into a dynamic-shape one."""
    _compile_method(module, "forward", backend)


def _compile_method(module: nn.Module, name: str, backend: str) -> None:
    """torch.compile the bound method `module.<name>` in place (see `_compile_forward`)."""
    setattr(module, name, torch.compile(getattr(module, name), backend=backend, dynamic=False))


def reshard_after_forward(
    setting: str | bool, shard_size: int | None = None, world: int | None = None, local_world: int | None = None
) -> bool:
    """`parallel.fsdp.reshard_after_forward` (auto | true | false) as FSDP2's flag. auto: keep the
    gathered params until backward (no second all-gather) when the shard group is one node, where
    memory is the cheaper resource; reshard when it spans nodes, where the all-gather is the costly
    one and memory per GPU is what limits the model. `shard_size`: ranks a parameter is sharded over
    (HSDP's parallel.dp_shard; default the world); one node holds `local_world` of the `world` ranks
    (default: this launch's, `EnvFacts.from_env`)."""
    if setting != "auto":
        return setting in ("true", True)  # ParallelConfig turns YAML booleans into "true"/"false"
    if world is None or local_world is None:
        facts = EnvFacts.from_env()
        world, local_world = facts.world_size, facts.local_world_size
    return local_world < (shard_size or world)


def data_parallel_mesh(parallel: ParallelConfig, env: DistEnv) -> DeviceMesh:
    """FSDP2's mesh, on the run's device type (`train.device`, not the machine's accelerator: a CPU
    run on a GPU node keeps a CPU mesh under its gloo group): HSDP's 2-D mesh ("replicate", "shard")
    of parallel.dp_replicate × dp_shard ranks (ParallelConfig checked that they multiply to the
    world size), else the 1-D world, the mesh FSDP2 would make itself (the default group, no dim name)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if parallel.dp_replicate == 1:
        return init_device_mesh(env.device.type, (dist.get_world_size(),))
    shape = (parallel.dp_replicate, parallel.dp_shard)
    return init_device_mesh(env.device.type, shape, mesh_dim_names=("replicate", "shard"))


def fsdp_mixed_precision(param_dtype: str, dtype: torch.dtype, device: torch.device) -> MixedPrecisionPolicy:
    """FSDP2's policy for `parallel.fsdp.param_dtype`: bf16 params in forward/backward with fp32 gradient
    reduction (the fp32 sharded params stay the master weights), or fp32 throughout. auto: bf16
    when the run computes in bf16 (`dtype`) on CUDA; CPU runs keep fp32 unless asked (gloo's CPU
    collectives are the test path)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    bf16 = param_dtype == "bf16" or (param_dtype == "auto" and dtype == torch.bfloat16 and device.type == "cuda")
    # cast_forward_inputs=False: the default would cast every floating argument of each block, the
    # fp32 RoPE tables included, to bf16; one process keeps them fp32 (the residual stream arrives
    # in bf16 anyway, from the bf16 embedding), so the rotation is computed alike on every backend.
    if bf16:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
    return MixedPrecisionPolicy()


def wrap_ddp(model: GPT, env: DistEnv) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    # No buffer broadcast: buffers are equal on every rank by construction (RoPE tables, centred
    # means averaged after each step), and a centred layer's per-rank input sum must stay per rank.
    # torch 2.13 deprecates `broadcast_buffers` for `forward_sync_buffers`, which still syncs at init;
    # its own warning says to keep `broadcast_buffers=False` for rank-local buffers until an
    # `init_sync_buffers` exists, so that is kept and its warning (once per rank) is silenced here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)
        return DDP(
            model,
            device_ids=[env.device.index] if env.device.type == "cuda" else None,
            broadcast_buffers=False,
            # Each gradient is a view into DDP's all-reduce bucket, not a tensor of its own that the
            # bucket copies: one full gradient less (4 bytes per parameter in fp32).
            gradient_as_bucket_view=True,
        )


def drops_gradients(module: nn.Module) -> bool:
    """`zero_grad(set_to_none=...)` for the optimizers of `module`: True (free the gradients) except
    under DDP, whose gradients are views into its buckets (`wrap_ddp`). There they are zeroed in
    place and kept: dropped, the next backward would make fresh gradients beside the buckets (a
    second full gradient while micro-batches accumulate under no_sync) and copy them in at the
    last one. Every parameter has a gradient at every DDP step (DDP requires it), so zeros and
    None mean the same to the optimizers."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return not isinstance(module, DDP)


def no_sync(module: nn.Module, last_micro_batch: bool) -> AbstractContextManager:
    """Skip gradient communication on all but the last micro-batch of an accumulation."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel as DDP

    if last_micro_batch:
        return contextlib.nullcontext()
    if isinstance(module, DDP):
        return module.no_sync()
    if isinstance(module, FSDPModule):
        return _fsdp_no_sync(module)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(module: FSDPModule) -> Iterator[None]:
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)
