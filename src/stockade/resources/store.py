"""stockade's own fenced key-value store, in one SQLite file.

The store keeps, per scope, a high-water mark (HWM): the greatest token value
it has accepted. Every write runs in one ``BEGIN IMMEDIATE`` transaction that
reads the HWM, judges the token with `stockade.core.fence.decide`, and on
`Accept` raises the HWM and applies the write before ``COMMIT`` (R1). A
rejected write changes nothing, is logged on ``stockade.fence`` and counted in
``stockade_fence_rejections_total`` (R5), and raises `StaleToken` or
`TokenMismatch` (R2). The file is in WAL mode with ``synchronous=FULL``: a
write has reached the disk before it is acknowledged, so the HWM survives a
crash (R4).

Tables (all ``STRICT``)::

    meta         kind, schema_version, cluster_id
    counters     commit_seq, idempotency_keys, audit_pruned_through
    hwm          scope -> high_water
    kv           (scope, key) -> value, token_value, commit_seq
    audit        commit_seq -> scope, key, op, token_value, idempotency_key
    idempotency  (scope, idempotency_key) -> the original WriteResult

``commit_seq`` numbers accepted writes in one total order per store file. It
never goes back and is never reused, also across `restore`.

Bounds (each named below, each a constructor argument that may only be lowered):

- `AUDIT_RECORDS_MAX`: the audit trail keeps the newest N accepted writes and
  prunes older ones in the same transaction. A restore report can only list
  removed writes that are still retained; it says when it is incomplete.
- `IDEMPOTENCY_KEYS_MAX`: the store remembers the newest N idempotency keys
  (by commit order) and forgets older ones in the same transaction. R3 holds
  within that window: a retry of a forgotten key is a new operation. (Forgetting
  only keys below their scope's HWM would not be safe either: a retry made
  after re-acquiring carries a newer token and would apply again.)
- `SCOPES_MAX`: scopes per store (the HWM table, and `high_waters()`, stay bounded).
- `TX_WRITES_MAX`: writes in one `transaction`.

Several threads may share one `SQLiteStore` (one connection behind a lock),
and several processes on one host may open the same file: SQLite's write lock
serialises the transactions. Every wait is bounded by ``busy_timeout_ms``.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from stockade import metrics
from stockade.core.errors import BackendUnavailable, InvalidArgument, LimitExceeded, StockadeError, invariant
from stockade.core.fence import Accept, FenceDecision, Reject, decide, raise_for
from stockade.core.limits import (
    AUDIT_RECORDS_MAX,
    IDEMPOTENCY_KEYS_MAX,
    LIST_PAGE_MAX,
    STORE_SCOPES_MAX as SCOPES_MAX,
    TOKEN_VALUE_MAX,
    TX_WRITES_MAX,
    VALUE_BYTES_CEILING,
    VALUE_BYTES_MAX,
    validate_idempotency_key,
    validate_int,
    validate_key,
    validate_scope,
    validate_value,
)
from stockade.core.tokens import FencingToken, validate_cluster_id

__all__ = [
    "SQLiteStore",
    "BatchWrite",
    "Tx",
    "WriteResult",
    "Item",
    "AuditRecord",
    "BackupInfo",
    "RestoreReport",
    "restore",
    "coerce_token",
    "AUDIT_RECORDS_MAX",
    "IDEMPOTENCY_KEYS_MAX",
    "SCOPES_MAX",
    "TX_WRITES_MAX",
    "VALUE_BYTES_CEILING",
    "BUSY_TIMEOUT_MS_DEFAULT",
    "BUSY_TIMEOUT_MS_MAX",
    "RESTORE_BUSY_TIMEOUT_MS",
]

STORE_KIND = "stockade-store"
SCHEMA_VERSION = "1"
REPORT_FORMAT = "stockade-store-restore-report/1"

BUSY_TIMEOUT_MS_DEFAULT = 5_000
BUSY_TIMEOUT_MS_MAX = 60_000
RESTORE_BUSY_TIMEOUT_MS = 1_000  # how long restore waits for the old store to be idle

Op = Literal["put", "delete"]

_log = logging.getLogger("stockade.fence")

_SCHEMA = """
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
_COUNTERS = ("commit_seq", "idempotency_keys", "audit_pruned_through")


