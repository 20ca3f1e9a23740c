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
