"""Fence a user's own SQLite database: the high-water mark lives in the user's file (docs/fence-sqlite.md).

`install` adds three tables to the user's database::

    stockade_fence        one row: cluster_id, default_floor, schema_version
    stockade_high_water   scope -> high_water
    stockade_operations   (scope, op_id) -> token_value: the operation ids applied (R3)

and the first open or admission with keys a fourth, ``stockade_verified``: the
file remembers that it verified, and refuses ``keys="unsigned"`` from then on (L2).

and a fenced transaction is the user's own transaction with the check as its
first step::

    with fenced(conn, lease.token, keys=coord.verify_keys()):
        conn.execute("UPDATE accounts SET balance = balance - 10 WHERE id = 1")

The block runs under SQLite's write lock, taken before the check is trusted
(``BEGIN IMMEDIATE`` before the mark is read, or, on a WAL file, right after
it is read in a snapshot that the lock proves newest: `_Fenced`), and held
until COMMIT. So the check, the raised mark and the user's statements are one
atomic unit, and a higher token that
arrives while a lower transaction is open waits for it (R6); the lower one
either commits whole before it or, if it comes after, is refused whole. A
rejection or an exception rolls everything back.

The rule is `stockade.core.fence` (MAC first, then R2, then R1), applied in
Python inside the transaction; every rejection goes through
`stockade.resources._observe.reject` (R5). `SQLiteFence` holds the rule as its
``fence_rule`` attribute (the controls of `stockade.testing.mutants` swap it).

With ``op_id=``, the block is one operation (R3): the id is recorded in the
same transaction, and a retry of an operation that committed raises
`AlreadyApplied` before the block runs, applying nothing.

Durability: a transaction is durable when COMMIT returns only if the
connection runs ``synchronous=FULL`` (or EXTRA) with a rollback journal or
WAL; with NORMAL in WAL mode a power loss may undo the last commits, marks
included, which is a restore (run the floor). ``journal_mode=OFF`` or MEMORY
cannot roll back after a crash. `fenced` checks both on every transaction and
refuses a connection that does not meet them (``durable=False`` accepts
NORMAL, knowingly).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stockade.core.errors import AlreadyApplied, BackendUnavailable, InvalidArgument
from stockade.core.fence import FenceRule, Recorded, Replay, decide
from stockade.core.limits import OPERATION_IDS_MAX, TOKEN_VALUE_MAX, validate_int, validate_op_id, validate_scope
from stockade.core.tokens import FencingToken
from stockade.core.values import FenceFloors, WriteResult
from stockade.resources._admit import admit, effective_mark
from stockade.resources._inputs import BUSY_TIMEOUT_MS_DEFAULT, BUSY_TIMEOUT_MS_MAX, check_floors, coerce_token
from stockade.resources._verified_tokens import VerifiedTokens
from stockade.resources._verify import (
    TOKENLESS,
    UNSIGNED,
    Verification,
    check_keys_given,
    refuse_unsigned_after_signed,
)
from stockade.resources.store._sqlite_files import FileBusy, begin_by, rollback
from stockade.transport.sqlite_url import sqlite_path

__all__ = ["install", "fenced", "fenced_sqlalchemy", "SQLiteFence", "open_floor_target", "UNSIGNED", "SCHEMA_VERSION",
           "AlreadyApplied"]

SCHEMA_VERSION = 1

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS stockade_fence ("
    " id INTEGER PRIMARY KEY CHECK (id = 1),"
    " cluster_id TEXT NOT NULL,"
    " default_floor INTEGER NOT NULL CHECK (default_floor >= 0),"
    " schema_version INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS stockade_high_water ("
    " scope TEXT PRIMARY KEY,"
    " high_water INTEGER NOT NULL CHECK (high_water >= 0))",
    # Added without a version change: a file installed before it gets it from `install`, and an
    # older library ignores it. seq orders the ids for the bound (the oldest are forgotten).
    "CREATE TABLE IF NOT EXISTS stockade_operations ("
    " seq INTEGER PRIMARY KEY,"
    " scope TEXT NOT NULL,"
    " op_id TEXT NOT NULL,"
    " token_value INTEGER NOT NULL,"
    " UNIQUE (scope, op_id))",
)
_TRANSACTION = "transaction"  # the fingerprint of every operation id: it names a whole transaction
_APPLIED = "SELECT token_value FROM stockade_operations WHERE scope = ? AND op_id = ?"
# fetchall: a RETURNING statement must run to completion before the next one.
_RECORD = "INSERT INTO stockade_operations (scope, op_id, token_value) VALUES (?, ?, ?) RETURNING seq"
_FORGET = "DELETE FROM stockade_operations WHERE seq <= ?"

# L2's memory: the table exists once the file verified (made by the first open or admission with keys,
# never by `install`), so a file fenced by an older library reads as "never verified" and keeps working.
_VERIFIED = "(SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'stockade_verified')"
_REMEMBER = ("CREATE TABLE IF NOT EXISTS stockade_verified (id INTEGER PRIMARY KEY CHECK (id = 1))",
             "INSERT OR IGNORE INTO stockade_verified (id) VALUES (1)")
# One statement reads the mark, the memory and the connection's `synchronous` (each statement costs ~1-3 µs, a
# pragma function ~2 µs more: it prepares a statement of its own). The journal mode is read before the transaction
# begins, by `_JOURNAL`, which takes no lock: it decides how the write lock is taken (`_Fenced`).
_READ = (
    "SELECT f.cluster_id, f.default_floor, f.schema_version,"
    " (SELECT high_water FROM stockade_high_water WHERE scope = ?),"
    " (SELECT synchronous FROM pragma_synchronous),"
    f" {_VERIFIED} FROM stockade_fence AS f"
)
_JOURNAL = "PRAGMA journal_mode"
# Takes the file's write lock and writes nothing (no row matches): the same-token transaction's second statement on
# the quick path (`_Fenced`). A raise takes the lock itself.
_LOCK = "UPDATE stockade_fence SET schema_version = schema_version WHERE 0"
_RAISE = (
    "INSERT INTO stockade_high_water (scope, high_water) VALUES (?, ?)"
    " ON CONFLICT (scope) DO UPDATE SET high_water = max(high_water, excluded.high_water)"
)

_SYNCHRONOUS_FULL = 2  # PRAGMA synchronous: 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA
_JOURNALS = ("delete", "truncate", "persist", "wal")  # modes that roll back after a crash


def install(conn: sqlite3.Connection, *, cluster_id: str) -> None:
    """Create (or check) the fence's tables in the user's database; idempotent.

    Runs in its own ``BEGIN IMMEDIATE`` transaction.

    Args:
        conn: a connection to the user's database, not inside a transaction.
        cluster_id: the coordinator cluster whose tokens this database trusts.

    Raises:
        InvalidArgument: ``conn`` is inside a transaction, or the database is
            already fenced for another cluster.
        BackendUnavailable: SQLite failed (busy past the timeout, disk full, read-only).
    """
    if not isinstance(cluster_id, str) or not cluster_id:
        raise InvalidArgument("cluster_id", "must be the coordinator's cluster id")
    with _transaction(conn), _ours("cannot install the fence"):
        for statement in _SCHEMA:
            conn.execute(statement)
        row = conn.execute("SELECT cluster_id, schema_version FROM stockade_fence").fetchone()
        if row is None:
            conn.execute(
                "INSERT INTO stockade_fence (id, cluster_id, default_floor, schema_version) VALUES (1, ?, 0, ?)",
                (cluster_id, SCHEMA_VERSION),
            )
        elif row[0] != cluster_id:
            raise InvalidArgument("cluster_id", f"the database is fenced for cluster {row[0]}, not {cluster_id}")
        elif row[1] != SCHEMA_VERSION:
            raise BackendUnavailable(f"fence schema version {row[1]} is not supported", certain_no_effect=True)


def _remember(execute: Any, verification: Verification, verified: object, resource: Callable[[], str]) -> None:
    """L2 in the file, inside the caller's IMMEDIATE transaction: refuse unsigned mode on a file that verified;
    a verifying handle's first transaction makes the memory (a tokenless one neither).

    Raises:
        InvalidArgument: the handle is unsigned and the file verified before (the caller rolls back).
    """
    if verified and verification.verifier is None:
        refuse_unsigned_after_signed(resource(), True, UNSIGNED)
    if verification.verifies and not verified:
        for statement in _REMEMBER:
            execute(statement, ())


def _cluster_of(keys: object, cluster_id: str | None) -> str:
    check_keys_given(keys)  # L2: None never means unsigned
    found = getattr(keys, "cluster_id", None) if keys not in (None, UNSIGNED) else None
    if cluster_id is None:
        if not isinstance(found, str):
            raise InvalidArgument("cluster_id", "required with keys that name no cluster (e.g. 'unsigned')")
        return found
    if found is not None and found != cluster_id:
        raise InvalidArgument("keys", f"belong to cluster {found}, not {cluster_id}")
    return cluster_id


def _verification(keys: object, cluster_id: str) -> Verification:
    verification = Verification()
    verification.use_keys(keys, cluster_id)
    return verification


# -- the transaction -----------------------------------------------------------------------------


def _check_settings(journal: object, synchronous: object, durable: bool) -> None:
    if str(journal).lower() not in _JOURNALS:
        raise InvalidArgument("conn", f"journal_mode={journal} cannot roll back after a crash; use WAL or DELETE")
    if durable and not (isinstance(synchronous, int) and synchronous >= _SYNCHRONOUS_FULL):
        raise InvalidArgument(
            "conn", f"PRAGMA synchronous={synchronous}: a commit is durable only with synchronous=FULL "
                    "(set it, or pass durable=False to accept losing the last commits on power loss)")


# The wait for the write lock ends at the connection's own busy timeout on the monotonic clock, and its error
# says what holds it up (docs/fence-sqlite.md, "A paused writer"). False: the control, SQLite's busy handler
# alone (which counts only its own sleeps), ending in a bare "database is locked".
bounded_waits = True


def _check_idle(conn: sqlite3.Connection) -> None:
    if getattr(conn, "autocommit", True) is False:  # Python 3.12's autocommit=False: always in a transaction
        raise InvalidArgument("conn", "open it with autocommit=True or isolation_level=None, not autocommit=False")
    if conn.in_transaction:
        raise InvalidArgument("conn", "already inside a transaction: commit or roll it back before fencing")


def _begin(conn: sqlite3.Connection) -> None:
    try:
        if bounded_waits:
            begin_by(conn)  # FileBusy (a BackendUnavailable, certain_no_effect) names the file and its holder
        else:
            conn.execute("BEGIN IMMEDIATE")
    except FileBusy:
        raise
    except sqlite3.Error as exc:
        raise BackendUnavailable(f"database busy or unavailable: {exc}", certain_no_effect=True) from exc


@contextmanager
def _ours(what: str) -> Iterator[None]:
    """Translate a failure of the fence's own statements (the caller rolls back); the user's pass unchanged."""
    try:
        yield
    except sqlite3.Error as exc:
        raise BackendUnavailable(f"{what}: {exc}", certain_no_effect=True) from exc


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``; rolled back on any exception, which propagates unchanged
    (the block's own statements are the user's: an IntegrityError stays one)."""
    _check_idle(conn)  # the caller's own transaction is never rolled back
    try:
        _begin(conn)  # in the try: an interrupt raised as BEGIN returns rolls it back too
        yield
    except BaseException:
        rollback(conn)
        raise
    _commit(conn)


