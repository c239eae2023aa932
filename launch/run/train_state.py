"""The trainer's own checkpoint part: step, tokens seen and the RNG states of every rank."""

from __future__ import annotations

from typing import Any

import torch


class TrainState:
    """Where the run is (`step`, `tokens`) and each rank's CPU and CUDA RNG states.

    Training draws no random numbers today (no dropout), but anything that does (a shuffle, a
    future dropout) then resumes exactly: each rank restores its own generators when the world
    size is unchanged; on a new world size the ranks keep the generators they were seeded with.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.step, self.tokens = 0, 0

    def state_dict(self) -> dict[str, Any]:
        rng = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            rng["cuda"] = torch.cuda.get_rng_state()
        return {"step": self.step, "tokens": self.tokens, "rng": rng}

    def load_rank_states(self, states: list[dict[str, Any]]) -> None:
        self.step, self.tokens = int(states[0]["step"]), int(states[0]["tokens"])
        if len(states) != self.world_size:
            return
        rng = states[self.rank]["rng"]
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
