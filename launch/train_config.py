"""The launcher's own config sections: `run:` (where a run lives, how it resumes and checkpoints)
and `train:` with its sub-sections (`train.profile`, `train.memory_snapshot`, and each loop feature's
own, launch/features/). Each checks itself on construction with one-line `ConfigError`s;
`launch/config.py` composes them with the other packages' sections."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from launch.errors import ConfigError
from launch.runtime.attention import ATTENTION_BACKENDS


class Section(Protocol):
    """An options class of a component's own sub-section, named by `section`."""

    section: ClassVar[str]


T = TypeVar("T", bound=Section)
DTYPES: tuple[str, ...] = ("auto", "bf16", "fp32")
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
ON_SAVE_ERROR: tuple[str, ...] = ("stop", "continue")


class OwnSections:
    """A section holding its components' own sub-sections (`sections`, by section name: a loop
    feature's under `train:`, a backend's under `parallel:`)."""

    sections: dict[str, Any]

    def own(self, options: type[T]) -> T:
        """Section `options` (an options class with its `section` name): its defaults when unset."""
        found = self.sections.get(options.section)
        return found if isinstance(found, options) else options()


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def at_least(section: str, obj: Any, **minima: float | tuple[float, str]) -> None:
    """`<section>.<key> must be >= <minimum> (<note>), got <value>` for the first key below its minimum;
    a minimum given as (minimum, note) says in the note what that value means."""
    for key, spec in minima.items():
        low, note = spec if isinstance(spec, tuple) else (spec, "")
        value = getattr(obj, key)
        require(value >= low, f"{section}.{key} must be >= {low}{f' ({note})' if note else ''}, got {value}")


@dataclass
class RunConfig:
    """`run:`: where a run lives, how it resumes and checkpoints (changing it on resume is routine)."""

    resume_policy: ClassVar[str] = "routine"

    dir: str = "runs/tiny"
    resume: str = "auto"  # auto | none | restart (damaged checkpoints moved aside, never deleted) | <a checkpoint>
    overwrite: bool = False  # allow starting fresh in a run dir that already has metrics
    keep_checkpoints: int = 3  # newest complete checkpoints kept; older ones are deleted (0: keep all)
    # A checkpoint (of another run dir) to start from while run.dir holds none of its own: a cooldown
    # branch (launch.branch), a fine-tune. Only read; once run.dir has a checkpoint, auto resumes there.
    init_from: str | None = None
    # Interval checkpoints staged (copied to host) at their step and written by a background thread
    # while training goes on; published only once complete (launch/checkpoint/async_writer.py).
    async_save: bool = False

    def __post_init__(self) -> None:
        require(bool(self.resume), "run.resume must be auto, none, restart or a checkpoint path")
        at_least("run", self, keep_checkpoints=(0, "0: keep all"))


@dataclass
class ProfileConfig:
    """`train.profile`: torch.profiler traces of windows of steps, one chrome trace per rank and window
    (launch/run/traces.py). The window is torch.profiler.schedule's, counted in this launch's steps."""

    resume_policy: ClassVar[str] = "routine"  # traces observe the run; they change nothing in it

    enabled: bool = False
    skip_first: int = 5  # steps before the first window (start-up, first allocations, compilation)
    wait: int = 0  # steps between windows
    warmup: int = 1  # steps traced and discarded before each window (the profiler's own start-up)
    active: int = 3  # steps in each trace
    repeat: int = 1  # windows (0: one after another until the run ends)
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False

    def __post_init__(self) -> None:
        at_least("train.profile", self, skip_first=0, wait=0, warmup=0, repeat=0, active=(1, "steps in each trace"))


