"""An interrupt raised as ``BEGIN`` returns leaves no transaction, and no write lock, behind.

Python delivers a signal's exception (KeyboardInterrupt on Ctrl-C) when the C call that
was running returns: a SIGINT that lands while ``BEGIN IMMEDIATE`` runs, or while
SQLite's busy handler waits inside it, is raised right after the transaction has been
opened. Code that begins before entering its ``try`` then leaves the connection inside
that transaction, holding the file's write lock: every other process and handle of the
file waits until the connection is closed ("coordinator busy for 5000 ms"; seen once in
a sync wait interrupted by SIGINT).

Each case opens a connection whose ``execute`` raises KeyboardInterrupt right after its
first ``BEGIN`` succeeded (what the signal does, without its timing), interrupts one
operation, and then asks a second connection for the write lock without waiting. The
controls put the old shape back (the coordinator's BEGIN before its ``try``; the store's
and the fence's rollback on an interrupt switched off) and find the lock still held.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

import stockade
from stockade.coordinators import sqlite as coord_sqlite
from stockade.resources import sqlite_db
from stockade.resources.store import _sqlite_files

ROUNDS = 5


class _InterruptedAtBegin(sqlite3.Connection):
    """A connection whose next ``BEGIN`` opens its transaction and then raises KeyboardInterrupt.

    With ``at_lock``, the statement that takes the file's write lock instead: the fence on a WAL file begins
    deferred and takes the lock with its raise or `sqlite_db._LOCK` (``BEGIN IMMEDIATE`` where it waits).
    """

    armed = False
    at_lock = False

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        cursor = super().execute(sql, *args)
        if _InterruptedAtBegin.at_lock:
            hit = sql in (sqlite_db._LOCK, sqlite_db._RAISE) or sql.upper().startswith("BEGIN IMMEDIATE")
        else:
            hit = sql.lstrip().upper().startswith("BEGIN")
        if _InterruptedAtBegin.armed and hit:
            _InterruptedAtBegin.armed = False
            raise KeyboardInterrupt
        return cursor


@pytest.fixture
def interrupting(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every ``sqlite3.connect`` made while it is active gives an `_InterruptedAtBegin`."""
    real = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return real(*args, factory=_InterruptedAtBegin, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", connect)
    yield lambda: monkeypatch.setattr(sqlite3, "connect", real)
    _InterruptedAtBegin.armed = _InterruptedAtBegin.at_lock = False


def _write_lock_free(path: Path) -> bool:
    other = sqlite3.connect(str(path), isolation_level=None, timeout=0)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError as exc:
        assert "locked" in str(exc) or "busy" in str(exc), exc
        return False
    finally:
        other.close()


def _interrupted(operation: Any) -> None:
    _InterruptedAtBegin.armed = True
    with pytest.raises(KeyboardInterrupt):
        operation()


def _old_write(self: coord_sqlite.SQLiteRecords) -> Any:
    """The coordinator's write unit as it was: BEGIN before the ``try`` that rolls back."""
    with self._locked() as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


@pytest.mark.parametrize("control", [False, True], ids=["fixed", "control"])
def test_the_embedded_coordinator(tmp_path: Path, interrupting: Any, monkeypatch: pytest.MonkeyPatch,
                                  control: bool) -> None:
    if control:
        from contextlib import contextmanager
        monkeypatch.setattr(coord_sqlite.SQLiteRecords, "_write", contextmanager(_old_write))
    path = tmp_path / "coord.db"
    coord = stockade.connect(f"sqlite:///{path}?process=embedded")
    interrupting()  # the handle's own connection interrupts; the others are plain
    free = tried = 0
    try:
        for n in range(ROUNDS):
            _interrupted(lambda n=n: coord.acquire(f"a{n}", ttl_ms=5_000))
            free += _write_lock_free(path)
            tried += 1
            if control:
                break  # the handle is stuck inside its transaction ("cannot start a transaction within ...")
            coord.acquire(f"b{n}", ttl_ms=5_000).release()  # the handle itself goes on
    finally:
        if not control:
            coord.close()
    print(f"\nembedded coordinator{' (control)' if control else ''}: write lock free after an interrupted "
          f"BEGIN {free} of {tried}")
    assert (free, tried) == ((0, 1) if control else (ROUNDS, ROUNDS))
    if not control:
        with stockade.connect(f"sqlite:///{path}?process=embedded") as other:
            other.acquire("c", ttl_ms=5_000, wait_ms=0).release()


@pytest.mark.parametrize("control", [False, True], ids=["fixed", "control"])
def test_the_store(tmp_path: Path, interrupting: Any, monkeypatch: pytest.MonkeyPatch, control: bool) -> None:
    if control:
        monkeypatch.setattr(_sqlite_files, "rollback", lambda conn: True)
    with stockade.connect(f"sqlite:///{tmp_path}/coord.db?process=embedded") as coord:
        lease = coord.acquire("s", ttl_ms=30_000)
        store = stockade.open_store(f"sqlite:///{tmp_path}/store.db", cluster_id=coord.cluster_id)
        interrupting()
        free = tried = 0
        for n in range(ROUNDS):
            _interrupted(lambda n=n: store.put("s", f"k{n}", "v", token=lease.token))
            free += _write_lock_free(tmp_path / "store.db")
            tried += 1
            if control:
                break
            store.put("s", f"k{n}", "v", token=lease.token)
        if not control:
            store.close()
        lease.release()
    print(f"\nstore{' (control)' if control else ''}: write lock free after an interrupted BEGIN {free} of {tried}")
    assert (free, tried) == ((0, 1) if control else (ROUNDS, ROUNDS))


@pytest.mark.parametrize("control", [False, True], ids=["fixed", "control"])
def test_the_fence_on_your_sqlite_file(tmp_path: Path, interrupting: Any, monkeypatch: pytest.MonkeyPatch,
                                       control: bool) -> None:
    if control:
        monkeypatch.setattr(sqlite_db, "rollback", lambda conn: True)
    monkeypatch.setattr(_InterruptedAtBegin, "at_lock", True)  # the fence's lock on a WAL file: its raise or _LOCK
    path = tmp_path / "app.db"
    with stockade.connect(f"sqlite:///{tmp_path}/coord.db?process=embedded") as coord:
        lease = coord.acquire("app", ttl_ms=30_000)
        conn = sqlite3.connect(str(path), isolation_level=None)  # the user's, made through the interrupting factory
        interrupting()
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT)")
        sqlite_db.install(conn, cluster_id=coord.cluster_id)
        free = tried = 0
        for n in range(ROUNDS):
            def write(n: int = n) -> None:
                with sqlite_db.fenced(conn, lease.token, keys=coord.verify_keys()):
                    conn.execute("INSERT INTO t VALUES (?, 'v')", (f"k{n}",))
            _interrupted(write)
            free += _write_lock_free(path)
            tried += 1
            if control:
                break
            assert not conn.in_transaction
            write()
        lease.release()
        conn.close()
    what = "SQLite fence (control)" if control else "SQLite fence"
    print(f"\n{what}: write lock free after an interrupted BEGIN {free} of {tried}")
    assert (free, tried) == ((0, 1) if control else (ROUNDS, ROUNDS))