# -- values -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WriteResult:
    """The acknowledgement of an accepted write.

    Attributes:
        scope, key: what was written.
        token_value: the token the write carried.
        high_water: the scope's HWM right after the write (equals ``token_value``).
        commit_seq: the write's position in the store's order of accepted writes.
        replayed: true when an idempotency key matched an earlier write and this
            is that write's original result (nothing was applied now).
    """

    scope: str
    key: str
    token_value: int
    high_water: int
    commit_seq: int
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class Item:
    """A stored value and the write that put it there."""

    scope: str
    key: str
    value: bytes
    token_value: int
    commit_seq: int


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One accepted write, as kept in the audit trail (the checkers' white-box oracle)."""

    commit_seq: int
    scope: str
    key: str
    op: Op
    token_value: int
    idempotency_key: str | None


@dataclass(frozen=True, slots=True)
class BackupInfo:
    """What a backup holds: its last ``commit_seq`` and every scope's HWM."""

    path: Path
    commit_seq: int
    high_waters: dict[str, int]


@dataclass(frozen=True, slots=True)
class RestoreReport:
    """What a restore did (also written as JSON to ``report_path``).

    Attributes:
        removed: acknowledged writes the old store had and the restored one does
            not (retained audit records with ``commit_seq`` beyond the backup's).
        fence_floors: the floor applied per scope (from the coordinator).
        report_path: where the JSON report was written.
    """

    removed: list[AuditRecord]
    fence_floors: dict[str, int]
    report_path: Path


@dataclass(frozen=True, slots=True)
class _Write:
    scope: str
    key: str
    op: Op
    value: bytes
    idempotency_key: str | None

    def fingerprint(self) -> str:
        # What an idempotency key promises to repeat: the operation, not the token
        # (a retry after re-acquiring carries a newer token and must still replay).
        digest = hashlib.sha256(self.op.encode() + b"\0" + self.key.encode() + b"\0" + self.value)
        return digest.hexdigest()


def coerce_token(token: object) -> FencingToken:
    """Accept a `FencingToken` or its encoded string (K1: never an int, a float or a bool).

    Raises:
        InvalidArgument: anything else, or a malformed string.
    """
    if isinstance(token, FencingToken):
        # Rebuild it: the constructor validates, so a token forged past it (object.__setattr__,
        # a subclass) is caught here rather than compared.
        return FencingToken(token.cluster, token.scope, token.value)
    if isinstance(token, str):
        return FencingToken.decode(token)
    raise InvalidArgument("token", f"must be a FencingToken or its encoded string, got {type(token).__name__}")


def _connect(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=busy_timeout_ms / 1000)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
    except sqlite3.Error:
        conn.close()
        raise
    return conn


def _fsync_path(path: Path, *, directory: bool = False) -> None:
    fd = os.open(str(path), os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class BatchWrite:
    """One write of `SQLiteStore.apply_batch`, validated there like `put` / `delete` arguments."""

    op: Op
    scope: str
    key: str
    value: bytes
    token: FencingToken | str
    idempotency_key: str | None = None


# -- the store ----------------------------------------------------------------------------


class SQLiteStore:
    """A fenced key-value store in one SQLite file. Thread-safe; shareable across processes.

    Args:
        path: the database file.
        cluster_id: the coordinator cluster whose tokens this store trusts (R2).
            Required to create a new file; checked against an existing one.
        value_bytes_max: the largest value accepted (at most `VALUE_BYTES_CEILING`).
        busy_timeout_ms: how long an operation waits for the write lock (another
            thread's transaction on this object, or another connection's) before
            failing with `BackendUnavailable` (``certain_no_effect=True``).
        audit_records_max: audit records kept (newest first); at most `AUDIT_RECORDS_MAX`.
        idempotency_keys_max: idempotency keys kept; at most `IDEMPOTENCY_KEYS_MAX`.

    Raises:
        InvalidArgument: bad argument; a new file without ``cluster_id``; a
            ``cluster_id`` that differs from the file's; a file that is not a store.
        BackendUnavailable: the file cannot be opened or has another schema version.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        cluster_id: str | None = None,
        value_bytes_max: int = VALUE_BYTES_MAX,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS_DEFAULT,
        audit_records_max: int = AUDIT_RECORDS_MAX,
        idempotency_keys_max: int = IDEMPOTENCY_KEYS_MAX,
    ) -> None:
        if cluster_id is not None:
            validate_cluster_id(cluster_id, "cluster_id")
        self.value_bytes_max = validate_int("value_bytes_max", value_bytes_max, 0, VALUE_BYTES_CEILING)
        self.busy_timeout_ms = validate_int("busy_timeout_ms", busy_timeout_ms, 0, BUSY_TIMEOUT_MS_MAX)
        self.audit_records_max = validate_int("audit_records_max", audit_records_max, 1, AUDIT_RECORDS_MAX)
        self.idempotency_keys_max = validate_int("idempotency_keys_max", idempotency_keys_max, 1, IDEMPOTENCY_KEYS_MAX)
        self.path = Path(path)
        # Refuse before touching the disk: opening a missing file would create it.
        if cluster_id is None and not self.path.exists():
            raise InvalidArgument("cluster_id", f"required to create a new store file ({self.path} does not exist)")
        self.resource = f"sqlite-store:{self.path}"
        self._lock = threading.Lock()
        self._owner: int | None = None  # thread id holding _lock (detects re-entry from an open transaction)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn: sqlite3.Connection | None = _connect(self.path, self.busy_timeout_ms)
        except (sqlite3.Error, OSError) as exc:
            raise BackendUnavailable(f"cannot open store file {self.path}: {exc}") from exc
        try:
            self.cluster_id: str = self._initialise(cluster_id)
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    # -- lifecycle -----------------------------------------------------------------------

    def _initialise(self, cluster_id: str | None) -> str:
        with self._write() as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "meta" not in tables:
                if tables:
                    raise InvalidArgument("path", f"{self.path} is an SQLite file but not a stockade store")
                if cluster_id is None:
                    raise InvalidArgument("cluster_id", "required to create a new store file")
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.executemany(
                    "INSERT INTO meta (k, v) VALUES (?, ?)",
                    [("kind", STORE_KIND), ("schema_version", SCHEMA_VERSION), ("cluster_id", cluster_id)],
                )
                conn.executemany("INSERT INTO counters (name, value) VALUES (?, 0)", [(n,) for n in _COUNTERS])
                return cluster_id
            meta = _read_meta(conn, self.path)
            if cluster_id is not None and cluster_id != meta["cluster_id"]:
                raise InvalidArgument(
                    "cluster_id", f"{cluster_id!r} differs from the store's cluster {meta['cluster_id']!r}"
                )
            return meta["cluster_id"]

    def close(self) -> None:
        """Close the connection. Idempotent. Waits (bounded) for an open transaction."""
        if not self._lock.acquire(timeout=self.busy_timeout_ms / 1000):
            raise BackendUnavailable("store busy: cannot close while a transaction is open", certain_no_effect=True)
        try:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        finally:
            self._lock.release()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """Hold this object's lock (bounded wait) and hand out the connection."""
        me = threading.get_ident()
        if self._owner == me:
            # Only this thread can have set _owner to its own id, so this read is race-free.
            raise InvalidArgument("store", "this thread has a transaction open on this store; use its Tx object")
        if not self._lock.acquire(timeout=self.busy_timeout_ms / 1000):
            raise BackendUnavailable(
                f"store busy: lock not free within {self.busy_timeout_ms} ms", certain_no_effect=True
            )
        self._owner = me
        try:
            if self._conn is None:
                raise BackendUnavailable("store is closed", certain_no_effect=True)
            yield self._conn
        finally:
            self._owner = None
            self._lock.release()

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._connection() as conn:
            try:
                yield conn
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"store read failed: {exc}", certain_no_effect=True) from exc

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction, held from the fence check to the fsync'd COMMIT.

        Any exception inside rolls everything back, so a rejected or invalid
        write changes nothing.
        """
        with self._connection() as conn:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"store busy or unavailable: {exc}", certain_no_effect=True) from exc
            try:
                yield conn
            except sqlite3.Error as exc:
                rolled_back = _rollback(conn)
                raise BackendUnavailable(f"store write failed: {exc}", certain_no_effect=rolled_back) from exc
            except BaseException:
                _rollback(conn)
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                _rollback(conn)
                raise BackendUnavailable(f"store commit failed: {exc}") from exc

    # -- the fence (R1, R2, R5) ----------------------------------------------------------

    def _decide(self, token: FencingToken, scope: str, high_water: int) -> FenceDecision:
        """The fence rule. One line, so the controls in `stockade.testing.mutants` can break it."""
        return decide(token, cluster=self.cluster_id, scope=scope, high_water=high_water)

    def _reject(self, token: FencingToken, decision: Reject, scope: str, key: str | None) -> None:
        """Make a rejection observable (R5), then raise its typed error."""
        _log.warning(
            "%s rejected a write to scope %r: token %d, high-water mark %d (%s)",
            self.resource, scope, token.value, decision.high_water, decision.reason,
            extra={
                "resource": self.resource,
                "scope": scope,
                "key": key,
                "token": token.encode(),
                "token_value": token.value,
                "high_water": decision.high_water,
                "reason": decision.reason,
            },
        )
        metrics.FENCE_REJECTIONS.inc(scope=scope, reason=decision.reason)
        raise_for(token, decision, cluster=self.cluster_id, scope=scope)

    @staticmethod
    def _high_water(conn: sqlite3.Connection, scope: str) -> int | None:
        row = conn.execute("SELECT high_water FROM hwm WHERE scope = ?", (scope,)).fetchone()
        return None if row is None else row[0]

    def _raise_high_water(self, conn: sqlite3.Connection, scope: str, old: int | None, new: int) -> None:
        # Whatever the fence decided, a mark that would go down means the rule is broken: stop (R4).
        invariant(new >= (old or 0), f"high-water mark of {scope!r} would go down from {old} to {new}")
        if old is None:
            if conn.execute("SELECT COUNT(*) FROM hwm").fetchone()[0] >= SCOPES_MAX:
                raise LimitExceeded("SCOPES_MAX", SCOPES_MAX, f"store holds {SCOPES_MAX} scopes")
            conn.execute("INSERT INTO hwm (scope, high_water) VALUES (?, ?)", (scope, new))
        elif new != old:
            conn.execute("UPDATE hwm SET high_water = ? WHERE scope = ?", (new, scope))

    def _admit(self, conn: sqlite3.Connection, token: FencingToken, scope: str, key: str | None) -> int:
        """Check ``token`` against the scope's HWM and raise the HWM; the caller applies in this transaction."""
        old = self._high_water(conn, scope)
        decision = self._decide(token, scope, old or 0)
        if isinstance(decision, Reject):
            self._reject(token, decision, scope, key)
        invariant(isinstance(decision, Accept), "fence decision is neither Accept nor Reject")
        self._raise_high_water(conn, scope, old, decision.new_high_water)
        return decision.new_high_water

    # -- applying ------------------------------------------------------------------------

    def _next_seq(self, conn: sqlite3.Connection) -> int:
        # fetchall: a RETURNING statement must run to completion before COMMIT.
        rows = conn.execute(
            "UPDATE counters SET value = value + 1 WHERE name = 'commit_seq' RETURNING value"
        ).fetchall()
        return rows[0][0]

    def _apply(self, conn: sqlite3.Connection, write: _Write, token_value: int, high_water: int) -> WriteResult:
        """Apply an admitted write: data, audit record, idempotency record. Same transaction."""
        seq = self._next_seq(conn)
        if write.op == "put":
            conn.execute(
                "INSERT INTO kv (scope, key, value, token_value, commit_seq) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value, "
                "token_value = excluded.token_value, commit_seq = excluded.commit_seq",
                (write.scope, write.key, write.value, token_value, seq),
            )
        else:
            conn.execute("DELETE FROM kv WHERE scope = ? AND key = ?", (write.scope, write.key))
        conn.execute(
            "INSERT INTO audit (commit_seq, scope, key, op, token_value, idempotency_key) VALUES (?, ?, ?, ?, ?, ?)",
            (seq, write.scope, write.key, write.op, token_value, write.idempotency_key),
        )
        if seq > self.audit_records_max:
            pruned_through = seq - self.audit_records_max
            conn.execute("DELETE FROM audit WHERE commit_seq <= ?", (pruned_through,))
            conn.execute(
                "UPDATE counters SET value = max(value, ?) WHERE name = 'audit_pruned_through'", (pruned_through,)
            )
        if write.idempotency_key is not None:
            self._remember(conn, write, token_value, high_water, seq)
        return WriteResult(write.scope, write.key, token_value, high_water, seq, replayed=False)

    def _remember(self, conn: sqlite3.Connection, write: _Write, token_value: int, high_water: int, seq: int) -> None:
        conn.execute(
            "INSERT INTO idempotency (scope, idempotency_key, fingerprint, key, token_value, high_water, commit_seq) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (write.scope, write.idempotency_key, write.fingerprint(), write.key, token_value, high_water, seq),
        )
        count = conn.execute(
            "UPDATE counters SET value = value + 1 WHERE name = 'idempotency_keys' RETURNING value"
        ).fetchall()[0][0]
        if count <= self.idempotency_keys_max:
            return
        # Keep the newest keys: R3 holds within a window of IDEMPOTENCY_KEYS_MAX keys.
        excess = count - self.idempotency_keys_max
        pruned = conn.execute(
            "DELETE FROM idempotency WHERE rowid IN (SELECT rowid FROM idempotency ORDER BY commit_seq LIMIT ?)",
            (excess,),
        ).rowcount
        conn.execute("UPDATE counters SET value = value - ? WHERE name = 'idempotency_keys'", (pruned,))

    @staticmethod
    def _replay(conn: sqlite3.Connection, write: _Write) -> WriteResult | None:
        if write.idempotency_key is None:
            return None
        row = conn.execute(
            "SELECT fingerprint, key, token_value, high_water, commit_seq FROM idempotency "
            "WHERE scope = ? AND idempotency_key = ?",
            (write.scope, write.idempotency_key),
        ).fetchone()
        if row is None:
            return None
        fingerprint, key, token_value, high_water, seq = row
        if fingerprint != write.fingerprint():
            raise InvalidArgument("idempotency_key", "already used in this scope for a different operation")
        return WriteResult(write.scope, key, token_value, high_water, seq, replayed=True)

    def _fenced_write(self, write: _Write, token: FencingToken) -> WriteResult:
        """R1 + R2 + R3 in one IMMEDIATE transaction."""
        with self._write() as conn:
            return self._fenced_write_in(conn, write, token)

    def _fenced_write_in(self, conn: sqlite3.Connection, write: _Write, token: FencingToken) -> WriteResult:
        """R1 + R2 + R3 inside the caller's open transaction (its COMMIT makes the write durable)."""
        old = self._high_water(conn, write.scope)
        decision = self._decide(token, write.scope, old or 0)
        # Provenance first (R2): another cluster's or scope's token learns nothing,
        # not even an earlier result. Staleness after the replay lookup (R3).
        if isinstance(decision, Reject) and decision.reason != "stale":
            self._reject(token, decision, write.scope, write.key)
        replayed = self._replay(conn, write)
        if replayed is not None:
            return replayed
        if isinstance(decision, Reject):
            self._reject(token, decision, write.scope, write.key)
        self._raise_high_water(conn, write.scope, old, decision.new_high_water)
        return self._apply(conn, write, token.value, decision.new_high_water)

    # -- public operations ---------------------------------------------------------------

    def put(
        self, scope: str, key: str, value: bytes | str, *, token: FencingToken | str, idempotency_key: str | None = None
    ) -> WriteResult:
        """Store ``value`` under ``(scope, key)`` if ``token`` passes the fence.

        Args:
            scope: the scope the token was issued for.
            key: 1..1024 bytes of UTF-8, no NUL.
            value: bytes (or str, stored as UTF-8) up to ``value_bytes_max``.
            token: a `FencingToken` or its encoded string.
            idempotency_key: makes a retry return the first result (R3).

        Returns:
            The `WriteResult`; ``replayed=True`` if the idempotency key was already applied.

        Raises:
            InvalidArgument: a bad argument, or an idempotency key reused for a
                different operation. Nothing changed.
            StaleToken: ``token`` is below the scope's HWM. Nothing changed; do not retry (K3).
            TokenMismatch: ``token`` is for another scope or cluster. Nothing changed.
            LimitExceeded: `SCOPES_MAX` reached. Nothing changed.
            BackendUnavailable: SQLite failed or stayed busy; see ``certain_no_effect``.
        """
        write = _Write(
            validate_scope(scope), validate_key(key), "put", validate_value(value, self.value_bytes_max),
            None if idempotency_key is None else validate_idempotency_key(idempotency_key),
        )
        return self._fenced_write(write, coerce_token(token))

    def delete(
        self, scope: str, key: str, *, token: FencingToken | str, idempotency_key: str | None = None
    ) -> WriteResult:
        """Remove ``(scope, key)`` if ``token`` passes the fence. Deleting a missing key is an accepted write.

        Args, Returns and Raises: as `put`.
        """
        write = _Write(
            validate_scope(scope), validate_key(key), "delete", b"",
            None if idempotency_key is None else validate_idempotency_key(idempotency_key),
        )
        return self._fenced_write(write, coerce_token(token))

    @contextmanager
    def transaction(self, scope: str, *, token: FencingToken | str) -> Iterator[Tx]:
        """A multi-step write on one scope, fenced once and atomic as a whole (R6).

        The SQLite write lock is held from the fence check to the commit, so a
        higher token's write waits (up to its busy timeout) and lands after this
        transaction commits, or after it aborts. An exception inside the block
        rolls back every step. Calling the store itself from inside the block,
        on the same thread, raises `InvalidArgument`: use the `Tx`.

        Args:
            scope: the one scope this transaction writes.
            token: a `FencingToken` or its encoded string.

        Yields:
            A `Tx` with ``put``, ``delete`` and ``get``.

        Raises:
            InvalidArgument, StaleToken, TokenMismatch, BackendUnavailable: as `put`.
        """
        scope = validate_scope(scope)
        fencing_token = coerce_token(token)
        with self._write() as conn:
            high_water = self._admit(conn, fencing_token, scope, None)
            tx = Tx(self, scope, fencing_token, high_water, run=lambda fn: fn(conn))
            try:
                yield tx
            finally:
                tx._closed = True
            if tx._failed:
                # A step failed inside SQLite and the caller carried on: commit nothing.
                raise BackendUnavailable("a transaction step failed; rolled back", certain_no_effect=True)

    def apply_batch(self, writes: Sequence[BatchWrite]) -> builtins.list[WriteResult | StockadeError]:
        """Group commit: many fenced writes in one IMMEDIATE transaction, one COMMIT, one fsync.

        Each write is validated and fenced exactly as `put` / `delete` would,
        in order, inside its own SAVEPOINT: a write that is rejected or invalid
        is undone alone and its slot holds the error, while the others commit.
        Nothing is durable (and nothing may be acknowledged) before this returns.

        Returns:
            One slot per write: its `WriteResult`, or the `StockadeError` it raised
            (`InvalidArgument`, `StaleToken`, `TokenMismatch`, `LimitExceeded`, ...).

        Raises:
            BackendUnavailable: BEGIN or COMMIT failed; nothing of the batch is durable.
        """
        results: builtins.list[WriteResult | StockadeError] = []
        with self._write() as conn:
            for batch_write in writes:
                conn.execute("SAVEPOINT batch_write")
                try:
                    write = _Write(
                        validate_scope(batch_write.scope), validate_key(batch_write.key), batch_write.op,
                        b"" if batch_write.op == "delete" else validate_value(batch_write.value, self.value_bytes_max),
                        None if batch_write.idempotency_key is None
                        else validate_idempotency_key(batch_write.idempotency_key),
                    )
                    result: WriteResult | StockadeError = self._fenced_write_in(conn, write, coerce_token(batch_write.token))
                except StockadeError as exc:
                    conn.execute("ROLLBACK TO batch_write")
                    result = exc
                conn.execute("RELEASE batch_write")
                results.append(result)
        return results

    def list_sizes(
        self, scope: str, *, after: str = "", limit: int = LIST_PAGE_MAX
    ) -> builtins.list[tuple[str, int, int, int]]:
        """Like `list`, without the values: ``(key, token_value, commit_seq, size)`` per item.

        Raises:
            InvalidArgument: bad scope, ``after`` or ``limit`` (1..LIST_PAGE_MAX).
        """
        rows = self._page("key, token_value, commit_seq, length(value)", scope, after, limit)
        return [(k, t, c, n) for k, t, c, n in rows]

    def get(self, scope: str, key: str) -> Item | None:
        """The item at ``(scope, key)``, or None.

        Raises:
            InvalidArgument: bad scope or key.
            BackendUnavailable: SQLite failed.
        """
        scope, key = validate_scope(scope), validate_key(key)
        with self._read() as conn:
            return _get(conn, scope, key)

    def list(self, scope: str, *, after: str = "", limit: int = LIST_PAGE_MAX) -> builtins.list[Item]:
        """Items of ``scope`` with keys after ``after``, in key order (UTF-8 bytes), at most ``limit``.

        Raises:
            InvalidArgument: bad scope, ``after`` or ``limit`` (1..LIST_PAGE_MAX).
        """
        rows = self._page("key, value, token_value, commit_seq", scope, after, limit)
        return [Item(scope, k, v, t, s) for k, v, t, s in rows]

    def _page(self, columns: str, scope: str, after: str, limit: int) -> builtins.list[tuple[Any, ...]]:
        """One page of ``scope``'s rows in key order, after validating the arguments."""
        scope = validate_scope(scope)
        if after != "":
            validate_key(after)
        validate_int("limit", limit, 1, LIST_PAGE_MAX)
        with self._read() as conn:
            return conn.execute(
                f"SELECT {columns} FROM kv WHERE scope = ? AND key > ? ORDER BY key LIMIT ?", (scope, after, limit)
            ).fetchall()

    def high_water(self, scope: str) -> int:
        """The scope's high-water mark; 0 if it was never written."""
        scope = validate_scope(scope)
        with self._read() as conn:
            return self._high_water(conn, scope) or 0

    def high_waters(self) -> dict[str, int]:
        """Every scope's high-water mark (at most `SCOPES_MAX` entries)."""
        with self._read() as conn:
            return dict(conn.execute("SELECT scope, high_water FROM hwm ORDER BY scope").fetchall())

    def audit(
        self, scope: str | None = None, *, after_seq: int = 0, limit: int = LIST_PAGE_MAX
    ) -> builtins.list[AuditRecord]:
        """Retained audit records (accepted writes) after ``after_seq``, oldest first.

        Only the newest ``audit_records_max`` writes are retained.

        Args:
            scope: only this scope's records (None: all scopes).
            after_seq: return records with ``commit_seq > after_seq`` (page with the last one seen).
            limit: 1..LIST_PAGE_MAX.
        """
        if scope is not None:
            validate_scope(scope)
        validate_int("after_seq", after_seq, 0, TOKEN_VALUE_MAX)
        validate_int("limit", limit, 1, LIST_PAGE_MAX)
        with self._read() as conn:
            return _audit_after(conn, scope, after_seq, limit)

    def commit_seq(self) -> int:
        """The ``commit_seq`` of the last accepted write (0 if none)."""
        with self._read() as conn:
            return _counter(conn, "commit_seq")

    def backup(self, dest_path: str | os.PathLike[str]) -> BackupInfo:
        """Copy the store, online, to ``dest_path`` (SQLite backup API, one consistent snapshot).

        Other threads of this object wait while the pages are copied; other
        processes keep writing (WAL). The copy is written to ``dest_path.partial``,
        fsync'd and renamed, so ``dest_path`` is either the old file or a full backup.

        Returns:
            `BackupInfo` with the snapshot's ``commit_seq`` and HWMs (read from the copy).

        Raises:
            InvalidArgument: ``dest_path`` is the store itself.
            BackendUnavailable: the copy failed.
        """
        dest = Path(dest_path)
        if dest.resolve() == self.path.resolve():
            raise InvalidArgument("dest_path", "must not be the store file itself")
        partial = dest.with_name(dest.name + ".partial")
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            _remove_database(partial)
            with self._read() as conn:
                _copy_database(self.path, partial, conn)
            info = _inspect_file(partial)
            _fsync_path(partial)
            _remove_side_files(dest)
            os.replace(partial, dest)
            _fsync_path(dest.parent, directory=True)
        except (sqlite3.Error, OSError) as exc:
            raise BackendUnavailable(f"backup to {dest} failed: {exc}") from exc
        return BackupInfo(dest, info.commit_seq, info.high_waters)


class Tx:
    """The steps of one `SQLiteStore.transaction`: one scope, one token, already fenced.

    Attributes:
        scope: the scope of every step.
        token: the token that passed the fence when the transaction began.
        high_water: the scope's HWM after the fence check (the token's value).
    """

    def __init__(
        self, store: SQLiteStore, scope: str, token: FencingToken, high_water: int,
        *, run: Callable[[Callable[[sqlite3.Connection], Any]], Any],
    ) -> None:
        self.scope = scope
        self.token = token
        self.high_water = high_water
        self._store = store
        self._run = run  # executes a step: inside the open transaction (or, in a broken control, outside it)
        self._writes = 0
        self._closed = False
        self._failed = False

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument("transaction", "is closed")

    def _step(self, write: _Write) -> WriteResult:
        self._check_open()
        if self._writes >= TX_WRITES_MAX:
            raise LimitExceeded("TX_WRITES_MAX", TX_WRITES_MAX)
        try:
            result = self._run(lambda conn: self._store._apply(conn, write, self.token.value, self.high_water))
        except sqlite3.Error as exc:
            self._failed = True
            raise BackendUnavailable(f"transaction step failed: {exc}", certain_no_effect=True) from exc
        self._writes += 1
        return result

    def put(self, key: str, value: bytes | str) -> WriteResult:
        """Write ``value`` at ``key`` (visible to later steps; durable at commit).

        Raises:
            InvalidArgument: bad key or value, or the transaction is closed. This step changed nothing.
            LimitExceeded: `TX_WRITES_MAX` steps already.
        """
        write = _Write(self.scope, validate_key(key), "put", validate_value(value, self._store.value_bytes_max), None)
        return self._step(write)

    def delete(self, key: str) -> WriteResult:
        """Remove ``key``. Raises as `put`."""
        return self._step(_Write(self.scope, validate_key(key), "delete", b"", None))

    def get(self, key: str) -> Item | None:
        """Read ``key`` as this transaction sees it (its own steps included)."""
        key = validate_key(key)
        self._check_open()
        try:
            return self._run(lambda conn: _get(conn, self.scope, key))
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"transaction read failed: {exc}", certain_no_effect=True) from exc