def _commit(conn: sqlite3.Connection) -> None:
    if not conn.in_transaction:
        raise InvalidArgument("conn", "the block ended the fenced transaction itself (commit or rollback inside it)")
    try:
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        rollback(conn)
        raise BackendUnavailable(f"database commit failed: {exc}") from exc


class _Admission:
    """What one fenced transaction checks with: the cluster, the keys, the rule, the resource's name."""

    def __init__(
        self, cluster_id: str, verification: Verification, rule: FenceRule, resource: str,
        tokens: VerifiedTokens | None = None,
    ) -> None:
        self.cluster_id = cluster_id
        self.verification = verification
        self.rule = rule
        self.resource = resource
        self.tokens = tokens  # a handle's memory of tokens that verified (`SQLiteFence`), or None

    def check(self, token: object) -> tuple[FencingToken, str | None]:
        """The validated token and why its MAC is refused (None: it verified), before the transaction.

        Raises:
            InvalidArgument: a malformed token.
        """
        if self.tokens is not None:
            return self.tokens.check(token)
        checked = coerce_token(token)
        return checked, self.verification.forged(checked)

    def admit(
        self, execute: Any, token: FencingToken, scope: str, op_id: str | None = None, *, forged: str | None,
        journal: object, durable: bool = True, lock: bool = False,
    ) -> int:
        """Check ``token`` inside the open transaction and raise the mark; the new mark.

        ``execute(sql, params)`` returns a cursor-like object with ``fetchone``;
        ``journal`` is the connection's journal mode (`_JOURNAL`). The transaction
        holds the write lock already (``BEGIN IMMEDIATE``), or, with ``lock``, holds
        a read snapshot and takes the lock here before anything depends on it being
        the newest: the raise, or `_LOCK` (both fail at once, never wait, if another
        connection holds the lock or wrote since the snapshot: `_Fenced` retries).
        A refusal needs no lock: a mark only grows, so a token below the snapshot's
        mark is below the mark now.
        With ``op_id``: an id already recorded raises `AlreadyApplied` (after
        the MAC and R2, before R1: R3 answers even for a token gone stale since);
        a new one is recorded, and the oldest past `OPERATION_IDS_MAX` forgotten.

        Raises:
            StaleToken, TokenMismatch: rejected (R5: counted, logged); the caller rolls back.
            AlreadyApplied: ``op_id`` was applied before; the caller rolls back.
        """
        row = execute(_READ, (scope,)).fetchone()
        if row is None:
            raise InvalidArgument("conn", "the database has no fence: call install(conn, cluster_id=...) first")
        cluster, default_floor, version, own, synchronous, verified = row
        if not (synchronous >= _SYNCHRONOUS_FULL and journal in _JOURNALS):  # the usual case in one test
            _check_settings(journal, synchronous, durable)
        verification = self.verification
        if not verified or verification.verifier is None or verification.tokenless:
            _remember(execute, verification, verified, lambda: self.resource or _resource_name(execute))
        if cluster != self.cluster_id or version != SCHEMA_VERSION:
            _refuse_fence_row(cluster, self.cluster_id, version)
        recorded = None
        if op_id is not None:
            if lock:  # the write lock first: then no other transaction can be recording this id now
                execute(_LOCK, ())
                lock = False
            applied = _operation(execute, scope, op_id)
            if applied is not None:  # an operation id is an idempotency key of the whole transaction
                recorded = Recorded(_TRANSACTION, WriteResult(scope, op_id, applied, applied, 0, replayed=True))
        decision = admit(  # R2, then R3 (the id), then R1: the store's order, composed once in the core
            token, scope=scope, cluster=self.cluster_id, high_water=effective_mark(own, default_floor),
            resource=self.resource or (lambda: _resource_name(execute)), rule=self.rule, forged=forged,
            fingerprint=None if op_id is None else _TRANSACTION, recorded=recorded,
        )
        if isinstance(decision, Replay):
            assert op_id is not None
            raise AlreadyApplied(scope, op_id, decision.result.token_value)
        if own is None or decision.new_high_water > own:
            execute(_RAISE, (scope, decision.new_high_water))
        elif lock:
            execute(_LOCK, ())
        if op_id is not None:
            seq = execute(_RECORD, (scope, op_id, token.value)).fetchall()[0][0]
            execute(_FORGET, (seq - OPERATION_IDS_MAX,))
        return decision.new_high_water


