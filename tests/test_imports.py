"""No import circle, read with ast (every import, those inside functions included): the sweep package's
modules among themselves, and every module of the packages, a package's __init__ included, so any of
them imports first and alone."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT

PACKAGE = "launch.sweep"


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of the package that `path` imports anywhere in its text."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}  # from launch.sweep import x
    return found & modules


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (its modules in order, the first again at the end), or None."""
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return [*trail[trail.index(nxt) :], nxt]  # the open modules are the trail
            if nxt not in state and (found := visit(nxt, [*trail, nxt])):
                return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_the_sweep_modules_import_one_another_without_a_circle():
    files = {f"{PACKAGE}.{p.stem}": p for p in (ROOT / "launch" / "sweep").glob("*.py") if p.stem != "__init__"}
    graph = {name: _imports(path, set(files)) - {name} for name, path in files.items()}
    assert graph[f"{PACKAGE}.spec"], "the reading of imports found nothing: the test sees nothing"
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


PACKAGES = ("orscale", "models", "data", "launch", "evals", "records", "report")


def _module_files() -> dict[str, Path]:
    """Every module of the packages by its import name, a package's __init__.py by the package's."""
    files = {}
    for package in PACKAGES:
        for p in (ROOT / package).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return files


def _runtime_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of `modules` that `path` imports when it runs (inside functions too, and the package
    named by `from package import name`): an import under `if TYPE_CHECKING:` runs for the type checker
    alone and is left out."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found & modules


def test_no_module_of_the_packages_imports_itself_round_a_circle():
    """Every module of the packages, a package's __init__ (its tables, its names) and the imports made
    inside functions included: no chain of imports leads back to where it started."""
    files = _module_files()
    graph = {name: _runtime_imports(path, set(files)) - {name} for name, path in files.items()}
    assert graph["orscale.registry"] and graph["report.build"] and "data" in files, "the reading found nothing"
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])