# -- helpers shared by the store and restore ----------------------------------------------


def _rollback(conn: sqlite3.Connection) -> bool:
    """Roll back if a transaction is open; True if nothing of it remains."""
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        return True
    except sqlite3.Error:
        return False


def _get(conn: sqlite3.Connection, scope: str, key: str) -> Item | None:
    row = conn.execute(
        "SELECT value, token_value, commit_seq FROM kv WHERE scope = ? AND key = ?", (scope, key)
    ).fetchone()
    return None if row is None else Item(scope, key, row[0], row[1], row[2])


def _counter(conn: sqlite3.Connection, name: str) -> int:
    row = conn.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
    invariant(row is not None, f"store counter {name!r} missing")
    return row[0]


def _audit_after(conn: sqlite3.Connection, scope: str | None, after_seq: int, limit: int) -> list[AuditRecord]:
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


def _read_meta(conn: sqlite3.Connection, path: Path) -> dict[str, str]:
    meta = dict(conn.execute("SELECT k, v FROM meta").fetchall())
    if meta.get("kind") != STORE_KIND:
        raise InvalidArgument("path", f"{path} is not a stockade store file (kind {meta.get('kind')!r})")
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise BackendUnavailable(f"{path}: store schema version {meta.get('schema_version')!r} is not supported")
    return meta


