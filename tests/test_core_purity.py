"""The core is sans-IO: it must not import clocks, randomness, sockets, storage or concurrency."""

import ast
from pathlib import Path

import stockade.core

FORBIDDEN = {"time", "random", "socket", "sqlite3", "asyncio", "threading", "os", "secrets", "datetime"}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_core_imports_no_io():
    core_dir = Path(stockade.core.__file__).parent
    files = sorted(core_dir.rglob("*.py"))
    assert files
    for path in files:
        bad = _imports(path) & FORBIDDEN
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_purity_check_can_fail(tmp_path):
    # the control: a module that imports time is caught
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nfrom asyncio import sleep\n")
    assert _imports(bad) & FORBIDDEN == {"time", "asyncio"}
