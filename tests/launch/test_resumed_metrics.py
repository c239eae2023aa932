"""A resumed run writes the uninterrupted run's metrics.jsonl lines, every key of them (docs/running.md,
"Resuming, preemption, export"): the losses, and the optimizer's cumulative clip fractions
(`diag/*/cum_frac_*`, counters kept in the optimizer state) too, on one process and under ZeRO-2 and
FSDP2 on 2 ranks; only what the clock and the memory measure may differ."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import measured_apart, run_many

pytestmark = pytest.mark.slow

# r_max 1.05: some steps clip and some do not, so counters that restarted at the resume would read
# other fractions; checkpoints at steps 3 and 6, the resume from step 3.
RUN = [
    "optim.name=orscale_lm",
    "optim.r_max=1.05",
    "train.max_steps=7",
    "train.ckpt_every=3",
    "run.keep_checkpoints=0",
    "train.eval_every=4",
]


def _resumed_lines_equal_the_straight_runs(tmp_path: Path, backends: list[str], nproc: int) -> None:
    straight = {b: tmp_path / f"{b}_straight" for b in backends}
    run_many([[*RUN, f"parallel.backend={b}", f"run.dir={d}"] for b, d in straight.items()], nproc)
    resumed = {b: tmp_path / f"{b}_resumed" for b in backends}
    for b, d in resumed.items():  # as if killed after step 5: its newest checkpoint is step 3's
        shutil.copytree(straight[b], d)
        for step in (6, 7):
            shutil.rmtree(d / f"checkpoints/step_{step:08d}")
    run_many([[*RUN, f"parallel.backend={b}", f"run.dir={d}"] for b, d in resumed.items()], nproc)
    for b in backends:
        want, got = measured_apart(straight[b]), measured_apart(resumed[b])
        assert any(m.get("diag/all/cum_frac_rmax", 0) > 0 for m in want), "no step clipped: the test sees nothing"
        assert [m["step"] for m in got] == [m["step"] for m in want], b
        for a, w in zip(got, want, strict=True):
            assert a == w, (b, a["step"], {k: (a.get(k), w.get(k)) for k in set(a) | set(w) if a.get(k) != w.get(k)})


def test_a_resumed_run_writes_every_key_of_the_uninterrupted_runs_lines_one_process(tmp_path):
    _resumed_lines_equal_the_straight_runs(tmp_path, ["none"], 1)


@pytest.mark.distributed
def test_a_resumed_run_writes_every_key_of_the_uninterrupted_runs_lines_zero2_and_fsdp(tmp_path):
    _resumed_lines_equal_the_straight_runs(tmp_path, ["zero2", "fsdp"], 2)