@dataclass(frozen=True, slots=True)
class _FileInfo:
    cluster_id: str
    commit_seq: int
    audit_pruned_through: int
    high_waters: dict[str, int]


def _inspect_file(path: Path) -> _FileInfo:
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "meta" not in tables:
            raise InvalidArgument("path", f"{path} is not a stockade store file")
        meta = _read_meta(conn, path)
        return _FileInfo(
            meta["cluster_id"],
            _counter(conn, "commit_seq"),
            _counter(conn, "audit_pruned_through"),
            dict(conn.execute("SELECT scope, high_water FROM hwm").fetchall()),
        )
    finally:
        conn.close()


def _remove_side_files(path: Path) -> None:
    """Remove a database's WAL, shared-memory and journal files (a stale WAL must never meet a new file)."""
    for suffix in ("-wal", "-shm", "-journal"):
        try:
            os.remove(f"{path}{suffix}")
        except FileNotFoundError:
            pass


def _remove_database(path: Path) -> None:
    """Remove a database file and its side files."""
    _remove_side_files(path)
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _copy_database(source_path: Path, target_path: Path, source: sqlite3.Connection | None = None) -> None:
    """Copy a database with the SQLite backup API into a self-contained file (rollback journal, no WAL)."""
    own_source = source is None
    if own_source:
        source = sqlite3.connect(str(source_path), isolation_level=None)
    try:
        target = sqlite3.connect(str(target_path), isolation_level=None)
        try:
            source.backup(target)  # pages=-1: every page in one step, under one read snapshot
            target.execute("PRAGMA journal_mode=DELETE")
        finally:
            target.close()
    finally:
        if own_source:
            source.close()


