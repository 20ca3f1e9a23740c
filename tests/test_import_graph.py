"""Measures of the tree's shape: no import circle between modules, and no module too big to read.

Imports under ``if TYPE_CHECKING:`` are left out (they never run); every other
import of a ``stockade`` module, at any depth of a module, is an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import stockade

PACKAGE = Path(stockade.__file__).parent
MODULE_LINES_MAX = 620  # the goal is ~600 (docs/architecture.md); the largest today is coordinators/sqlite.py


def _module_name(path: Path) -> str:
    parts = ("stockade",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _edges(path: Path, known: set[str]) -> set[str]:
    """The stockade modules ``path`` imports when it runs."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    # `from stockade.x import y` is an edge to stockade.x.y when y is a module, else to stockade.x
    return {name for name in found if name in known and name != module}


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    files = sorted(root.rglob("*.py"))
    known = {_module_name(path) for path in files}
    return {_module_name(path): _edges(path, known) for path in files}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (package ``__init__`` edges to its own submodules excluded), or None."""
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt.startswith(node + "."):
                continue  # a package re-exporting its own modules is not a circle
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                circle = visit(nxt, path + [nxt])
                if circle:
                    return circle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            circle = visit(start, [start])
            if circle:
                return circle
    return None


def test_no_import_circle() -> None:
    graph = import_graph()
    assert len(graph) > 50
    assert find_circle(graph) is None, " -> ".join(find_circle(graph) or [])


def test_the_circle_check_can_fail() -> None:
    """The control: a two-module circle and a three-module circle are found."""
    assert find_circle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_circle({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": set()}) == ["x", "y", "z", "x"]
    assert find_circle({"p": {"p.q"}, "p.q": set()}) is None


def test_every_module_is_small_enough_to_read() -> None:
    sizes = {path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    too_big = {name: lines for name, lines in sizes.items() if lines > MODULE_LINES_MAX}
    assert not too_big, f"modules over {MODULE_LINES_MAX} lines: {too_big}"
