"""Every sync twin (client, backend ports) is generated, never edited: the generator and its rules are checked."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "unasync.py"


def _load():
    spec = importlib.util.spec_from_file_location("unasync_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_mode_passes_on_the_tree():
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _copy(unasync, tmp_path: Path) -> Path:
    package = tmp_path / "stockade"
    shutil.copytree(unasync.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    return package


@pytest.mark.parametrize("twin", ["client/_sync/store.py", "coordinators/etcd/_sync/port.py"])
def test_check_mode_fails_when_a_generated_file_differs(tmp_path, capsys, twin):
    """Control: --check is not a no-op; an edited twin, in any _sync/ folder, makes it exit 1."""
    unasync = _load()
    package = _copy(unasync, tmp_path)
    assert unasync.main(["--check"], package=package) == 0
    (package / twin).write_text((package / twin).read_text() + "# edited by hand\n")
    assert unasync.main(["--check"], package=package) == 1
    assert twin in capsys.readouterr().err


def test_every_async_folder_is_a_source(tmp_path):
    """A new ``_async/`` folder anywhere in the package gets its ``_sync/`` sibling written, with no list to edit."""
    unasync = _load()
    package = _copy(unasync, tmp_path)
    (package / "transport" / "_async").mkdir(exist_ok=True)
    (package / "transport" / "_async" / "planted.py").write_text("async def f() -> None:\n    await g()\n")
    assert unasync.main(["--check"], package=package) == 1
    assert unasync.main([], package=package) == 0
    written = (package / "transport" / "_sync" / "planted.py").read_text()
    assert written == unasync.HEADER + "def f() -> None:\n    g()\n"


def test_a_rule_that_matches_nothing_fails(monkeypatch, capsys):
    unasync = _load()
    monkeypatch.setattr(unasync, "RULES", [*unasync.RULES, (r"\bNoSuchAsyncName\b", "NoSuchName")])
    assert unasync.main(["--check"]) == 2
    assert "NoSuchAsyncName" in capsys.readouterr().err
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert result.returncode == 0  # the real rule set has no unused rule


def test_prose_keeps_its_words_and_renames_only_names():
    unasync = _load()
    source = (
        '"""The async client; see `AsyncLease` and ``async with coord.lock(...)``."""\n'
        "# the async keepalive uses AsyncIO\n"
        "async def f(lease: AsyncLease) -> None:\n"
        "    await lease.aclose()\n"
    )
    counter = unasync._Counter(unasync.RULES)
    out = unasync.convert(source, counter)
    assert out == unasync.HEADER + (
        '"""The async client; see `Lease` and ``with coord.lock(...)``."""\n'
        "# the async keepalive uses SyncIO\n"
        "def f(lease: Lease) -> None:\n"
        "    lease.close()\n"
    )


def async_imports_of_sync(package: Path) -> list[str]:
    """Every import, in an ``_async`` folder's module, of a module in a ``_sync`` folder (run-time or not)."""
    import ast

    found = []
    for source in sorted(package.rglob("_async/*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            if any("_sync" in name.split(".") for name in names):
                found.append(f"{source.relative_to(package).as_posix()}:{node.lineno}")
    return found


def test_the_async_source_never_imports_generated_code(tmp_path):
    """The source of a twin does not read its output: a blocking read goes through ``AsyncIO.run_now``."""
    unasync = _load()
    assert async_imports_of_sync(unasync.PACKAGE) == []
    # the control: the import the HTTP opener used to make, planted in a copy, is found
    package = _copy(unasync, tmp_path)
    planted = package / "coordinators" / "http" / "_async" / "open.py"
    planted_import = "    from stockade.transport._sync.http_client import HTTPClient\n"
    planted.write_text(planted.read_text() + "\n\ndef f():\n" + planted_import)
    line = len(planted.read_text().splitlines())
    assert async_imports_of_sync(package) == [f"coordinators/http/_async/open.py:{line}"]


#: Hand-written async twins left outside transport/, each with why it cannot be generated.
TWINS_BY_HAND = {
    "resources/postgres/_probe.py:probe_sqlalchemy_async": "two drivers, not two spellings: the sync probe runs on a "
    "raw DBAPI connection of any driver (psycopg2 too), the async one on psycopg's AsyncConnection",
    "testing/fences/postgres.py:AsyncPgHarness": "not a twin: a subclass of the sync harness that drives the async "
    "front from the suite's sync tests on a loop thread of its own",
}


def hand_written_twins(package: Path) -> list[str]:
    """Every module-level function or class with async code in it, outside transport/ and the ``_async``/``_sync``
    folders, whose sync name (unasync's name rules) is defined in the same module: a twin written by hand."""
    import ast
    import re

    unasync = _load()

    def sync_name(name: str) -> str:
        for pattern, replacement in unasync.NAME_RULES:
            name = re.sub(pattern, replacement, name)
        return name

    found = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).parts
        if parts[0] == "transport" or "_async" in parts or "_sync" in parts:
            continue
        body = ast.parse(path.read_text()).body
        defined = [node for node in body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
        names = {node.name for node in defined}
        for node in defined:
            is_async = any(isinstance(n, ast.AsyncFunctionDef | ast.Await | ast.AsyncWith | ast.AsyncFor)
                           for n in ast.walk(node))
            if is_async and sync_name(node.name) != node.name and sync_name(node.name) in names:
                found.append(f"{path.relative_to(package).as_posix()}:{node.name}")
    return found


def test_no_async_twin_is_written_by_hand_outside_transport(tmp_path):
    """Every sync/async pair outside transport/ is generated from one ``_async/`` source, or named above with why."""
    unasync = _load()
    assert hand_written_twins(unasync.PACKAGE) == sorted(TWINS_BY_HAND)
    # the control: the pair the jobs recipe used to be, planted in a copy, is found
    package = _copy(unasync, tmp_path)
    planted = package / "recipes" / "planted.py"
    planted.write_text("def once(fn):\n    return fn()\n\n\nasync def once_async(fn):\n    return await fn()\n")
    assert hand_written_twins(package) == sorted([*TWINS_BY_HAND, "recipes/planted.py:once_async"])
