"""launch/run/resume.py's checks of a resumed run's config against its checkpoint, without training
(the runs that exercise them end to end are in test_resume.py, marked slow)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from launch.checkpoint import FORMAT
from launch.config import keep_chosen, read_config, to_dict
from launch.run.resume import check_resume_compatible
from tests.helpers import TINY


def meta(*overrides: str) -> dict[str, Any]:
    """The parts of a checkpoint's meta.json (or of this run's) that the check compares."""
    config = to_dict(keep_chosen(read_config(TINY, list(overrides))))  # as config.yaml records it
    return {"format": FORMAT, "model": {}, "tokenizer": "t", "config": config}


def test_a_changed_max_steps_is_listed_among_the_changed_settings(caplog) -> None:
    """train.max_steps moves the end of the LR schedule, so the resumed steps get other LRs than
    the checkpoint's run would have: said, like optim.lr. Logging more often is not."""
    with caplog.at_level(logging.WARNING, logger="orscale"):
        check_resume_compatible(meta("train.max_steps=200"), meta("train.max_steps=300", "train.log_every=5"))
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == "resuming with changed settings: config.train.max_steps: 200 -> 300", line


def test_a_branch_says_what_it_is_and_warns_only_of_other_changes(caplog) -> None:
    """A run started from run.init_from's checkpoint of a wsd run (a cooldown branch) changes that
    run's budget and cooldown: that is what the branch is, said in one INFO line; a change beyond it
    (optim.lr here) is still a warning."""
    parent = meta("optim.schedule=wsd", "train.max_steps=32", "optim.decay_fraction=0.25")
    branch = ["optim.schedule=wsd", "train.max_steps=12", "optim.decay_steps=3"]
    start = Path("/runs/wsd/checkpoints/step_00000008")
    with caplog.at_level(logging.INFO, logger="orscale"):
        check_resume_compatible(parent, meta(*branch), branch_start=start)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [
        (
            "INFO",
            "a cooldown branch of /runs/wsd from its step 8: 12 steps (the parent's 32), the last 3 a wsd "
            "cooldown (from step 10)",
        )
    ], said
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="orscale"):
        check_resume_compatible(parent, meta(*branch, "optim.lr=0.01"), branch_start=start)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == ["resuming with changed settings: config.optim.lr: 0.003 -> 0.01"], warned
