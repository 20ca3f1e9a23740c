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


def test_imports_point_one_way():
    """core <- coordinators, resources <- client, server <- cli (docs/architecture.md)."""
    package = Path(stockade.core.__file__).parent.parent
    allowed = {
        "core": {"core"},
        "coordinators": {"core", "clock", "coordinators"},
        "resources": {"core", "clock", "resources", "metrics"},
        "client": {"core", "clock", "coordinators", "resources", "client"},
        "server": {"core", "clock", "coordinators", "resources", "metrics", "server"},
    }
    for layer, may_use in allowed.items():
        for path in sorted((package / layer).rglob("*.py")):
            used = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("stockade."):
                    used.add(node.module.split(".")[1])
                elif isinstance(node, ast.Import):
                    used.update(a.name.split(".")[1] for a in node.names if a.name.startswith("stockade."))
            assert used <= may_use, f"{path.relative_to(package)} imports {sorted(used - may_use)}"


def test_testing_api_is_pinned():
    import stockade.testing

    for name in stockade.testing.__all__:
        assert getattr(stockade.testing, name) is not None
    assert {"run_seed", "check", "check_linearizable", "SimClock", "SimNetwork", "FencingOffStore"} <= set(
        stockade.testing.__all__
    )
