"""The elementwise optimizers (CBP, LAMB, LARS, Lion ...) over FSDP2 parameters (DTensors sharded on
dim 0 of a 1-D mesh, or of HSDP's 2-D mesh, whose replica groups hold the same shards: the sums run
over the shard group only).

These optimizers are elementwise except for per-tensor norms. So, as with the Muon family, the
arithmetic runs on each DTensor's local shard (`_local`) and the step's one tensor of per-block
sums of squares is summed across ranks by ONE all_reduce (`reduce_block_sums`): every rank then
holds the same norms, scales and trust ratios as a single process. Under DDP the plain classes run
as they are (gradients are already averaged; every rank holds whole tensors).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor


class _DTensorBlocks(torch.optim.Optimizer):
    """Mixin: local shards for the arithmetic, one all-reduce for the per-block sums."""

    _group: dist.ProcessGroup | None = None

    def _local(self, t: Tensor) -> Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    def reduce_block_sums(self, sums: Tensor) -> Tensor:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(self._group) > 1:
            dist.all_reduce(sums, group=self._group)
        return sums

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        for item in param_group["params"] if isinstance(param_group["params"], list) else []:
            p = item[1] if isinstance(item, tuple) else item
            mesh = getattr(p, "device_mesh", None)
            if mesh is not None:
                if mesh.ndim not in (1, 2):
                    raise NotImplementedError(f"{type(self).__name__} supports a 1-D (FSDP2) or 2-D (HSDP) device mesh")
                self._group = mesh.get_group(mesh.ndim - 1)  # the shard dim (FSDP2 puts replicate first)
        super().add_param_group(param_group)


_SHARDED: dict[type[torch.optim.Optimizer], type[torch.optim.Optimizer]] = {}


def sharded_class(cls: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """`cls` over FSDP2 parameters: its subclass with ``_DTensorBlocks``'s local shards and per-block
    all-reduce (``ShardedCBP`` for ``CBP``, ...). The same class for the same `cls`, so that
    ``isinstance`` sees one type per optimizer; it is also a name of this module, so that pickle finds
    it."""
    if cls not in _SHARDED:
        name = f"Sharded{cls.__name__}"
        attrs = {"__module__": __name__, "__qualname__": name, "__doc__": cls.__doc__}
        _SHARDED[cls] = globals()[name] = type(name, (_DTensorBlocks, cls), attrs)
    return _SHARDED[cls]
