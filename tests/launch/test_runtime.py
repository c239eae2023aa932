"""The process plumbing in the fast loop: parent death, torchrun's user-error path and the launcher's
signal forwarding (the report's command line: tests/report/test_cli.py). Each runs in-process or
starts a bare Python (no torch import), so none of them costs more than a second; the end-to-end kill
and SIGTERM runs under torchrun are in test_resume.py (slow)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from launch.launcher import forwarding as launcher
from launch.launcher import parent_death
from launch.launcher import torchrun as elastic
from launch.runtime import console
from tests.helpers import ROOT


def test_adopted_by_init_tells_an_init_from_a_launcher_at_pid_1(monkeypatch):
    monkeypatch.setattr(parent_death.os, "getppid", lambda: 1)
    for init, adopted in (
        ("/sbin/init", True),
        ("/usr/bin/tini -- bash", True),
        ("", False),
        ("/usr/bin/python3 -m torch.distributed.run train.py", False),
        ("torchrun train.py", False),
    ):
        monkeypatch.setattr(parent_death, "init_cmdline", lambda init=init: init)
        assert parent_death.adopted_by_init() is adopted, init
    monkeypatch.setattr(parent_death.os, "getppid", lambda: 4242)
    monkeypatch.setattr(parent_death, "init_cmdline", lambda: "/sbin/init")
    assert not parent_death.adopted_by_init()


# Reads the process's parent-death signal back from the kernel (PR_GET_PDEATHSIG = 2).
_PDEATHSIG = """
import ctypes, sys
from launch.launcher.parent_death import die_with_parent
die_with_parent()
sig = ctypes.c_int(-1)
ctypes.CDLL("libc.so.6").prctl(2, ctypes.byref(sig))
print(sig.value)
"""


@pytest.mark.slow  # starts Python processes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("under_torchrun", [True, False])
def test_a_worker_asks_to_die_with_its_launcher_only_under_torchrun(under_torchrun):
    env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RUN_ID"}
    if under_torchrun:
        env["TORCHELASTIC_RUN_ID"] = "test"
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", _PDEATHSIG], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == (int(signal.SIGKILL) if under_torchrun else 0)


def _failed(*exitcodes: int) -> ChildFailedError:
    failures = {
        r: ProcessFailure(local_rank=r, pid=1000 + r, exitcode=c, error_file="<N/A>") for r, c in enumerate(exitcodes)
    }
    return ChildFailedError("train.py", failures)


def _fails_as_torchrun_does(*exitcodes: int):
    """A stand-in for torchrun's `run`: it ends the other worker (its "closing signal" line), says the
    first failure (its "failed (exitcode: N)" line) and raises, as torch's elastic agent does."""

    def run(args):
        api = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
        api.warning("Sending process %s closing signal %s", 1001, "SIGTERM")
        api.error("failed (exitcode: %s) local_rank: 0 (pid: 1000) of binary: python", exitcodes[0])
        raise _failed(*exitcodes)

    return run


def test_torchrun_stays_quiet_when_every_worker_stopped_on_a_user_error(monkeypatch, caplog):
    monkeypatch.setattr(elastic, "run", _fails_as_torchrun_does(elastic.USER_ERROR, elastic.USER_ERROR))
    with caplog.at_level(logging.WARNING):
        assert elastic.main(["--nproc_per_node=2", "train.py"]) == elastic.USER_ERROR
    assert caplog.messages == []  # neither the failure's line nor the closing signal that came before it


def test_a_worker_crash_keeps_torchruns_report(monkeypatch, caplog):
    # one rank said why, the other was killed: a crash
    monkeypatch.setattr(elastic, "run", _fails_as_torchrun_does(-9, elastic.USER_ERROR))
    with caplog.at_level(logging.WARNING), pytest.raises(ChildFailedError):
        elastic.main(["--nproc_per_node=2", "train.py"])
    assert [m.split(" ")[:2] for m in caplog.messages[:2]] == [["Sending", "process"], ["failed", "(exitcode:"]]


def test_the_user_error_filter_drops_only_exit_status_2():
    keep = elastic._HideUserErrorExits().filter
    line = "failed (exitcode: {}) local_rank: 0 (pid: 1) of binary: python"
    make = lambda msg: logging.LogRecord("x", logging.ERROR, __file__, 1, msg, None, None)
    assert not keep(make(line.format(2)))
    assert keep(make(line.format(1))) and keep(make(line.format(-9)))


