"""CBP's M2 step, `Centring`: the centred layers' input means and biases moved after every optimizer
step (docs/cbp.md, "M2")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


class Centring:
    """M2's step, run after every optimizer step (docs/cbp.md): on every layer with a centred input
    (one with `update_mean`, models/centered_linear.py's CenteredLinear; found by that method, as
    orscale imports no model), the recorded input mean averaged over the ranks (`average`, None on
    one rank), the EMA mean moved and the bias transported on the rows `local` gives of a parameter."""

    def __init__(
        self,
        layers: list[tuple[str, Any]],
        average: Callable[[Tensor], Tensor | None] | None,
        local: Callable[[Tensor], Tensor],
    ) -> None:
        self.layers, self.average, self.local = layers, average, local

    @classmethod
    def of(
        cls,
        model: torch.nn.Module,
        average: Callable[[Tensor], Tensor | None] | None,
        local: Callable[[Tensor], Tensor],
    ) -> Centring | None:
        """The centring step of `model`; None for a model without a centred layer."""
        layers = [(name, mod) for name, mod in model.named_modules() if callable(getattr(mod, "update_mean", None))]
        return cls(layers, average, local) if layers else None

    @property
    def biases(self) -> set[str]:
        """The parameters the step changes outside the optimizer: each centred layer's bias."""
        return {f"{name}.bias" for name, _ in self.layers}

    def after_step(self) -> None:
        for _, layer in self.layers:
            if self.average is not None:
                layer.average_mean_(self.average)
            layer.update_mean(self.local)