@dataclass
class MemorySnapshotConfig:
    """`train.memory_snapshot` (CUDA only): the allocator's history over a window of this launch's steps,
    dumped for pytorch.org/memory_viz, and on an out-of-memory error (launch/run/traces.py)."""

    resume_policy: ClassVar[str] = "routine"  # snapshots observe the run

    enabled: bool = False
    skip_first: int = 0  # steps before recording starts
    steps: int = 3  # steps recorded, then dumped (0: until the run ends or runs out of memory)
    max_entries: int = 100_000  # allocation events kept (the newest)

    def __post_init__(self) -> None:
        at_least("train.memory_snapshot", self, skip_first=0, steps=(0, "0: to the end"), max_entries=1)


@dataclass
class TrainConfig(OwnSections):
    max_steps: int = 200
    tokens_per_step: int = 8192  # global; reached by gradient accumulation
    micro_batch_size: int = 8  # sequences per micro-batch per rank
    seed: int = 42
    log_every: int = field(default=10, metadata={"resume": "routine"})
    eval_every: int = field(default=50, metadata={"resume": "routine"})
    ckpt_every: int = field(default=0, metadata={"resume": "routine"})  # 0: only the final checkpoint
    # more steps to save at (a wsd run's branch points)
    ckpt_at: list[int] = field(default_factory=list, metadata={"resume": "routine"})
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32
    # CUDA: fp32 matmuls (train.dtype=fp32, optim.muon.ns_dtype=fp32, fp32 paths under autocast) on TF32
    # tensor cores, as nanoGPT and torchtitan run them; false: full fp32. No effect on CPU.
    tf32: bool = True
    # F.scaled_dot_product_attention's kernel: auto (per board, as the device check measured it;
    # launch/engine/attention.py) | default (torch's order) | flash | cudnn | efficient | math
    attention: str = "auto"
    device: str = "auto"  # auto | cpu | cuda
    # a bar on rank 0 when stderr is a terminal; else a log line per log_every
    progress: bool = field(default=True, metadata={"resume": "routine"})
    record_windows: bool = False  # debug: log a hash of every training window per rank (data audits)
    skip_spikes: bool = False  # skip the update when loss or grad norm > mean + k·σ of the last steps
    spike_window: int = 128  # steps in the rolling mean and σ (OLMo-core's rule)
    spike_sigma: float = 6.0  # k
    tensorboard: bool = False  # mirror metrics.jsonl to <run.dir>/tensorboard (needs tensorboard)
    wandb: bool = False  # mirror metrics.jsonl to Weights & Biases in offline mode (needs wandb)
    on_save_error: str = "stop"  # a checkpoint that cannot be written: stop (non-zero exit) | continue (retry later)
    # Every thread's stack on stderr while a step has run this long without finishing, and again each
    # interval while it lasts (a data read that never returns; 0: off). launch/runtime/stack_dumps.py
    stall_dump_s: float = 300.0
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    memory_snapshot: MemorySnapshotConfig = field(default_factory=MemorySnapshotConfig)
    sections: dict[str, Any] = field(default_factory=dict)  # the loop features' own, by section name

    def __post_init__(self) -> None:
        at_least("train", self, max_steps=1, tokens_per_step=1, spike_window=2)
        require(self.spike_sigma > 0, f"train.spike_sigma must be > 0, got {self.spike_sigma}")
        at_least("train", self, micro_batch_size=1, log_every=1, eval_every=(0, "0: only at the end"), ckpt_every=0)
        require(
            all(isinstance(s, int) and s >= 1 for s in self.ckpt_at),
            f"train.ckpt_at must be a list of steps >= 1, got {self.ckpt_at}",
        )
        require(self.dtype in DTYPES, f"train.dtype must be auto, bf16 or fp32, got {self.dtype!r}")
        require(self.device in DEVICES, f"train.device must be auto, cpu or cuda, got {self.device!r}")
        require(
            self.attention in ATTENTION_BACKENDS,
            f"train.attention must be one of {', '.join(ATTENTION_BACKENDS)}, got {self.attention!r}",
        )
        require(
            self.on_save_error in ON_SAVE_ERROR,
            f"train.on_save_error must be stop or continue, got {self.on_save_error!r}",
        )
        at_least("train", self, stall_dump_s=(0, "0: off"))
