"""A config warning is said once under several ranks: rank 0 says it, the others do not repeat it."""

from __future__ import annotations

import pytest

from tests.helpers import SMALL, TINY
from tests.pool import rank_pool
from tests.pool_jobs import train_runs

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def test_a_config_warning_is_said_once_on_two_ranks(tmp_path):
    argv = ["--config", TINY, *SMALL, f"run.dir={tmp_path}", "train.max_steps=2", "optim.warmup_steps=15"]
    argv += ["train.eval_every=0", "train.profile.enabled=true", "train.profile.skip_first=5"]
    results = rank_pool(2).run_raw(train_runs, [argv])
    assert [r.error for r in results] == [None, None], [r.log for r in results]
    said = [line for r in results for line in r.log.splitlines() if "WARNING" in line]
    assert sum("optim.warmup_steps (15) is more than train.max_steps (2)" in line for line in said) == 1, said
    assert sum("train.profile: the first trace ends after" in line for line in said) == 1, said
    assert all("[rank 1]" not in line for line in said), said
