"""What a run learns from its environment, read in this one place: the launched world (torchrun's
WORLD_SIZE, LOCAL_WORLD_SIZE, RANK, LOCAL_RANK; a plain `python train.py` is rank 0 of 1) and the
device the run trains on. `launch.plan.resolve` turns a config and these facts into the run's plan
(and the config that config.yaml records); no config class reads the environment itself."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launch.train_config import TrainConfig


@dataclass(frozen=True)
class EnvFacts:
    """The facts of one process's launch. `cuda` and `device_name` are the device's: whether the run
    trains on CUDA (train.device cuda, or auto with a CUDA device visible) and the CUDA board's name
    where the config needs it (train.attention auto); both stay unset unless asked for
    (`from_env(train)`), since reading a board's name starts CUDA in this process."""

    world_size: int = 1
    local_world_size: int = 1  # ranks on this node
    rank: int = 0
    local_rank: int = 0
    cuda: bool = False
    device_name: str | None = None
    accelerate: str | None = None  # the backend kind `accelerate launch` announced (ACCELERATE_USE_<kind>)

    @classmethod
    def from_env(cls, train: TrainConfig | None = None) -> EnvFacts:
        """This process's facts; the device's only for a `train:` section given (its device and attention)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
        announced = [k for k in ACCELERATE if os.environ.get(f"ACCELERATE_USE_{k}", "").lower() == "true"]
        accelerate = announced[0] if announced else None
        if train is None:
            return cls(world, local, rank, local_rank, accelerate=accelerate)
        cuda = train.device == "cuda" or (train.device == "auto" and _cuda_available())
        name = _cuda_device_name() if cuda and train.attention == "auto" else None
        return cls(world, local, rank, local_rank, cuda, name, accelerate)


# The backend kinds `accelerate launch` announces with our shipped configs (configs/accelerate/).
ACCELERATE = {"FSDP": "an FSDP config", "DEEPSPEED": "a DeepSpeed config"}


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _cuda_device_name() -> str | None:
    import torch

    try:
        return torch.cuda.get_device_name()
    except (AssertionError, RuntimeError):  # no CUDA device after all: train.device=cuda is refused later
        return None