def _refuse_fence_row(cluster: object, trusted: str, version: object) -> None:
    if cluster != trusted:
        raise InvalidArgument("keys", f"the database is fenced for cluster {cluster}, not {trusted}")
    raise BackendUnavailable(f"fence schema version {version} is not supported", certain_no_effect=True)


def _operation(execute: Any, scope: str, op_id: str) -> int | None:
    """The token value that applied ``op_id`` of ``scope``, or None."""
    try:
        row = execute(_APPLIED, (scope, op_id)).fetchone()
    except Exception as error:  # noqa: BLE001 - sqlite3's, or SQLAlchemy's wrapping of it
        if "no such table" not in str(error):
            raise
        raise InvalidArgument("op_id", "this database's fence predates operation ids: run install() on it "
                                       "again (SQLiteFence does on opening)") from None
    return None if row is None else int(row[0])


def _arguments(
    admission: _Admission, token: object, scope: object, op_id: object = None
) -> tuple[FencingToken, str, str | None]:
    """The validated token, the scope, and why the token's MAC is refused (None: it verified)."""
    checked, forged = admission.check(token)
    if op_id is not None:
        validate_op_id(op_id)
    return checked, checked.scope if scope is None else validate_scope(scope), forged  # a token's scope is valid


def _busy(exc: sqlite3.Error) -> bool:
    """SQLITE_BUSY (another connection holds the write lock, or wrote after this one's snapshot) or SQLITE_LOCKED."""
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


