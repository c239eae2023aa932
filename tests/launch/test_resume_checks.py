"""launch/run/resume.py's checks of a resumed run's config against its checkpoint, without training
(the runs that exercise them end to end are in test_resume.py, marked slow)."""

from __future__ import annotations

import logging
from typing import Any

from launch.checkpoint import FORMAT
from launch.config import load_config, to_dict
from launch.run.resume import check_resume_compatible
from tests.helpers import TINY


def meta(*overrides: str) -> dict[str, Any]:
    """The parts of a checkpoint's meta.json (or of this run's) that the check compares."""
    return {"format": FORMAT, "model": {}, "tokenizer": "t", "config": to_dict(load_config(TINY, list(overrides)))}


def test_a_changed_max_steps_is_listed_among_the_changed_settings(caplog) -> None:
    """train.max_steps moves the end of the LR schedule, so the resumed steps get other LRs than
    the checkpoint's run would have: said, like optim.lr. Logging more often is not."""
    with caplog.at_level(logging.WARNING, logger="orscale"):
        check_resume_compatible(meta("train.max_steps=200"), meta("train.max_steps=300", "train.log_every=5"))
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == "resuming with changed settings: config.train.max_steps: 200 -> 300", line
