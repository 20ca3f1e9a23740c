"""Measures of the tree's shape: imports point one way between layers, no import circle between modules,
and no module too big to read.

Imports under ``if TYPE_CHECKING:`` are left out (they never run); every other
import of a ``stockade`` module, at any depth of a module, is an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import stockade

PACKAGE = Path(stockade.__file__).parent
MODULE_LINES_MAX = 620  # the goal is ~600 (docs/architecture.md); the largest today is coordinators/sqlite/__init__.py


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


# The layers, lowest first (docs/architecture.md). A module may import its own layer and the ones it names;
# nothing imports back up. A backend's port (``coordinators/<name>/_async|_sync``) sits above the client's
# API it serves; the rest of a backend folder sits below the client, which reaches a port only through
# the registry's ``"module:function"`` strings, imported on use.
LAYERS: dict[str, set[str]] = {
    "core": set(),
    "wire": {"core"},
    "clock": set(),
    "metrics": set(),
    "keys": {"core"},
    "transport": {"core", "wire"},
    "coordinators": {"core", "clock", "keys", "transport"},
    "resources": {"core", "clock", "metrics", "keys", "transport"},
    "client": {"core", "clock", "keys", "wire", "transport", "coordinators", "resources"},
    "ports": {"core", "clock", "keys", "wire", "transport", "coordinators", "resources", "client"},
    "recipes": {"core", "clock", "keys", "transport", "coordinators", "resources", "client"},
    "server": {"core", "clock", "metrics", "keys", "wire", "transport", "coordinators", "resources", "client"},
}

# Imports that point up, each named with its reason. Only imports inside a function (run on use) qualify.
UPWARD_ALLOWED = {
    # the sqlite floor target also raises a shard log's marks in the same file (docs/shard-log.md)
    ("stockade.resources.store._floor_sqlite", "stockade.recipes.log"),
}


def layer_of(module: str) -> str | None:
    """The layer of a ``stockade`` module (None: the package root, cli and testing, which may use any layer)."""
    parts = module.split(".")[1:]
    if not parts or parts[0] in ("cli", "testing", "bench", "__main__"):
        return None
    if parts[0] == "coordinators" and ("_async" in parts or "_sync" in parts):
        return "ports"
    if parts[0] in ("ids", "jobs"):  # the recipes' public names, kept where users import them
        return "recipes"
    return parts[0]


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every edge of ``graph`` from a module to a layer it may not use."""
    bad = []
    for module, targets in sorted(graph.items()):
        layer = layer_of(module)
        if layer is None:
            continue
        for target in sorted(targets):
            other = layer_of(target)
            if other is None and target != "stockade":
                bad.append((module, target))
            elif other is not None and other != layer and other not in LAYERS[layer]:
                bad.append((module, target))
    return bad


def test_imports_point_one_way() -> None:
    graph = import_graph()
    assert {layer_of(m) for m in graph} - {None} == set(LAYERS), "a top-level folder or module with no layer"
    assert set(upward_imports(graph)) - UPWARD_ALLOWED == set()
    assert UPWARD_ALLOWED <= set(upward_imports(graph)), "a named exception that no longer exists"


def test_the_layer_check_can_fail() -> None:
    """The control: an engine importing a port, the client importing a port, core importing the client."""
    graph = {
        "stockade.coordinators.etcd": {"stockade.coordinators.etcd._async.port"},
        "stockade.client._async.connect": {"stockade.coordinators.zookeeper._sync.port"},
        "stockade.core.engine": {"stockade.client._shared"},
        "stockade.coordinators.etcd._async.port": {"stockade.client._async.port", "stockade.transport.io"},
    }
    assert upward_imports(graph) == [
        ("stockade.client._async.connect", "stockade.coordinators.zookeeper._sync.port"),
        ("stockade.coordinators.etcd", "stockade.coordinators.etcd._async.port"),
        ("stockade.core.engine", "stockade.client._shared"),
    ]
