"""Every command answers `--help` before importing torch (seconds of imports): each reads its arguments
first (launch/train_args.py, launch/export.py, launch/branch.py, launch/evaluation/offline_args.py; the
launcher and the report import nothing heavy), then imports what it runs."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT, env

pytestmark = pytest.mark.slow  # a Python process per command (a fraction of a second each, without torch)

COMMANDS = {
    "train.py": ["train.py"],
    "launch.launcher": ["-m", "launch.launcher"],
    "launch.export": ["-m", "launch.export"],
    "launch.evaluation": ["-m", "launch.evaluation"],
    "launch.branch": ["-m", "launch.branch"],
    "report": ["-m", "report"],
}


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_help_answers_without_importing_torch(command):
    proc = subprocess.run(
        [sys.executable, *command, "--help"],
        cwd=ROOT,
        env={**env(), "PYTHONPROFILEIMPORTTIME": "1"},  # -X importtime, inherited by any process it starts
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("usage: "), proc.stdout + proc.stderr[-2000:]
    # which writes "import time: self | cumulative | module" per import, nesting by indentation
    imported = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", proc.stderr, re.M)
    assert imported and "torch" not in imported, [m for m in imported if m.startswith("torch")][:5]