# Whether a WAL connection first tries the quick path (`_Fenced`): False, the control, always the bounded wait.
quick_path = True


class _Fenced:
    """``with`` this: the block's statements as one fenced transaction on a stdlib connection (`fenced`).

    Two ways to the write lock, with the same result: the check and the block under the lock, in one
    transaction.

    - **Quick, in WAL mode:** ``BEGIN`` (deferred), the check's `_READ`, which opens a read snapshot, then the
      raise or `_LOCK`, which take the write lock. Holding a read snapshot, SQLite never waits for the write
      lock: it is taken at once, or refused at once (another connection holds it, or committed since the
      snapshot). Taken, the snapshot is the file's newest, so the mark read is the mark under the lock.
      Refused, the transaction is rolled back and the second way taken. A WAL reader waits for no writer (only for
      another process rebuilding the WAL index after a crash); a reader of a rollback journal waits for a
      committing writer, under SQLite's own busy handler: that mode takes the second way.
    - **Bounded:** ``BEGIN IMMEDIATE``, waiting for the lock until the connection's busy timeout on the
      monotonic clock (`begin_by`), then the check.

    (A class rather than a generator: each nested context manager cost ~1 µs of a fence of a few µs.)
    """

    __slots__ = ("_conn", "_token", "_scope", "_admission", "_durable", "_op_id")

    def __init__(
        self, conn: sqlite3.Connection, token: object, scope: object, admission: _Admission, durable: bool,
        op_id: str | None,
    ) -> None:
        self._conn, self._token, self._scope, self._op_id = conn, token, scope, op_id
        self._admission, self._durable = admission, durable

    def __enter__(self) -> sqlite3.Connection:
        admission, conn, op_id = self._admission, self._conn, self._op_id
        tokens = admission.tokens  # `_arguments`, written out
        checked, forged = admission.check(self._token) if tokens is None else tokens.check(self._token)
        if op_id is not None:
            validate_op_id(op_id)
        scope = checked.scope if self._scope is None else validate_scope(self._scope)  # a token's scope is valid
        if not isinstance(conn, sqlite3.Connection):
            raise InvalidArgument("conn", f"must be a sqlite3.Connection, got {type(conn).__name__}")
        if conn.in_transaction or getattr(conn, "autocommit", True) is False:
            _check_idle(conn)  # refused: the caller's own transaction is never rolled back
        try:
            journal = conn.execute(_JOURNAL).fetchone()[0]  # no lock taken: it waits for nobody
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"cannot read the journal mode: {exc}", certain_no_effect=True) from exc
        if journal not in _JOURNALS:
            _check_settings(journal, _SYNCHRONOUS_FULL, False)  # refused before a transaction begins
        execute = conn.execute
        try:  # in the try: an interrupt raised as a statement returns rolls the transaction back too
            if journal == "wal" and quick_path:  # the quick path (the class docstring)
                try:
                    execute("BEGIN")
                    admission.admit(execute, checked, scope, op_id, forged=forged, journal=journal,
                                    durable=self._durable, lock=True)
                    return conn
                except sqlite3.Error as exc:
                    if not _busy(exc):
                        raise BackendUnavailable(f"cannot read the fence: {exc}", certain_no_effect=True) from exc
                    rollback(conn)  # refused the lock at once: wait for it the bounded way
            _begin(conn)
            try:
                admission.admit(execute, checked, scope, op_id, forged=forged, journal=journal,
                                durable=self._durable)
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"cannot read the fence: {exc}", certain_no_effect=True) from exc
        except BaseException:
            rollback(conn)
            raise
        return conn

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        conn = self._conn
        if exc_type is not None:
            rollback(conn)  # the exception propagates
        elif conn.in_transaction:
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:  # as _commit
                rollback(conn)
                raise BackendUnavailable(f"database commit failed: {exc}") from exc
        else:
            _commit(conn)  # the block ended the transaction itself: refused


