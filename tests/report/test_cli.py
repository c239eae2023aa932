"""The report's command line, and its place in the layers: it reads run records and
imports no part of the launcher, nor anything outside the run directories."""

from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

import pytest

from report import cli
from tests.helpers import ROOT


def test_a_missing_dir_is_one_line_and_an_empty_one_reports_nothing(tmp_path, capsys):
    assert cli.main([str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: runs directory '{tmp_path / 'nope'}' not found"]
    (tmp_path / "runs").mkdir()
    assert cli.main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    assert "(0 runs, 0 finished, 0 table rows)" in capsys.readouterr().out
    assert "0 run directories" in Path(tmp_path / "out" / "report.md").read_text()


@pytest.mark.parametrize("module", ["report"])
def test_python_m_report_runs_the_command(module, tmp_path, monkeypatch, capsys):
    (tmp_path / "runs").mkdir()
    monkeypatch.setattr(sys, "argv", [module, str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as stop:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert stop.value.code == 0 and "(0 runs, 0 finished, 0 table rows)" in capsys.readouterr().out


def test_the_report_imports_no_launcher_and_parses_no_source():
    for path in (ROOT / "report").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "launch" or n.startswith("launch.") or n == "ast" for n in names), (path, names)
