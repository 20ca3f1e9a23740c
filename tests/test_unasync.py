"""The sync client is generated, never edited: the generator is checked, and so are its rules."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

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


def test_check_mode_fails_when_a_generated_file_differs(monkeypatch, tmp_path, capsys):
    """Control: --check is not a no-op; an edited twin makes it exit 1."""
    unasync = _load()
    target = tmp_path / "_sync"
    target.mkdir()
    for path in unasync.TARGET.glob("*.py"):
        (target / path.name).write_text(path.read_text())
    (target / "store.py").write_text((target / "store.py").read_text() + "# edited by hand\n")
    monkeypatch.setattr(unasync, "TARGET", target)
    assert unasync.main(["--check"]) == 1
    assert "store.py" in capsys.readouterr().err


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