# -- restore (R4) ---------------------------------------------------------------------------


def restore(
    backup_path: str | os.PathLike[str],
    store_path: str | os.PathLike[str],
    *,
    fence_floors: Callable[[str], int] | Mapping[str, int],
    report_path: str | os.PathLike[str],
) -> RestoreReport:
    """Put a backup in place of a store, with fence floors, and report what was lost.

    An offline operation: no process may have ``store_path`` open (one that
    does would keep writing to the replaced file).

    Steps: copy the backup to a temporary file; read the old store (if any) for
    its last ``commit_seq``, HWMs and the audit records after the backup's
    ``commit_seq``; set each scope's HWM to the maximum of the backup's HWM, the
    fence floor, and the old store's HWM; continue ``commit_seq`` after the
    greater of the old and the backup's (never reused); write the JSON report
    (before the store is replaced, so a crash never leaves a silent rollback);
    then atomically rename the copy over the store.

    Scopes that get a floor: every scope in the backup, every scope of the old
    store, and for a Mapping every scope in it. If the old store is missing,
    scopes created after the backup are known only from a Mapping: pass the
    coordinator's full list (e.g. from ``SQLiteCoordinator.scopes``).

    The report lists only removed writes still in the old store's audit trail
    (its newest ``audit_records_max``); ``removed_complete`` says whether that is all.

    Args:
        backup_path: a file written by `SQLiteStore.backup`.
        store_path: the store to replace (may be missing).
        fence_floors: the coordinator's last issued token per scope, as a
            callable or a mapping (missing scopes: 0).
        report_path: where to write the JSON report.

    Returns:
        The `RestoreReport`.

    Raises:
        InvalidArgument: the backup is not a store; the old store belongs to another
            cluster; a floor is not in 0..2**63-1; paths collide. Nothing changed.
        BackendUnavailable: I/O failed (the old store is unchanged unless the final
            rename happened).
    """
    backup, store, report_file = Path(backup_path), Path(store_path), Path(report_path)
    if backup.resolve() == store.resolve():
        raise InvalidArgument("backup_path", "must differ from store_path")
    if report_file.resolve() in (backup.resolve(), store.resolve()):
        raise InvalidArgument("report_path", "must differ from the backup and the store")
    if not backup.is_file():
        raise InvalidArgument("backup_path", f"{backup} does not exist")
    if not callable(fence_floors) and not isinstance(fence_floors, Mapping):
        raise InvalidArgument("fence_floors", "must be a callable or a mapping of scope to token value")
    staging = store.with_name(store.name + ".restoring")
    try:
        _remove_database(staging)
        _copy_database(backup, staging)
        backup_info = _inspect_file(staging)
        old = _read_old_store(store, backup_info.commit_seq)
        if old.get("cluster_id") not in (None, backup_info.cluster_id):
            raise InvalidArgument(
                "backup_path", f"backup is of cluster {backup_info.cluster_id}, the store of {old['cluster_id']}"
            )
        old_high_waters: dict[str, int] = old.pop("high_waters", {})
        scopes = set(backup_info.high_waters) | set(old_high_waters)
        if isinstance(fence_floors, Mapping):
            scopes |= {validate_scope(s, "fence_floors") for s in fence_floors}
        floors: dict[str, int] = {}
        for scope in sorted(scopes):
            raw = fence_floors.get(scope, 0) if isinstance(fence_floors, Mapping) else fence_floors(scope)
            floors[scope] = validate_int(f"fence_floors[{scope}]", raw, 0, TOKEN_VALUE_MAX)
        after = {
            s: max(backup_info.high_waters.get(s, 0), floors[s], old_high_waters.get(s, 0)) for s in sorted(scopes)
        }
        next_seq_base = max(backup_info.commit_seq, old.get("commit_seq", 0))
        _apply_restore(staging, after, next_seq_base)
        removed = [AuditRecord(**r) for r in old.pop("removed", [])]
        report = {
            "format": REPORT_FORMAT,
            "store_path": str(store),
            "backup_path": str(backup),
            "cluster_id": backup_info.cluster_id,
            "backup_commit_seq": backup_info.commit_seq,
            "old_store": old,
            "removed": [asdict(r) for r in removed],
            "removed_complete": old.pop("removed_complete"),
            "fence_floors": floors,
            "high_waters_backup": dict(sorted(backup_info.high_waters.items())),
            "high_waters_after": after,
            "commit_seq_after": next_seq_base,
        }
        _write_json_atomically(report_file, report)
        _fsync_path(staging)
        # The old WAL was checkpointed when read; left in place it would be replayed into the new file.
        _remove_side_files(store)
        os.replace(staging, store)
        _fsync_path(store.parent, directory=True)
    except (sqlite3.Error, OSError) as exc:
        raise BackendUnavailable(f"restore of {store} from {backup} failed: {exc}") from exc
    finally:
        _remove_database(staging)
    return RestoreReport(removed=removed, fence_floors=floors, report_path=report_file)