def fenced(
    conn: sqlite3.Connection, token: FencingToken | str, *, keys: object = None, cluster_id: str | None = None,
    scope: str | None = None, durable: bool = True, op_id: str | None = None,
) -> Any:
    """``with fenced(conn, token, keys=...):`` the block's statements as one fenced transaction.

    Args:
        conn: a stdlib connection to the user's database (any ``isolation_level``;
            not Python 3.12's ``autocommit=False``), not inside a transaction.
        token: the lease's token (or its encoded string).
        keys: what verifies the token's MAC (``coord.verify_keys()``, a `stockade.keys.KeyFile`,
            `stockade.keys.FixedKeys`, a keyring path, or ``"unsigned"``: no check, unsafe).
        cluster_id: the trusted cluster (default: the keys' cluster).
        scope: the scope the block writes (default: the token's scope).
        durable: require ``synchronous=FULL`` (see the module docstring).
        op_id: the operation's id (1..200 printable ASCII characters, no spaces), or None:
            recorded in the transaction; a retry of one that committed applies nothing (R3).

    Returns:
        A context manager yielding ``conn``; it commits when the block ends.

    Raises:
        AlreadyApplied: ``op_id`` was applied by a committed transaction (even under a token
            that has gone stale since); nothing of this one was applied, the block did not run.
        StaleToken: a token below the scope's mark (nothing applied).
        TokenMismatch: another scope's or cluster's token, or one the keys do not verify.
        InvalidArgument: a malformed token or scope, a connection in a transaction or
            with unsafe settings, a database without `install`.
        BackendUnavailable: SQLite failed (busy past its timeout, disk full, read-only).
    """
    cluster = _cluster_of(keys, cluster_id)
    admission = _Admission(cluster, _verification(keys, cluster), decide, "")  # named when it rejects
    return _Fenced(conn, token, scope, admission, durable, op_id)


