"""The `optim:` section of a run config: the keys every optimizer shares, checked on construction, and
the sections of the optimizer families and schedules (`optim.<section>`, each the options dataclass
its component owns: docs/running.md, "The config")."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from orscale.errors import require_all


class Section(Protocol):
    """An options class of a component's own sub-section, named by `section`."""

    section: ClassVar[str]


T = TypeVar("T", bound=Section)


@dataclass
class OptimConfig:
    """`name` is a name of the optimizer table (``orscale.registry``), `schedule` one of its schedules;
    the AdamW group (token embedding = tied head, norm gains; every parameter outside the blocks' 2-D
    weights) has its own peak LR and decay in every family. `sections`: the families' and schedules'
    own options by section name (`optim.muon`, `optim.wsd`, ...), read by launch/config.py; a
    section left out is its defaults (`own`)."""

    name: str = field(default="adamw", metadata={"resume": "fixed"})
    lr: float = 1e-3  # the peak LR of the hidden matrices (every parameter's unless adamw_lr is set)
    weight_decay: float = 0.1
    # The AdamW group's peak LR and decay (null: optim.lr / weight_decay, the tied protocol); for adamw
    # itself and the elementwise families those parameters get param groups of their own.
    adamw_lr: float | None = None
    adamw_weight_decay: float | None = None
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # AdamW's
    eps: float = 1e-8  # AdamW's
    exempt_norms_and_embeddings: bool = False  # no decay on norm gains / embeddings
    # AdamW's implementation: auto (fused on CUDA, foreach elsewhere) | fused | foreach
    fused: str = field(default="auto", metadata={"resume": "routine"})
    grad_clip: float = 1.0  # global grad-norm clip; 0 disables
    # The LR schedule (a name of orscale.registry.SCHEDULES): warmup_steps of linear warmup, then the
    # schedule's shape down to min_lr_ratio of the peak.
    schedule: str = "cosine"
    warmup_steps: int = 1000
    min_lr_ratio: float = 0.0
    sections: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        require_all(self._checks())

    def own(self, options: type[T]) -> T:
        """Section `options` (an options class with its `section` name) of this config: its defaults
        when the config has none."""
        found = self.sections.get(options.section)
        return found if isinstance(found, options) else options()

    def with_options(self, *options: Any) -> OptimConfig:
        """This config with `options` (options instances) as their sections."""
        return dataclasses.replace(self, sections={**self.sections, **{o.section: o for o in options}})

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

    def _checks(self) -> list[tuple[bool, str]]:
        return [
            (finite_number(self.lr) and self.lr > 0, f"optim.lr must be a finite number > 0, got {self.lr!r}"),
            (
                self.adamw_lr is None or (finite_number(self.adamw_lr) and self.adamw_lr > 0),
                f"optim.adamw_lr must be a finite number > 0 or null (= optim.lr), got {self.adamw_lr!r}",
            ),
            (
                self.adamw_weight_decay is None
                or (finite_number(self.adamw_weight_decay) and self.adamw_weight_decay >= 0),
                "optim.adamw_weight_decay must be >= 0 or null (= optim.weight_decay), "
                f"got {self.adamw_weight_decay!r}",
            ),
            (
                finite_number(self.weight_decay) and self.weight_decay >= 0,
                f"optim.weight_decay must be >= 0, got {self.weight_decay!r}",
            ),
            (
                len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
                f"optim.betas must be two numbers in [0, 1), got {self.betas}",
            ),
            (0 < self.eps < math.inf, f"optim.eps must be > 0, got {self.eps}"),
            (
                self.fused in ("auto", "fused", "foreach"),
                f"optim.fused must be auto, fused or foreach, got {self.fused!r}",
            ),
            (0 <= self.grad_clip < math.inf, f"optim.grad_clip must be >= 0 (0 disables), got {self.grad_clip}"),
            (self.warmup_steps >= 0, f"optim.warmup_steps must be >= 0, got {self.warmup_steps}"),
            (0 <= self.min_lr_ratio <= 1, f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}"),
        ]


def finite_number(value: Any) -> bool:
    """A real number (not a bool), neither NaN nor infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
