"""The one interface of a loop feature: a concern of the training loop (metrics, validation, checkpoints,
the stop signal, ...) in one class, called by `launch.trainer.Trainer` through the hooks below, each a
no-op here. A feature decides itself when it acts (its own policy: `train.eval_every`, `train.ckpt_every`,
...), holds what it builds, and gives it back in `close()`. Within each hook the features run in the
order their declarations give (`after`, `before`; launch/features/registry.py), which is the order of
their effects (log lines, records). Metrics go through `Trainer.record(kind, values)`, one
metrics.jsonl line that says what it is; `Trainer.last(kind)` is the last of each kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor

if TYPE_CHECKING:
    from launch.config import Config
    from launch.trainer import Trainer


class Feature:
    """A loop feature. The hooks, in the order one step calls them: `before_step` (the step about to
    run), `read` (whether this rank's read of its windows failed), `batch` (the windows, before the
    forward), `after_step` (the update is done: `trainer.state.step` is the step), `metrics` and `log`
    (a logging step: the values a feature adds to the record, then the record as written),
    `evaluate`, `end_step`, `should_stop`, `save`; `start` before the first step, `finish` after the
    last, `close` always (also after an error, and when `start` never ran). A feature is made from
    the run's config alone (cheap, nothing started): what it builds, it builds in `start`."""

    # Its name: in other features' `after`/`before`, and the kind of the records it writes of its own.
    name: ClassVar[str] = ""
    # The features whose hooks run before this one's (`after`) or after them (`before`), by name, in
    # every hook: named dependencies rather than an order key, so each says which effect it needs (and
    # a feature that is not there, or a cycle, is an error when the registry is imported). A feature
    # that adds to the training line from what it computes in `after_step` runs before "metrics".
    after: ClassVar[tuple[str, ...]] = ()
    before: ClassVar[tuple[str, ...]] = ()
    # Its own config section, `train.<Options.section>` in YAML: a dataclass that checks itself on
    # construction, composed into `train:` by launch/config.py. None: it reads the shared sections only.
    Options: ClassVar[type[Any] | None] = None

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    @classmethod
    def enabled(cls, cfg: Config) -> bool:
        """Whether a run with `cfg` has this feature (its own policy; default: always)."""
        return True

    @classmethod
    def options_of(cls, cfg: Config) -> Any:
        """Its section of `cfg` (an `Options`)."""
        assert cls.Options is not None, f"{cls.__name__} has no config section"
        return cfg.train.own(cls.Options)

    @property
    def options(self) -> Any:
        """Its section of the run's config (an `Options`)."""
        return self.options_of(self.cfg)

    def start(self, trainer: Trainer) -> None:
        """The run is built (engine, data, run directory, a checkpoint restored): before the first step."""

    def before_step(self, trainer: Trainer, step: int) -> None:
        """Step `step` begins (its read included)."""

    def read(self, trainer: Trainer, step: int, failure: Exception | None) -> None:
        """This rank's read of the step's windows, `failure` when it raised. Every rank calls it,
        before the step's collectives."""

    def batch(self, trainer: Trainer, step: int, windows: Tensor) -> None:
        """This rank's windows of the step [n, seq_len + 1], before the forward."""

    def after_step(self, trainer: Trainer, step: int) -> None:
        """The update of step `step` is done."""

    def metrics(self, trainer: Trainer, step: int) -> dict[str, Any]:
        """What this feature adds to a logging step's training record (metrics.jsonl's "train" line)."""
        return {}

    def log(self, trainer: Trainer, step: int, record: dict[str, Any]) -> None:
        """A logging step's training record, as written (also `trainer.last("train")`)."""

    def evaluate(self, trainer: Trainer, step: int) -> None:
        """After the step's log: evaluate if this feature's policy says so."""

    def end_step(self, trainer: Trainer, step: int) -> None:
        """Step `step` has ended, its evaluation included."""

    def should_stop(self, trainer: Trainer, step: int) -> bool | str:
        """Whether the run stops after this step (the trainer then saves and leaves the loop): False to go
        on, else True or why ("by a signal", said in the run's last line). Called on every feature, every
        step, on every rank: the answer must be the same on every rank."""
        return False

    def save(self, trainer: Trainer, step: int) -> None:
        """The end of a step that went on: checkpoint if this feature's policy says so."""

    def finish(self, trainer: Trainer) -> None:
        """The loop has ended (the last step, or a stop)."""

    def close(self) -> None:
        """Give back what the feature holds (threads, files, signal handlers)."""