def _read_old_store(store: Path, backup_seq: int) -> dict[str, Any]:
    """What the store being replaced knows: cluster, last seq, HWMs, writes after ``backup_seq``."""
    if not store.exists():
        return {"state": "missing", "removed_complete": False,
                "note": "old store file missing: removed writes unknown; commit_seq continues after the backup's"}
    try:
        # A short busy wait: a store that stays locked is in use, and restore is offline.
        conn = sqlite3.connect(str(store), isolation_level=None, timeout=RESTORE_BUSY_TIMEOUT_MS / 1000)
        try:
            # Fold the WAL into the main file first: restore deletes the WAL later. A busy
            # checkpoint means someone is using the store, and restore is offline.
            busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()[0][0]
            if busy:
                raise BackendUnavailable(f"{store} is in use; close it everywhere before restoring",
                                         certain_no_effect=True)
            meta = _read_meta(conn, store)
            seq = _counter(conn, "commit_seq")
            pruned_through = _counter(conn, "audit_pruned_through")
            removed = []
            cursor = backup_seq
            while True:  # bounded: the audit trail holds at most AUDIT_RECORDS_MAX rows
                page = _audit_after(conn, None, cursor, LIST_PAGE_MAX)
                removed.extend(asdict(r) for r in page)
                if len(page) < LIST_PAGE_MAX:
                    break
                cursor = page[-1].commit_seq
            high_waters = dict(conn.execute("SELECT scope, high_water FROM hwm").fetchall())
        finally:
            conn.close()
    except sqlite3.Error as exc:
        # Corrupt or unreadable (a reason to restore). A file that is readable but
        # not a store raised InvalidArgument above: never replace someone else's file.
        return {"state": "unreadable", "error": str(exc), "removed_complete": False,
                "note": "old store unreadable: removed writes unknown; commit_seq continues after the backup's"}
    return {
        "state": "present",
        "cluster_id": meta["cluster_id"],
        "commit_seq": seq,
        "audit_pruned_through": pruned_through,
        "removed_complete": pruned_through <= backup_seq,
        "removed": removed,
        "high_waters": high_waters,
    }


def _apply_restore(staging: Path, high_waters: dict[str, int], seq_base: int) -> None:
    conn = _connect(staging, BUSY_TIMEOUT_MS_DEFAULT)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO hwm (scope, high_water) VALUES (?, ?) "
            "ON CONFLICT (scope) DO UPDATE SET high_water = max(high_water, excluded.high_water)",
            list(high_waters.items()),
        )
        # Seqs up to the old store's were used (and are gone with it): never reuse one.
        conn.execute("UPDATE counters SET value = max(value, ?) WHERE name = 'commit_seq'", (seq_base,))
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except BaseException:
        _rollback(conn)
        raise
    finally:
        conn.close()


def _write_json_atomically(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
    _fsync_path(path.parent, directory=True)
