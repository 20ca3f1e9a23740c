"""``stockade check``'s restore case on stockade's own store, restored by a command (docs/check.md).

The resource is an embedded store (``sqlite:///.../store.db``) beside an
embedded coordinator, or the store of a `stockade serve` (its own
coordinator; the floor goes through the store's file, ``--resource-floor``).
Before the check, a copy of the store is taken with SQLite's online backup;
``--resource-restore`` puts that copy back into the live file with the same
backup API (what ``sqlite3 store.db ".restore COPY"`` does), so the restored
store has forgotten every mark the check's rounds raised. Each round the check measures the stale holder without a
floor (the restored store accepts it: what the floor is for), raises the
scratch scope's mark to the coordinator's floor, and must then refuse it
while the current holder goes on.

The control is the same check with ``--control restore-no-floor``: the floor
is skipped and the stale holder's write lands every round. 3 rounds
(``STOCKADE_LONG=1``: 20).
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import HELPERS, free_port, python_env

import stockade

#: (coordinator url, store url, restore command, more options of the check)
Stack = tuple[str, str, str, tuple[str, ...]]
ROUNDS = 20 if os.environ.get("STOCKADE_LONG") == "1" else 3
#: The online backup API, from a copy into the live store: ``python -c RESTORE COPY STORE``.
RESTORE = "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))"


def backup(store: Path, tmp_path: Path) -> str:
    """A copy of ``store`` taken now; the command that puts it back into the live file."""
    copy = tmp_path / "backup" / "store-before.db"
    copy.parent.mkdir()
    with sqlite3.connect(store) as live, sqlite3.connect(copy) as copied:
        live.backup(copied)
    live.close()
    copied.close()
    return " ".join(map(shlex.quote, [sys.executable, "-c", RESTORE, str(copy), str(store)]))


@pytest.fixture(params=["embedded", "serve"])
def store_and_copy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """(coordinator url, store url, restore command, more options): the store's copy taken before the check."""
    if request.param == "embedded":
        coord_url, store = f"sqlite:///{tmp_path / 'coord.db'}?process=embedded", tmp_path / "store.db"
        with stockade.connect(coord_url) as coord:
            stockade.open_store(f"sqlite:///{store}", cluster_id=coord.cluster_id).close()
        yield coord_url, f"sqlite:///{store}", backup(store, tmp_path), ()
        return
    home, port = tmp_path / "serve", free_port()
    helper = [sys.executable, str(HELPERS / "serve_restart.py")]
    subprocess.run([*helper, "start", str(home), str(port)], check=True, timeout=60, env=python_env())
    try:
        store = home / "data" / "store.db"
        url = f"http://127.0.0.1:{port}"
        yield url, url, backup(store, tmp_path), ("--resource-floor", f"sqlite:///{store}")
    finally:
        subprocess.run([*helper, "stop", str(home)], timeout=60)


def restore_check(store_and_copy: Stack,
                  *control: str) -> subprocess.CompletedProcess[str]:
    coord_url, store_url, restore, options = store_and_copy
    argv = [sys.executable, "-m", "stockade", "check", "--coordinator", coord_url, "--resource", store_url,
            "--cases", "restore", "--rounds", str(ROUNDS), "--resource-restore", restore, "--seconds", "600",
            "--quiet", *options, *control]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=python_env())
    print(result.stdout, result.stderr)
    return result


def verdict(result: subprocess.CompletedProcess[str]) -> str:
    return next(line.split(None, 1)[1] for line in result.stdout.splitlines()
                if line.split()[:2] in (["held", "restore:"], ["BROKEN", "restore:"]))


def test_restored_store_refuses_the_stale_holder_after_the_floor(store_and_copy: Stack) -> None:
    result = restore_check(store_and_copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert verdict(result) == (f"restore: 0 of {ROUNDS} stale writes applied after the restore and the floor; 0 of "
                               f"{ROUNDS} current holders refused; without the floor {ROUNDS} of {ROUNDS} stale "
                               "writes were accepted (what the floor is for)")
    assert "Traceback" not in result.stderr


def test_restored_store_without_the_floor_fails(store_and_copy: Stack) -> None:
    """The control: the same restore, the floor skipped: the stale holder's write lands every round."""
    result = restore_check(store_and_copy, "--control", "restore-no-floor")
    assert result.returncode == 1, result.stdout + result.stderr
    assert verdict(result).startswith(f"restore: {ROUNDS} of {ROUNDS} stale writes applied after the restore")


def test_a_server_store_restore_without_the_floor_url_is_bad_input(tmp_path: Path) -> None:
    """A `stockade serve`'s store is floored through its file, which an http url does not name: one line, exit 2,
    before anything is opened (the server is not even there)."""
    url = f"http://127.0.0.1:{free_port()}"
    argv = [sys.executable, "-m", "stockade", "check", "--coordinator", url, "--resource", url,
            "--resource-restore", "true"]
    for extra, message in (((), "give --resource-floor sqlite:///DATA/store.db"),
                           (("--resource-floor", f"sqlite:///{tmp_path}/none.db"), "no such SQLite file"),
                           (("--resource-floor", url), "stockade floor opens")):
        result = subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=60, env=python_env())
        assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
        assert result.stderr.startswith("stockade check: --resource-floor: ") and message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