def _resource_name(execute: Any) -> str:
    try:
        row = execute("PRAGMA database_list").fetchone()
        return f"sqlite-db:{row[2] or ':memory:'}"
    except Exception:  # noqa: BLE001 - only a name for the log; the rejection itself must go on
        return "sqlite-db"


# -- SQLAlchemy ----------------------------------------------------------------------------------


@contextmanager
def _fenced_sqlalchemy(
    target: Any, token: object, scope: object, admission: _Admission, durable: bool, op_id: str | None = None
) -> Iterator[Any]:
    """SQLAlchemy's pysqlite quirk: its ``begin()`` emits nothing, and the driver begins lazily (DEFERRED) at
    the first DML, too late for the check. So the session's transaction is begun, then ``BEGIN IMMEDIATE`` is
    sent explicitly on its DBAPI connection before any statement; SQLAlchemy's COMMIT/ROLLBACK end it."""
    try:
        from sqlalchemy.engine import Connection
        from sqlalchemy.exc import DBAPIError
        from sqlalchemy.orm import Session
    except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
        raise ImportError("fenced_sqlalchemy needs SQLAlchemy: pip install 'stockade[sqlalchemy]'") from exc
    checked, scope_name, forged = _arguments(admission, token, scope, op_id)
    if not isinstance(target, (Session, Connection)):
        raise InvalidArgument("session_or_connection", f"must be a Session or Connection, not {type(target).__name__}")
    if target.in_transaction():
        raise InvalidArgument("session_or_connection", "already inside a transaction: commit or roll it back first")
    if isinstance(target, Connection) and target.dialect.name != "sqlite":
        raise InvalidArgument("session_or_connection", f"is a {target.dialect.name} connection, not SQLite")
    connection: Connection = target.connection() if isinstance(target, Session) else target
    transaction = None if isinstance(target, Session) else connection.begin()
    try:
        if connection.dialect.name != "sqlite":
            raise InvalidArgument("session_or_connection", f"is a {connection.dialect.name} connection, not SQLite")
        driver = connection.connection.driver_connection
        if not isinstance(driver, sqlite3.Connection):
            raise InvalidArgument("session_or_connection", "needs the pysqlite driver (sqlite3)")
        _check_idle(driver)
        _begin(driver)
        try:
            journal = driver.execute(_JOURNAL).fetchone()[0]
            admission.admit(connection.exec_driver_sql, checked, scope_name, op_id, forged=forged, journal=journal,
                            durable=durable)
        except (sqlite3.Error, DBAPIError) as exc:
            raise BackendUnavailable(f"cannot read the fence: {exc}", certain_no_effect=True) from exc
        yield target
        if not driver.in_transaction and not isinstance(target, Session):
            raise InvalidArgument("session_or_connection", "the block ended the fenced transaction itself")
        if isinstance(target, Session):
            target.commit()
        else:
            assert transaction is not None
            transaction.commit()
    except BaseException:
        if isinstance(target, Session):
            target.rollback()
        elif transaction is not None and transaction.is_active:
            transaction.rollback()
        raise


