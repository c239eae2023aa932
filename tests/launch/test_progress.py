"""The run's progress report: a bar on a terminal, else one log line per logging step."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from launch.run import progress_bar as progress_module
from launch.run.progress_bar import Progress

RECORD = {"step": 20, "train_loss": 5.4321, "lr": 3e-4, "grad_norm": 0.75, "tokens_per_s": 12345.6}
RECORD |= {"mfu": 0.381, "mfu_causal": 0.356}


def test_log_line_without_a_terminal(caplog) -> None:
    progress = Progress(total=100, start=10, enabled=True, bar=True, terminal=False)
    progress.update(11)  # the first step of this launch has ended: the ETA has a rate
    with caplog.at_level(logging.INFO, logger="orscale"):
        progress.logged(RECORD)
    (line,) = [r.getMessage() for r in caplog.records]
    head, eta = line.rsplit(" | ", 1)
    assert head == "step 20/100 | loss 5.4321 | lr 3.00e-04 | grad 0.75 | 12,346 tok/s | MFU 38.1% (35.6% causal)"
    assert eta.startswith("ETA ") and eta != "ETA ?"
    # MFU unknown (no peak FLOP/s for this device): left out, not printed as 0 or nan.
    assert "MFU" not in progress.line({**RECORD, "mfu": None, "mfu_causal": None})
    assert progress.line({**RECORD, "mfu_causal": None}).split(" | ")[5] == "MFU 38.1%"  # an old record


def test_other_ranks_and_a_terminal_bar_print_no_lines(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="orscale"):
        Progress(total=100, start=0, enabled=False, bar=True, terminal=False).logged(RECORD)
        bar = Progress(total=100, start=0, enabled=True, bar=True, terminal=True)
        bar.logged(RECORD)
        bar.update(20)
        bar.close()
    assert caplog.records == []
    assert bar._bar.n == 20  # the bar counts steps, from a resumed start too


def test_the_eta_leaves_out_the_first_steps_start_up(monkeypatch) -> None:
    """Step 1 holds the start-up (compilation, the first data read): 100 s here, then 1 s a step.
    The first line has no ETA; the next measures from the end of the first step: 10 s for steps
    2-11, 139 steps to go (the time since the start would say 23m10s)."""
    now = [0.0]
    monkeypatch.setattr(progress_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    progress = Progress(total=150, start=0, enabled=True, bar=True, terminal=False)
    now[0] = 100.0
    first = progress.line({**RECORD, "step": 1})
    progress.update(1)
    for step in range(2, 12):
        now[0] += 1.0
        if step == 11:
            line = progress.line({**RECORD, "step": 11})
            assert line.endswith(" | ETA 2m19s"), line
        progress.update(step)
    assert "ETA" not in first, first
