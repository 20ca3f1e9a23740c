"""The core and the wire contract are sans-IO: no clocks, randomness, sockets, storage or concurrency."""

import ast
from pathlib import Path

import pytest

import stockade.core
import stockade.wire

FORBIDDEN = {"time", "random", "socket", "sqlite3", "asyncio", "threading", "os", "secrets", "datetime"}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


# The pure layers: what decides (core) and what the HTTP API means (wire).
PURE = [stockade.core, stockade.wire]


@pytest.mark.parametrize("package", PURE, ids=lambda p: p.__name__)
def test_pure_layers_import_no_io(package):
    package_dir = Path(package.__file__).parent
    files = sorted(package_dir.rglob("*.py"))
    assert files
    for path in files:
        bad = _imports(path) & FORBIDDEN
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_purity_check_can_fail(tmp_path):
    # the control: a module that imports time is caught
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nfrom asyncio import sleep\n")
    assert _imports(bad) & FORBIDDEN == {"time", "asyncio"}


def test_wire_purity_check_can_fail(tmp_path):
    # the control for the wire layer: a copy of it with a socket import is caught by the same check
    import shutil
    import types

    copy = tmp_path / "wire"
    shutil.copytree(Path(stockade.wire.__file__).parent, copy)
    (copy / "routes.py").write_text("import socket\n" + (copy / "routes.py").read_text())
    fake = types.SimpleNamespace(__file__=str(copy / "__init__.py"), __name__="wire-copy")
    with pytest.raises(AssertionError, match="routes.py imports \\['socket'\\]"):
        test_pure_layers_import_no_io(fake)


def test_imports_point_one_way():
    """core <- wire, coordinators, resources <- client <- server <- cli (docs/architecture.md).

    The server reaches another backend (``serve --coordinator``) through the client's ports."""
    package = Path(stockade.core.__file__).parent.parent
    allowed = {
        "core": {"core"},
        "wire": {"core", "wire"},
        "coordinators": {"core", "clock", "coordinators", "keys", "_postgres_errors"},
        "resources": {"core", "clock", "resources", "metrics", "keys", "_postgres_errors"},
        "client": {"core", "clock", "coordinators", "resources", "client", "wire", "keys"},
        "server": {"core", "clock", "coordinators", "resources", "metrics", "server", "wire", "keys", "client"},
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