def fenced_sqlalchemy(
    session_or_connection: Any, token: FencingToken | str, *, keys: object = None, cluster_id: str | None = None,
    scope: str | None = None, durable: bool = True, op_id: str | None = None,
) -> Any:
    """`fenced` for an SQLAlchemy ``Session`` or ``Connection`` on SQLite (pysqlite driver).

    The session or connection must not be inside a transaction; the block's
    statements (and, for a session, its flush) run in one ``BEGIN IMMEDIATE``
    transaction that the block's end commits. Arguments and errors as `fenced`.
    """
    cluster = _cluster_of(keys, cluster_id)
    admission = _Admission(cluster, _verification(keys, cluster), decide, "")  # named when it rejects
    return _fenced_sqlalchemy(session_or_connection, token, scope, admission, durable, op_id)


# -- one database file, opened by path (the floor, the harnesses) --------------------------------


class SQLiteFence:
    """The fence of one user's database file, opened by path: its marks, its floor, fenced transactions.

    Opens its own connection (``synchronous=FULL``; the journal mode is the
    file's own and is left alone) and installs the fence if the file lacks it.

    Args:
        path: the user's database file (created if missing).
        keys: what verifies token MACs (see `fenced`).
        cluster_id: the trusted cluster (default: the keys').
        busy_timeout_ms: how long a transaction waits for the file's write lock.

    Attributes:
        fence_rule: the comparison (`stockade.core.fence.decide`); a seam for the controls.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, keys: object = None, cluster_id: str | None = None,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS_DEFAULT,
    ) -> None:
        self.fence_rule: FenceRule = decide
        timeout_ms = validate_int("busy_timeout_ms", busy_timeout_ms, 0, BUSY_TIMEOUT_MS_MAX)
        self.path = Path(path)
        self.cluster_id = _cluster_of(keys, cluster_id)
        self.resource = f"sqlite-db:{self.path}"
        self._verification = _verification(keys, self.cluster_id)
        self._tokens = VerifiedTokens(self._verification)  # _verified_tokens says what it changes
        self._last_admission: _Admission | None = None
        try:
            self._conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False,
                                         timeout=timeout_ms / 1000)
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"cannot open {self.path}: {exc}", certain_no_effect=True) from exc
        try:
            self._conn.execute("PRAGMA synchronous=FULL")
            install(self._conn, cluster_id=self.cluster_id)
            with _transaction(self._conn), _ours("cannot read the fence"):  # L2, at the opening too
                (verified,) = self._conn.execute(f"SELECT {_VERIFIED}").fetchone()
                _remember(self._conn.execute, self._verification, verified, lambda: self.resource)
        except BaseException:
            self._conn.close()
            raise

    @property
    def connection(self) -> sqlite3.Connection:
        """The fence's own connection (``isolation_level=None``)."""
        return self._conn

    def _admission(self, resource: str | None = None) -> _Admission:
        admission = self._last_admission
        if admission is None or admission.rule is not self.fence_rule or resource is not None:
            admission = _Admission(self.cluster_id, self._verification, self.fence_rule, resource or self.resource,
                                   tokens=self._tokens)
            if resource is None:
                self._last_admission = admission  # the same for every transaction until the rule is swapped
        return admission

    def fenced(
        self, token: FencingToken | str, *, scope: str | None = None, conn: sqlite3.Connection | None = None,
        durable: bool = True, op_id: str | None = None,
    ) -> Any:
        """`fenced` on ``conn`` (default: the fence's own connection), with this fence's keys and rule."""
        admission = self._last_admission
        if admission is None or admission.rule is not self.fence_rule:
            admission = self._admission()
        return _Fenced(self._conn if conn is None else conn, token, scope, admission, durable, op_id)

    def fenced_sqlalchemy(
        self, session_or_connection: Any, token: FencingToken | str, *, scope: str | None = None,
        durable: bool = True, op_id: str | None = None,
    ) -> Any:
        """`fenced_sqlalchemy` with this fence's keys and rule."""
        return _fenced_sqlalchemy(session_or_connection, token, scope, self._admission(), durable, op_id)

    def high_water(self, scope: str) -> int:
        """The scope's mark: its own, or the default floor if higher (0 if never written)."""
        scope = validate_scope(scope)
        row = self._read(_READ, (scope,))[0]
        return max(row[3] or 0, row[1])

    def high_waters(self) -> dict[str, int]:
        """Every scope with a mark of its own, with its effective mark (the default floor applied)."""
        rows = self._read("SELECT scope, high_water FROM stockade_high_water ORDER BY scope", ())
        default = self._read("SELECT default_floor FROM stockade_fence", ())[0][0]
        return {scope: max(value, default) for scope, value in rows}

    def default_floor(self) -> int:
        """The durable floor of every scope without a mark of its own (R4)."""
        return int(self._read("SELECT default_floor FROM stockade_fence", ())[0][0])

    def _read(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"cannot read {self.path}: {exc}", certain_no_effect=True) from exc

    def raise_high_waters(self, floors: Mapping[str, int] | FenceFloors, *, default: int = 0) -> dict[str, int]:
        """Raise marks to a floor (R4), never lower one, in one transaction; the named scopes' marks after.

        Args:
            floors: scope -> floor, or a `FenceFloors` (its ``default`` then joins ``default``).
            default: the durable floor of every scope not named, seen or not.

        Raises:
            InvalidArgument: a bad scope or value (nothing changes).
            BackendUnavailable: SQLite failed (nothing changes).
        """
        if isinstance(floors, FenceFloors):
            default = max(validate_int("default", default, 0, TOKEN_VALUE_MAX), floors.default)
            floors = floors.floors
        checked = check_floors(floors)
        default = validate_int("default", default, 0, TOKEN_VALUE_MAX)
        with _transaction(self._conn), _ours("cannot raise the marks"):
            self._conn.execute("UPDATE stockade_fence SET default_floor = max(default_floor, ?)", (default,))
            self._conn.executemany(_RAISE, sorted(checked.items()))
            (floor,) = self._conn.execute("SELECT default_floor FROM stockade_fence").fetchone()
            marks = {
                scope: max(self._conn.execute(
                    "SELECT high_water FROM stockade_high_water WHERE scope = ?", (scope,)).fetchone()[0], floor)
                for scope in checked
            }
        return marks

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> SQLiteFence:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_floor_target(url: str, *, cluster_id: str) -> SQLiteFence:
    """``sqlite:///path`` of a user's database, opened for the floor (``stockade floor``; R4).

    The floor verifies no token, so no keys are needed. A database without the
    fence (restored from before `install`) gets it; a missing file is refused,
    never created: a typo must not make an empty resource that looks floored.

    Raises:
        InvalidArgument: no path, no file there, or a database fenced for another cluster.
        BackendUnavailable: the file cannot be opened.
    """
    if not isinstance(url, str):
        raise InvalidArgument("resource", f"must be a sqlite:// url, got {type(url).__name__}")
    path = sqlite_path(url, "resource")
    if not path.is_file():
        raise InvalidArgument("resource", f"no SQLite file at {path} (a floor never creates a resource)")
    return SQLiteFence(path, keys=TOKENLESS, cluster_id=cluster_id)