# A stand-in for `python -m launch.launcher.torchrun`: one "worker" child that, on SIGTERM, writes a
# mark (the checkpoint it would save) and exits 0; the stand-in exits with the worker's status.
_FAKE_TORCHRUN = """
import subprocess, sys
sys.exit(subprocess.Popen([sys.executable, sys.argv[1]]).wait())
"""
_FAKE_WORKER = """
import pathlib, signal, sys, time
def stop(signum, frame):
    pathlib.Path(sys.argv[0]).with_name("saved").write_text("saved")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
pathlib.Path(sys.argv[0]).with_name("ready").write_text("up")
time.sleep(60)
sys.exit(3)
"""


@pytest.mark.slow  # starts Python processes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the launcher's parent-death path is Linux's")
def test_the_launcher_forwards_sigterm_to_the_workers_and_exits_with_them(tmp_path, monkeypatch):
    mark, ready = tmp_path / "saved", tmp_path / "ready"
    (tmp_path / "worker.py").write_text(_FAKE_WORKER)
    (tmp_path / "torchrun.py").write_text(_FAKE_TORCHRUN)
    fake = tmp_path / "fake_python"  # ignores `-m launch.launcher.torchrun ARGS`
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'torchrun.py'} {tmp_path / 'worker.py'}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(launcher.sys, "executable", str(fake))  # the launcher's `python -m ...elastic`
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def preempt():
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)  # what a scheduler sends the launcher

    threading.Thread(target=preempt, daemon=True).start()
    try:
        rc = launcher.main(["--nproc_per_node=1", "train.py"])
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    assert rc == 0  # the worker finished its "save" and exited 0; torchrun with it
    assert mark.read_text() == "saved"


def test_a_user_error_under_plain_torchrun_names_the_short_launcher_and_fills_torchruns_report(
    tmp_path, monkeypatch, capsys
):
    """Plain torchrun follows a worker's error line with its traceback and failure report: the line
    says which launcher prints it alone, and torchrun's error file carries it, so that the report's
    root cause (read here by torchrun's own ProcessFailure) is the line, not a pointer to its docs."""
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.delenv(console.SHORT_ERRORS_ENV, raising=False)
    console.report_user_error(ValueError("no intact checkpoint in x\n  step_00000002: rank0.pt is missing"), rank=0)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "error: no intact checkpoint in x (plain torchrun adds its traceback; python -m launch.launcher prints "
        "this line alone)",
        "  step_00000002: rank0.pt is missing",
    ]
    report = ChildFailedError("train.py", {0: ProcessFailure(0, 1000, 2, str(error_file))}).format_msg()
    assert f"traceback : {err[0]}\n  {err[1]}" in report, report
    error_file.unlink()
    monkeypatch.setenv(console.SHORT_ERRORS_ENV, "1")  # under launch.launcher: the line alone
    console.report_user_error(ValueError("bad"), rank=0)
    assert capsys.readouterr().err == "error: bad\n"


# A rank other than 0 meeting a user error; argv[1] is its grace for rank 0.
_RANK_ONE_ERROR = """
import sys
from launch.runtime import console
console.report_user_error(ValueError("bad"), rank=1, rank_zero_grace_s=float(sys.argv[1]))
print("grace over", file=sys.stderr)
"""


def _catches_sigterm(pid: int) -> bool:
    """The process has its own SIGTERM handler (bit 15 of SigCgt in /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


@pytest.mark.slow  # starts Python processes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_rank_other_than_zero_outwaits_rank_zero_so_its_error_line_is_not_cut_off():
    """torchrun ends every worker once one has exited: a rank 1 that left first would take rank 0
    down before its line (seen in CI). Rank 1 waits; the launcher's SIGTERM ends it with status 2
    and nothing printed; if no SIGTERM comes (rank 0 did not fail so), it says the error itself."""
    cmd = [sys.executable, "-c", _RANK_ONE_ERROR]
    proc = subprocess.Popen([*cmd, "60"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 20
    while not _catches_sigterm(proc.pid) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2 and err == ""

    done = subprocess.run([*cmd, "0.2"], cwd=ROOT, capture_output=True, text=True, timeout=20)
    assert done.stderr == "[rank 1] error: bad\ngrace over\n"