def _old_commit_one_locked(self: coord_sqlite.SQLiteRecords, conn: sqlite3.Connection, old: Any, new: Any) -> Any:
    """The server's lone commit with BEGIN before the ``try`` that rolls back (the old shape)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        coord_sqlite.store_record(conn, old, new)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return [None]


@pytest.mark.parametrize("batch", [1, 3], ids=["lone", "batch"])
@pytest.mark.parametrize("control", [False, True], ids=["fixed", "control"])
def test_the_servers_commits(tmp_path: Path, interrupting: Any, monkeypatch: pytest.MonkeyPatch, control: bool,
                             batch: int) -> None:
    """`stockade serve`'s group commit (`SQLiteRecords.commit_records`): a lone change's written-out transaction
    and a batch's, interrupted as BEGIN returns, leave the file's write lock free and commit the next time."""
    from stockade.core.leases import AcquireRequest, LeasePolicy, ScopeRecord, acquire

    if control:
        if batch > 1:
            from contextlib import contextmanager
            monkeypatch.setattr(coord_sqlite.SQLiteRecords, "_write", contextmanager(_old_write))
        else:
            monkeypatch.setattr(coord_sqlite.SQLiteRecords, "_commit_one_locked", _old_commit_one_locked)
    path = tmp_path / "coord.db"
    records = coord_sqlite.SQLiteRecords(path, exclusive=True)
    interrupting()  # the server's own connection interrupts; the others are plain
    cluster = records.cluster_id

    def changes(n: int) -> list[Any]:
        out = []
        for i in range(batch):
            scope = f"s{n}-{i}"
            request = AcquireRequest(cluster=cluster, scope=scope, lease_id=coord_sqlite.new_lease_id(), holder="h",
                                     ttl_ms=1_000, wait_deadline_ns=0)
            out.append((ScopeRecord(scope), acquire(ScopeRecord(scope), request, 0, LeasePolicy())[0]))
        return out

    free = tried = 0
    try:
        for n in range(ROUNDS):
            _interrupted(lambda n=n: records.commit_records(changes(n)))
            free += _write_lock_free(path)
            tried += 1
            if control:
                break
            assert records.commit_records(changes(n)) == [None] * batch  # the same connection goes on
    finally:
        if not control:
            records.close()
    print(f"\nserver's {'lone' if batch == 1 else 'batch'} commit{' (control)' if control else ''}: write lock free "
          f"after an interrupted BEGIN {free} of {tried}")
    assert (free, tried) == ((0, 1) if control else (ROUNDS, ROUNDS))
