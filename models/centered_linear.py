"""M2 of Conditioned Backpropagation (docs/cbp.md): a linear layer with a centred input.

    y = W·(x − μ) + b̃                                                     (eq. 8)

μ is an EMA of the layer's input mean (a persistent buffer, starting at 0 so a fresh layer equals
``nn.Linear``); b̃ is the layer's ``bias`` parameter. Autograd then gives the centred weight gradient
δ·(x − μ)ᵀ of eq. (9): the rank-one mean term leaves the curvature the update sees.

Mean updates follow Algorithm 1 (lines 10–11): a training-mode forward with grad enabled (so
no_grad evaluation never counts) only *records* the batch mean of its input (summed over calls, so
gradient-accumulation micro-batches count by rows); after
``optimizer.step()`` the caller runs ``update_mean()`` (or ``update_means(model)``), which sets
μ_new = ρ·μ + (1−ρ)·x̄ and transports the bias with the *updated* W,

    b̃ ← b̃ + W·(μ_new − μ_old)                                             (eq. 10)

so W(x − μ_new) + b̃_new = W(x − μ_old) + b̃_old for every x: the represented function is unchanged,
M2 stays an exact reparameterisation along the whole trajectory. Under data parallelism, average
the recorded batch mean across ranks first (``average_mean_``) so every rank keeps the same μ, b̃.
``fold()`` returns the equivalent plain ``nn.Linear`` (weight W, bias b̃ − W·μ) for export.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F


class CenteredLinear(nn.Module):
    """``nn.Linear`` with its input centred by an EMA mean and the bias transport of eq. (10).

    ``rho`` is the EMA decay of the mean (the paper uses ρ = 0.99, the same decay as M1). A bias is
    required: it is what absorbs the transport. Weight/bias init matches ``nn.Linear``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rho: float = 0.99,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.mu: Tensor  # buffers, declared for the type checker (nn.Module's attribute lookup is untyped)
        self._sum: Tensor
        self._rows: Tensor
        if not 0 <= rho < 1:
            raise ValueError(f"rho must be in [0, 1), got {rho}")
        ref = nn.Linear(in_features, out_features, bias=True, device=device, dtype=dtype)
        self.in_features, self.out_features, self.rho = in_features, out_features, rho
        self.weight = ref.weight
        self.bias = ref.bias
        self.register_buffer("mu", torch.zeros(in_features, device=device, dtype=torch.float32))
        # The recorded input sum/rows of this step: transient, not part of the state_dict. Both are
        # tensors so a compiled forward neither guards on a Python int (a recompile per
        # micro-batch) nor syncs with the host when the step reads them.
        self.register_buffer("_sum", torch.zeros(in_features, device=device, dtype=torch.float32), persistent=False)
        self.register_buffer("_rows", torch.zeros((), device=device, dtype=torch.int64), persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, rho: float = 0.99) -> CenteredLinear:
        """A centred layer (μ = 0) computing exactly what ``linear`` computes."""
        if linear.bias is None:
            raise ValueError("CenteredLinear needs a bias to absorb the mean transport")
        out = cls(linear.in_features, linear.out_features, rho, device=linear.weight.device, dtype=linear.weight.dtype)
        with torch.no_grad():
            out.weight.copy_(linear.weight)
            out.bias.copy_(linear.bias)
        return out

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x - self.mu.to(x.dtype), self.weight, self.bias)
        if self.training and torch.is_grad_enabled():
            with torch.no_grad():  # record only; μ moves in update_mean(), after the step
                self._sum.add_(x.detach().reshape(-1, self.in_features).sum(0, dtype=torch.float32))
                self._rows.add_(x.numel() // self.in_features)
        return y

    def average_mean_(self, fn: Callable[[Tensor], Tensor | None]) -> None:
        """Average the recorded batch mean across ranks before ``update_mean``.

        ``fn`` receives the local batch mean [in_features] (fp32) and either averages it in place
        (e.g. ``lambda t: dist.all_reduce(t, op=dist.ReduceOp.AVG)``) or returns the average.
        Ranks with equal row counts then hold the global mean; no distributed import here.
        """
        mean = self._sum / self._rows.clamp_min(1)
        out = fn(mean)
        mean = mean if out is None or not isinstance(out, Tensor) else out
        self._sum.copy_(mean)
        self._rows.clamp_(max=1)  # the sum is now a mean; 0 rows (nothing recorded) stays 0

    @torch.no_grad()
    def update_mean(self, local: Callable[[Tensor], Tensor] | None = None) -> None:
        """μ ← ρμ + (1−ρ)·x̄ and the bias transport b̃ ← b̃ + W(μ_new − μ_old); a no-op if no
        training forward was recorded since the last call. Call after ``optimizer.step()``.

        ``local`` maps a parameter to the part of it this process holds (e.g. a row shard); the
        transport is row-wise, so a shard of W's rows updates the same rows of b̃."""
        local = local or (lambda t: t)
        recorded = self._rows > 0  # a tensor test, not a host sync: μ stays put where nothing was seen
        batch_mean = self._sum / self._rows.clamp_min(1)
        new = torch.where(recorded, self.mu * self.rho + batch_mean * (1.0 - self.rho), self.mu)
        delta = new - self.mu
        weight, bias = local(self.weight), local(self.bias)
        bias.add_((weight.float() @ delta).to(bias.dtype))
        self.mu.copy_(new)
        self._sum.zero_()
        self._rows.zero_()

    def fold(self) -> nn.Linear:
        """The equivalent plain ``nn.Linear``: weight W, bias b̃ − W·μ."""
        out = nn.Linear(
            self.in_features, self.out_features, bias=True, device=self.weight.device, dtype=self.weight.dtype
        )
        with torch.no_grad():
            out.weight.copy_(self.weight)
            out.bias.copy_((self.bias.float() - self.weight.float() @ self.mu).to(out.bias.dtype))
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rho={self.rho}"


def update_means(
    model: nn.Module,
    average: Callable[[Tensor], Tensor | None] | None = None,
    local: Callable[[Tensor], Tensor] | None = None,
) -> None:
    """Run ``update_mean(local)`` (after ``average_mean_(average)`` if given) on every CenteredLinear."""
    for mod in model.modules():
        if isinstance(mod, CenteredLinear):
            if average is not None:
                mod.average_mean_(average)
            mod.update_mean(local)


def fold_centered(model: nn.Module) -> nn.Module:
    """Replace every CenteredLinear in ``model`` (in place) by its folded ``nn.Linear``."""
    for name, child in list(model.named_children()):
        if isinstance(child, CenteredLinear):
            setattr(model, name, child.fold())
        else:
            fold_centered(child)
    return model
