"""The SQLite store's file format, and the file-level helpers its store and its backup share.

Tables (all ``STRICT``)::

    meta         kind, schema_version, cluster_id
    counters     commit_seq, idempotency_keys, audit_pruned_through
    hwm          scope -> high_water
    kv           (scope, key) -> value, token_value, commit_seq
    audit        commit_seq -> scope, key, op, token_value, idempotency_key
    idempotency  (scope, idempotency_key) -> the original WriteResult

``commit_seq`` numbers accepted writes in one total order per store file. It
never goes back and is never reused, also across `stockade.resources.store.backup.restore`.
"""

from __future__ import annotations

import math
import os
import random
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from stockade.core.errors import BackendUnavailable, InvalidArgument, invariant
from stockade.core.values import AuditRecord, Item
from stockade.resources._verify import TOKENLESS, UNSIGNED, refuse_unsigned_after_signed
from stockade.resources.store._sqlite_journal import collecting, journal_alone

__all__: list[str] = []  # private to the SQLite adapter and its backup

STORE_KIND = "stockade-store"
SCHEMA_VERSION = "1"


SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS hwm (scope TEXT PRIMARY KEY, high_water INTEGER NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS kv (
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    token_value INTEGER NOT NULL,
    commit_seq INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
) STRICT;
CREATE TABLE IF NOT EXISTS audit (
    commit_seq INTEGER PRIMARY KEY,
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    op TEXT NOT NULL,
    token_value INTEGER NOT NULL,
    idempotency_key TEXT
) STRICT;
CREATE INDEX IF NOT EXISTS audit_by_scope ON audit (scope, commit_seq);
CREATE TABLE IF NOT EXISTS idempotency (
    scope TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    key TEXT NOT NULL,
    token_value INTEGER NOT NULL,
    high_water INTEGER NOT NULL,
    commit_seq INTEGER NOT NULL UNIQUE,
    PRIMARY KEY (scope, idempotency_key)
) STRICT;
"""
COUNTERS = ("commit_seq", "idempotency_keys", "audit_pruned_through", "default_floor")
# default_floor: the mark of every scope without a row in hwm (0 unless a restore set it).
# Files made before it existed lack the row, which reads as 0.


FILE_MODE = 0o600  # store files, their WAL and shared memory, backups, reports: owner only


def create_private(path: Path) -> None:
    """Create ``path`` empty with mode 0600 unless it exists (whatever the umask).

    SQLite gives the WAL, shared-memory and journal files the mode of the
    database file, so creating the database file first keeps them all private.
    An existing file keeps the mode its owner gave it.
    """
    try:
        fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, FILE_MODE)  # the umask may have narrowed the mode, never widened it; be exact anyway
    finally:
        os.close(fd)


def connect(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    create_private(path)
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=busy_timeout_ms / 1000)
    try:
        switch_to_wal(conn, busy_timeout_ms)
        conn.execute("PRAGMA synchronous=FULL")
    except sqlite3.Error:
        conn.close()
        raise
    return conn


#: Connections that open one new file at once: "database is locked" is retried this often (jittered) within
#: the busy timeout.
WAL_RETRY_S = 0.005


def switch_to_wal(conn: sqlite3.Connection, busy_timeout_ms: int) -> None:
    """``PRAGMA journal_mode=WAL``, retried within ``busy_timeout_ms``.

    Switching needs a moment of exclusive access, and SQLite answers "database
    is locked" at once, without its busy handler, when another connection opens
    (or switches) the same file at that moment: several processes opening a new
    store together would fail all but one.
    """
    deadline = time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() >= deadline:
                raise
            time.sleep(WAL_RETRY_S * (0.5 + random.random()))


def initialise(conn: sqlite3.Connection, path: Path, cluster_id: str | None) -> str:
    """Create the tables of a new store file, or check an existing one; its cluster id.

    Runs inside the caller's write transaction.
    """
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "meta" not in tables:
        if tables:
            raise InvalidArgument("path", f"{path} is an SQLite file but not a stockade store")
        if cluster_id is None:
            raise InvalidArgument("cluster_id", "required to create a new store file")
        for statement in SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.executemany(
            "INSERT INTO meta (k, v) VALUES (?, ?)",
            [("kind", STORE_KIND), ("schema_version", SCHEMA_VERSION), ("cluster_id", cluster_id)],
        )
        conn.executemany("INSERT INTO counters (name, value) VALUES (?, 0)", [(n,) for n in COUNTERS])
        return cluster_id
    meta = read_meta(conn, path)
    if cluster_id is not None and cluster_id != meta["cluster_id"]:
        raise InvalidArgument("cluster_id", f"{cluster_id!r} differs from the store's cluster {meta['cluster_id']!r}")
    return meta["cluster_id"]


def remember_verifying(conn: sqlite3.Connection, resource: str, keys: object) -> None:
    """L2 in the file: a store opened once with keys keeps verifying (a ``verified`` counter row).

    Runs inside the caller's write transaction; writes only the first time.

    Raises:
        InvalidArgument: ``keys`` is ``"unsigned"`` and the file was opened with keys before.
    """
    verified = conn.execute("SELECT 1 FROM counters WHERE name = 'verified'").fetchone() is not None
    refuse_unsigned_after_signed(resource, verified, keys)
    if keys not in (UNSIGNED, TOKENLESS) and not verified:
        conn.execute("INSERT INTO counters (name, value) VALUES ('verified', 1)")


class FileBusy(BackendUnavailable):
    """Another connection holds the file's write lock and the caller's wait (none, or its deadline) ran out.

    Nothing happened (``certain_no_effect``); the message names the file and says what holds it up.
    """

    def __init__(self, detail: str) -> None:
        super().__init__(detail, certain_no_effect=True)


#: The longest one SQLite busy wait runs before `write_transaction` looks at its own deadline again.
BUSY_SLICE_MS = 50


def held_by_another(conn: sqlite3.Connection, waited_ms: int) -> str:
    """What an operation that gave up on the write lock says: whose lock, why it cannot be taken, how long."""
    try:
        name = conn.execute("PRAGMA database_list").fetchone()[2] or ":memory:"
    except sqlite3.Error:
        name = "the database"
    return (f"{name}: its write lock is held by another connection, a writer inside its transaction (one paused "
            f"or frozen there keeps it until it resumes or dies: SQLite cannot take a lock from another "
            f"process); gave up after {waited_ms} ms")


def begin_by(conn: sqlite3.Connection, until_s: float | None = None) -> None:
    """``BEGIN IMMEDIATE``, waiting for the write lock until ``until_s`` (monotonic; None: the connection's
    own busy timeout from now), measured on the monotonic clock.

    SQLite's busy handler counts the sleeps it asked for, not the time that passed: on a busy host one
    busy timeout of N ms takes longer than N ms. So it waits in slices of `BUSY_SLICE_MS` at most, and
    the monotonic clock decides when to stop. The connection's own busy timeout is put back after.

    Raises:
        FileBusy: ``until_s`` passed and another connection still holds the write lock.
    """
    began_s = time.monotonic()
    (usual,) = conn.execute("PRAGMA busy_timeout").fetchone()
    if until_s is None:
        until_s = began_s + int(usual) / 1000
    try:
        while True:
            left_ms = math.ceil((until_s - time.monotonic()) * 1000)
            conn.execute(f"PRAGMA busy_timeout = {max(0, min(left_ms, BUSY_SLICE_MS))}")
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if time.monotonic() >= until_s:
                    raise FileBusy(held_by_another(conn, round((time.monotonic() - began_s) * 1000))) from exc
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(usual)}")


@contextmanager
def write_transaction(
    conn: sqlite3.Connection, *, wait_ms: int | None = None, until_s: float | None = None,
) -> Iterator[sqlite3.Connection]:
    """One IMMEDIATE transaction, committed (fsync'd) when the block ends, rolled back on any exception.

    Args:
        wait_ms: wait at most this long for the file's write lock (None: the
            connection's busy timeout; 0: not at all).
        until_s: instead, wait for it until this monotonic time (`begin_by`): the
            deadline of the whole operation, of which earlier waits took their share.

    Raises:
        FileBusy: ``wait_ms`` or ``until_s`` passed and another connection holds the write lock.
        BackendUnavailable: BEGIN, a statement or COMMIT failed (``certain_no_effect``
            when nothing of the transaction can have landed).
    """
    try:
        if until_s is not None:
            begin_by(conn, until_s)
        elif wait_ms is None:
            conn.execute("BEGIN IMMEDIATE")
        else:
            (usual,) = conn.execute("PRAGMA busy_timeout").fetchone()
            conn.execute(f"PRAGMA busy_timeout = {int(wait_ms)}")
            try:
                conn.execute("BEGIN IMMEDIATE")
            finally:
                conn.execute(f"PRAGMA busy_timeout = {int(usual)}")
    except FileBusy:
        raise
    except sqlite3.OperationalError as exc:
        if wait_ms is not None and "locked" in str(exc):
            raise FileBusy(f"store busy: {exc}") from exc
        raise BackendUnavailable(f"store busy or unavailable: {exc}", certain_no_effect=True) from exc
    except sqlite3.Error as exc:
        raise BackendUnavailable(f"store busy or unavailable: {exc}", certain_no_effect=True) from exc
    except BaseException:  # an interrupt raised as BEGIN returned: never leave the write lock held
        rollback(conn)
        raise
    with collecting() as refused:  # the fence's refusals in this transaction, for the refusal journal
        try:
            yield conn
        except sqlite3.Error as exc:
            rolled_back = rollback(conn)
            raise BackendUnavailable(f"store write failed: {exc}", certain_no_effect=rolled_back) from exc
        except BaseException:
            rollback(conn)
            journal_alone(conn, refused, until_s=until_s)
            raise
    try:
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        rollback(conn)
        raise BackendUnavailable(f"store commit failed: {exc}") from exc
    journal_alone(conn, refused, until_s=until_s)  # a batch's refusals, once its accepted writes are durable


def fsync_path(path: Path, *, directory: bool = False) -> None:
    fd = os.open(str(path), os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rollback(conn: sqlite3.Connection) -> bool:
    """Roll back if a transaction is open; True if nothing of it remains."""
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        return True
    except sqlite3.Error:
        return False


def get_item(conn: sqlite3.Connection, scope: str, key: str) -> Item | None:
    row = conn.execute(
        "SELECT value, token_value, commit_seq FROM kv WHERE scope = ? AND key = ?", (scope, key)
    ).fetchone()
    return None if row is None else Item(scope, key, row[0], row[1], row[2])


def counter(conn: sqlite3.Connection, name: str) -> int:
    row = conn.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
    invariant(row is not None, f"store counter {name!r} missing")
    return row[0]


def default_floor(conn: sqlite3.Connection) -> int:
    """The mark of every scope that has no row of its own (set by a restore; 0 if never set)."""
    row = conn.execute("SELECT value FROM counters WHERE name = 'default_floor'").fetchone()
    return 0 if row is None else row[0]


def raise_default_floor(conn: sqlite3.Connection, floor: int) -> None:
    """Raise the default floor, and every scope's row below it, to ``floor`` (R4; never lowers)."""
    if floor > default_floor(conn):
        conn.execute("UPDATE hwm SET high_water = ? WHERE high_water < ?", (floor, floor))
        conn.execute(
            "INSERT INTO counters (name, value) VALUES ('default_floor', ?) "
            "ON CONFLICT (name) DO UPDATE SET value = max(value, excluded.value)", (floor,),
        )


def audit_after(conn: sqlite3.Connection, scope: str | None, after_seq: int, limit: int) -> list[AuditRecord]:
    if scope is None:
        rows = conn.execute(
            "SELECT commit_seq, scope, key, op, token_value, idempotency_key FROM audit "
            "WHERE commit_seq > ? ORDER BY commit_seq LIMIT ?", (after_seq, limit),
        ).fetchall()
    else:
        rows = conn.execute(
            "SELECT commit_seq, scope, key, op, token_value, idempotency_key FROM audit "
            "WHERE scope = ? AND commit_seq > ? ORDER BY commit_seq LIMIT ?", (scope, after_seq, limit),
        ).fetchall()
    return [AuditRecord(*row) for row in rows]


def read_meta(conn: sqlite3.Connection, path: Path) -> dict[str, str]:
    meta = dict(conn.execute("SELECT k, v FROM meta").fetchall())
    if meta.get("kind") != STORE_KIND:
        raise InvalidArgument("path", f"{path} is not a stockade store file (kind {meta.get('kind')!r})")
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise BackendUnavailable(f"{path}: store schema version {meta.get('schema_version')!r} is not supported")
    return meta


@dataclass(frozen=True, slots=True)
class FileInfo:
    cluster_id: str
    commit_seq: int
    audit_pruned_through: int
    high_waters: dict[str, int]
    default_floor: int


def inspect_file(path: Path) -> FileInfo:
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "meta" not in tables:
            raise InvalidArgument("path", f"{path} is not a stockade store file")
        meta = read_meta(conn, path)
        return FileInfo(
            meta["cluster_id"],
            counter(conn, "commit_seq"),
            counter(conn, "audit_pruned_through"),
            dict(conn.execute("SELECT scope, high_water FROM hwm").fetchall()),
            default_floor(conn),
        )
    finally:
        conn.close()


def remove_side_files(path: Path) -> None:
    """Remove a database's WAL, shared-memory and journal files (a stale WAL must never meet a new file)."""
    for suffix in ("-wal", "-shm", "-journal"):
        try:
            os.remove(f"{path}{suffix}")
        except FileNotFoundError:
            pass


def remove_database(path: Path) -> None:
    """Remove a database file and its side files."""
    remove_side_files(path)
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def copy_database(source_path: Path, target_path: Path, source: sqlite3.Connection | None = None) -> None:
    """Copy a database with the SQLite backup API into a self-contained file (rollback journal, no WAL)."""
    own_source = source is None
    if source is None:
        source = sqlite3.connect(str(source_path), isolation_level=None)
    try:
        create_private(target_path)
        target = sqlite3.connect(str(target_path), isolation_level=None)
        try:
            source.backup(target)  # pages=-1: every page in one step, under one read snapshot
            target.execute("PRAGMA journal_mode=DELETE")
        finally:
            target.close()
    finally:
        if own_source:
            source.close()

