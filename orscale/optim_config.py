"""The `optim:` section of a run config, checked where it is defined (on construction)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from orscale.errors import OptimConfigError
from orscale.newton_schulz import NS_COEFFICIENT_SETS, NS_KERNELS


@dataclass
class OptimConfig:
    """The `optim:` section of a run config: which optimizer (`name`, a name of the optimizer table
    ``orscale.registry``), its hyper-parameters and the LR schedule (a name of
    ``orscale.schedule.SCHEDULES``); checked on construction (OptimConfigError): the shared keys here,
    each optimizer's and schedule's own keys by its table entry. The trainer builds its optimizers
    from it (``build_optimizers``); its keys are the fields below (flat, as the YAML writes them)."""

    name: str = "adamw"
    lr: float = 1e-3  # the peak LR of the hidden matrices (every parameter's unless adamw_lr is set)
    weight_decay: float = 0.1
    # The AdamW group (token embedding = tied head, norm gains; every parameter outside the blocks'
    # 2-D weights): its own peak LR and weight decay, in every optimizer family (for adamw itself and
    # CBP/LAMB/LARS, those same parameters get their own param groups). null: optim.lr / weight_decay,
    # today's tied protocol bit for bit. One schedule shape, scaled per group.
    adamw_lr: float | None = None
    adamw_weight_decay: float | None = None
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    exempt_norms_and_embeddings: bool = False  # AdamW: no decay on norm gains / embeddings
    fused: str = "auto"  # AdamW's implementation: auto (fused on CUDA, foreach elsewhere) | fused | foreach
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_coefficients: str = "polar_express"  # polar_express | jordan
    ns_dtype: str = "auto"  # auto (bf16 on CUDA, fp32 elsewhere) | bf16 | fp32 (fp32 for exact equality tests)
    r_min: float = 0.1
    r_max: float = 5.0
    trust_eps: float = 1e-6
    grad_clip: float = 1.0  # global grad-norm clip; 0 disables
    diagnostics: bool = True  # Muon family: per-matrix trust-ratio diagnostics (diag/ in metrics)
    # Muon family: its elementwise passes around Newton–Schulz compiled into fused kernels (null: on
    # CUDA) or run eager, op by op (orscale/muon_passes.py)
    compile_passes: bool | None = None
    # Newton–Schulz's X Xᵀ and b·A + c·A²: auto (symmetric Triton kernels for bf16 on CUDA, half their
    # FLOPs; torch's where they do not apply) | torch (cuBLAS, the reference)
    ns_kernel: str = "auto"
    warmup_steps: int = 1000
    min_lr_ratio: float = 0.0  # the schedule's floor as a fraction of the peak LR
    # cosine: warmup, then cosine to the floor at the last step. wsd: warmup, the peak, then a cooldown
    # over the last decay_steps (or decay_fraction of the run; default 0.2) of decay_shape (linear |
    # 1-sqrt | cosine; default 1-sqrt, Hägele et al. 2024) to the floor (orscale.schedule).
    schedule: str = "cosine"
    decay_fraction: float | None = None
    decay_steps: int | None = None
    decay_shape: str | None = None
    # CBP (optim.name=cbp; docs/cbp.md; checked by orscale/cbp_spec.py). Its paper uses betas
    # (0.9, 0.999): set optim.betas.
    cbp_zeta: float = 1e-3  # M3 damping ζ added to √v̂
    cbp_rho: float = 0.99  # M1 energy EMA ρ
    cbp_s_min: float = 0.1  # M1 clip of the block scale
    cbp_s_max: float = 4.0
    cbp_equalize: bool = True  # M1 on/off (the paper's ablations)
    cbp_precondition: bool = True  # M3 on/off
    lars_trust_coefficient: float = 1e-3  # η_tr of LARS (checked by orscale/trust_ratio.py)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def own_adamw_group(self) -> bool:
        """Whether the AdamW group's LR or decay is set apart from the matrices' (then adamw and
        CBP/LAMB/LARS route those parameters into groups of their own)."""
        return self.adamw_lr is not None or self.adamw_weight_decay is not None

    @property
    def adamw_lr_scale(self) -> float:
        """The AdamW group's peak LR over optim.lr (exactly 1.0 when unset: lr * 1.0 == lr)."""
        return 1.0 if self.adamw_lr is None else self.adamw_lr / self.lr

    @property
    def adamw_decay(self) -> float:
        return self.weight_decay if self.adamw_weight_decay is None else self.adamw_weight_decay

    def validate(self) -> None:
        """Raise OptimConfigError (one line) for a value no optimizer can run with."""
        # The tables import the optimizers and schedules, whose modules import this one.
        from orscale.registry import OPTIMIZER_NAMES, optimizer_checks
        from orscale.schedule import schedule_checks

        known = (
            self.name in OPTIMIZER_NAMES,
            f"optim.name {self.name!r} is not a known optimizer; valid: {', '.join(OPTIMIZER_NAMES)}",
        )
        checks = [known, *self._shared_checks(), *schedule_checks(self), *self._last_checks(), *optimizer_checks(self)]
        for ok, message in checks:
            if not ok:
                raise OptimConfigError(message)

    def _shared_checks(self) -> list[tuple[bool, str]]:
        return [
            (
                self.ns_coefficients in NS_COEFFICIENT_SETS,
                f"optim.ns_coefficients must be one of {', '.join(NS_COEFFICIENT_SETS)}, got {self.ns_coefficients!r}",
            ),
            (
                self.ns_kernel in NS_KERNELS,
                f"optim.ns_kernel must be one of {', '.join(NS_KERNELS)}, got {self.ns_kernel!r}",
            ),
            (math.isfinite(self.lr) and self.lr > 0, f"optim.lr must be a finite number > 0, got {self.lr}"),
            (
                self.adamw_lr is None or (math.isfinite(self.adamw_lr) and self.adamw_lr > 0),
                f"optim.adamw_lr must be a finite number > 0 or null (= optim.lr), got {self.adamw_lr}",
            ),
            (
                self.adamw_weight_decay is None
                or (math.isfinite(self.adamw_weight_decay) and self.adamw_weight_decay >= 0),
                f"optim.adamw_weight_decay must be >= 0 or null (= optim.weight_decay), got {self.adamw_weight_decay}",
            ),
            (
                math.isfinite(self.weight_decay) and self.weight_decay >= 0,
                f"optim.weight_decay must be >= 0, got {self.weight_decay}",
            ),
            (
                len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
                f"optim.betas must be two numbers in [0, 1), got {self.betas}",
            ),
            (0 <= self.momentum < 1, f"optim.momentum must be in [0, 1), got {self.momentum}"),
            (
                0 < self.r_min <= self.r_max < math.inf,
                f"optim.r_min ({self.r_min}) must be > 0 and <= optim.r_max ({self.r_max})",
            ),
            (
                self.ns_dtype in ("auto", "bf16", "fp32"),
                f"optim.ns_dtype must be auto, bf16 or fp32, got {self.ns_dtype!r}",
            ),
            (
                self.fused in ("auto", "fused", "foreach"),
                f"optim.fused must be auto, fused or foreach, got {self.fused!r}",
            ),
            (self.ns_steps >= 1, f"optim.ns_steps must be >= 1, got {self.ns_steps}"),
            (0 <= self.grad_clip < math.inf, f"optim.grad_clip must be >= 0 (0 disables), got {self.grad_clip}"),
            (self.warmup_steps >= 0, f"optim.warmup_steps must be >= 0, got {self.warmup_steps}"),
            (0 <= self.min_lr_ratio <= 1, f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}"),
        ]

    def _last_checks(self) -> list[tuple[bool, str]]:
        return [
            (0 < self.trust_eps < math.inf, f"optim.trust_eps must be > 0, got {self.trust_eps}"),
            (0 < self.eps < math.inf, f"optim.eps must be > 0, got {self.eps}"),
        ]
