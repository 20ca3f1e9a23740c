"""stockade's own fenced key-value store, in one SQLite file.

The store keeps, per scope, a high-water mark (HWM): the greatest token value
it has accepted. Every write runs in one ``BEGIN IMMEDIATE`` transaction that
reads the HWM and the write's idempotency record, judges the write with
`stockade.core.fence.check_write` (R2 -> R3 -> R1), and on `Accept` raises the
HWM and applies the write before ``COMMIT`` (R1). A rejected write changes
nothing, is logged and counted by `stockade.resources._observe.reject` (R5),
and raises `StaleToken` or `TokenMismatch` (R2). The file is in WAL mode with
``synchronous=FULL``: a write has reached the disk before it is acknowledged,
so the HWM survives a crash (R4). The file format is in
`stockade.resources.store._sqlite_files`; backup and restore in `stockade.resources.store.backup`.

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
- `TX_WRITES_MAX`: writes in one `transaction`; `TX_BUFFER_BYTES_MAX`: the
  bytes of values it buffers in memory.

Several threads may share one `SQLiteStore` (one connection behind a lock),
and several processes on one host may open the same file: SQLite's write lock
serialises the transactions. Every wait is bounded by ``busy_timeout_ms``, and
no lock is ever held while the caller's code runs: a multi-step `transaction`
buffers its steps and applies them, with the fence check, in one short commit
at the end, so a caller paused inside one stalls nobody.
"""

from __future__ import annotations

import builtins
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stockade.core.errors import BackendUnavailable, InvalidArgument, LimitExceeded, StockadeError, invariant
from stockade.core.fence import FenceRule, Recorded, Replay, decide
from stockade.core.limits import (
    AUDIT_RECORDS_MAX,
    IDEMPOTENCY_KEYS_MAX,
    LIST_PAGE_MAX,
    TX_WRITES_MAX,
    VALUE_BYTES_CEILING,
    VALUE_BYTES_MAX,
    validate_key,
    validate_scope,
)
from stockade.core.limits import (
    STORE_SCOPES_MAX as SCOPES_MAX,
)
from stockade.core.tokens import FencingToken, validate_cluster_id
from stockade.core.values import AuditRecord, BackupInfo, FenceFloors, Item, Op, Write, WriteResult
from stockade.resources._admit import admit, admit_mark
from stockade.resources._inputs import (
    BUSY_TIMEOUT_MS_DEFAULT,
    BUSY_TIMEOUT_MS_MAX,
    check_audit_page,
    check_bounds,
    check_floors_and_default,
    check_page,
    coerce_token,
    make_write,
)
from stockade.resources._tx import Tx
from stockade.resources._verify import Verification, check_keys_given
from stockade.resources.store import backup as _backup
from stockade.resources.store._sqlite_apply import apply_write
from stockade.resources.store._sqlite_files import (
    FileBusy,
    audit_after,
    connect,
    counter,
    default_floor,
    get_item,
    initialise,
    raise_default_floor,
    remember_verifying,
    write_transaction,
)
from stockade.resources.store._sqlite_journal import reject  # _observe.reject, noted in the store's journal
from stockade.resources.store._sqlite_tx import PENDING_SEQ, TX_BUFFER_BYTES_MAX, BufferedUnit, LockedUnit

__all__ = [
    "SQLiteStore", "BatchWrite", "SCOPES_MAX", "AUDIT_RECORDS_MAX", "IDEMPOTENCY_KEYS_MAX", "TX_WRITES_MAX",
    "TX_BUFFER_BYTES_MAX", "PENDING_SEQ", "VALUE_BYTES_CEILING", "BUSY_TIMEOUT_MS_DEFAULT", "BUSY_TIMEOUT_MS_MAX",
]


@dataclass(frozen=True, slots=True)
class BatchWrite:
    """One write of `SQLiteStore.apply_batch`, validated there like `put` / `delete` arguments."""

    op: Op
    scope: str
    key: str
    value: bytes
    token: FencingToken | str
    idempotency_key: str | None = None


class SQLiteStore(Verification):
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
        keys: the coordinator's keys to verify every token's MAC with (a keyring path, `KeyFile`,
            `FixedKeys`, `Keyring`), or ``"unsigned"``: no MAC check (legacy, unsafe: docs/tokens.md).
            None is refused (L2), and so is ``"unsigned"`` on a file once opened with keys.
        issued: the coordinator's last issued token of a scope, where it lives
            in this process: a token above it is refused as forged.

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
        keys: object = None,
        issued: Callable[[str], int] | None = None,
    ) -> None:
        check_keys_given(keys)  # L2, before the disk is touched
        if cluster_id is not None:
            validate_cluster_id(cluster_id, "cluster_id")
        self.value_bytes_max, self.busy_timeout_ms, self.audit_records_max, self.idempotency_keys_max = check_bounds(
            value_bytes_max, busy_timeout_ms, audit_records_max, idempotency_keys_max
        )
        self.path = Path(path)
        # Refuse before touching the disk: opening a missing file would create it.
        if cluster_id is None and not self.path.exists():
            raise InvalidArgument("cluster_id", f"required to create a new store file ({self.path} does not exist)")
        self.resource = f"sqlite-store:{self.path}"
        self._lock = threading.Lock()
        self._owner: int | None = None  # thread id holding _lock (detects re-entry from an open transaction)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn: sqlite3.Connection | None = connect(self.path, self.busy_timeout_ms)
        except (sqlite3.Error, OSError) as exc:
            raise BackendUnavailable(f"cannot open store file {self.path}: {exc}") from exc
        try:
            with self._write() as conn:  # one transaction: refused keys leave the file as it was
                self.cluster_id: str = initialise(conn, self.path, cluster_id)
                self.use_keys(keys, self.cluster_id, issued)
                remember_verifying(conn, f"the store {self.path}", keys)  # L2: once verified, always
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    # -- lifecycle -----------------------------------------------------------------------

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
    def _connection(self, until_s: float | None = None) -> Iterator[sqlite3.Connection]:
        """Hold this object's lock, waited for until ``until_s`` (monotonic; None: busy_timeout_ms); the connection."""
        me = threading.get_ident()
        if self._owner == me:
            # Only this thread can have set _owner to its own id, so this read is race-free.
            raise InvalidArgument("store", "this thread has a transaction open on this store; use its Tx object")
        left_s = self.busy_timeout_ms / 1000 if until_s is None else max(0.0, until_s - time.monotonic())
        if not self._lock.acquire(timeout=left_s):
            raise BackendUnavailable(f"store {self.path} busy: another thread of this process kept it (in, or "
                                     f"waiting for, its transaction) past the {self.busy_timeout_ms} ms bound",
                                     certain_no_effect=True)
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

    # One deadline per write, busy_timeout_ms from its start, for this object's lock and SQLite's together
    # (docs/shard-log.md, "A frozen writer"). False: the control, each waited for busy_timeout_ms anew.
    bounded_waits = True

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction, held from the fence check to the fsync'd COMMIT, begun by one deadline.

        Any exception inside rolls everything back, so a rejected or invalid
        write changes nothing.
        """
        until_s = time.monotonic() + self.busy_timeout_ms / 1000 if self.bounded_waits else None
        with self._connection(until_s) as conn, write_transaction(conn, until_s=until_s) as open_conn:
            yield open_conn

    # -- the fence (R1, R2, R3, R5): the order is core.fence.check_write's -------------------

    # The comparison handed to check_write. An attribute so that the controls in
    # stockade.testing.mutants can swap it, on this adapter or any other.
    fence_rule: FenceRule = staticmethod(decide)

    @staticmethod
    def _high_water(conn: sqlite3.Connection, scope: str) -> int | None:
        """The scope's own row in ``hwm`` (None if it has none)."""
        row = conn.execute("SELECT high_water FROM hwm WHERE scope = ?", (scope,)).fetchone()
        return None if row is None else row[0]

    @staticmethod
    def _mark(conn: sqlite3.Connection, scope: str) -> tuple[int | None, int]:
        """``(row, mark)``: the scope's row (None if none) and its mark (the default floor if none: R4)."""
        row, floor = conn.execute(
            "SELECT (SELECT high_water FROM hwm WHERE scope = ?), "
            "(SELECT value FROM counters WHERE name = 'default_floor')", (scope,),
        ).fetchone()
        return row, (floor or 0) if row is None else row

    def _raise_high_water(self, conn: sqlite3.Connection, scope: str, old: int | None, new: int) -> None:
        # Whatever the fence decided, a mark that would go down means the rule is broken: stop (R4).
        invariant(new >= (old or 0), f"high-water mark of {scope!r} would go down from {old} to {new}")
        if old is None:
            if conn.execute("SELECT COUNT(*) FROM hwm").fetchone()[0] >= SCOPES_MAX:
                raise LimitExceeded("SCOPES_MAX", SCOPES_MAX, f"store holds {SCOPES_MAX} scopes")
            conn.execute("INSERT INTO hwm (scope, high_water) VALUES (?, ?)", (scope, new))
        elif new != old:
            conn.execute("UPDATE hwm SET high_water = ? WHERE scope = ?", (new, scope))

    def _admit(
        self, conn: sqlite3.Connection, token: FencingToken, scope: str, key: str | None, rule: FenceRule
    ) -> int:
        """Check ``token`` against the scope's HWM and raise the HWM; the caller applies in this transaction."""
        old, mark = self._mark(conn, scope)
        new_mark = admit_mark(token, forged=self.forged(token), scope=scope, cluster=self.cluster_id,
                              high_water=mark, resource=self.resource, rule=rule, key=key, refuse=reject)
        self._raise_high_water(conn, scope, old, new_mark)
        return new_mark

    @staticmethod
    def _recorded(conn: sqlite3.Connection, write: Write) -> Recorded | None:
        """What this store remembers under the write's idempotency key (R3), if anything."""
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
        return Recorded(fingerprint, WriteResult(write.scope, key, token_value, high_water, seq, replayed=True))

    def _fenced_write_in(
        self, conn: sqlite3.Connection, write: Write, token: FencingToken, rule: FenceRule
    ) -> WriteResult:
        """R2 -> R3 -> R1 inside the caller's open transaction (its COMMIT makes the write durable)."""
        old, mark = self._mark(conn, write.scope)
        decision = admit(
            token, forged=self.forged(token), scope=write.scope, cluster=self.cluster_id, high_water=mark,
            resource=self.resource, fingerprint=None if write.idempotency_key is None else write.fingerprint(),
            recorded=self._recorded(conn, write), rule=rule, key=write.key, refuse=reject,
        )
        if isinstance(decision, Replay):
            return decision.result
        self._raise_high_water(conn, write.scope, old, decision.new_high_water)
        return self._apply(conn, write, token.value, decision.new_high_water)

    # -- the fence-adapter port (stockade.resources.port.FenceAdapterPort) -------------------

    def write_once(self, write: Write, token: FencingToken, *, rule: FenceRule | None = None) -> WriteResult:
        """Judge and apply one validated write in one IMMEDIATE transaction (see `FenceAdapterPort`)."""
        with self._write() as conn:
            return self._fenced_write_in(conn, write, token, self.fence_rule if rule is None else rule)

    @contextmanager
    def admitted(
        self, token: FencingToken, scope: str, *, rule: FenceRule | None = None
    ) -> Iterator[LockedUnit]:
        """Admit ``token`` for ``scope`` in an IMMEDIATE transaction held until the block ends.

        The SQLite write lock is held from the fence check to the commit: every
        other writer of the file, of any scope, waits (up to its busy timeout)
        while the block runs. Keep the block short and never run caller code in
        it; `transaction` buffers its steps instead and does not use this.
        """
        with self._write() as conn:
            high_water = self._admit(conn, token, scope, None, self.fence_rule if rule is None else rule)
            unit = LockedUnit(self, conn, scope, high_water)
            yield unit
            if unit.failed:
                # A step failed inside SQLite and the caller carried on: commit nothing.
                raise BackendUnavailable("a transaction step failed; rolled back", certain_no_effect=True)

    def raise_high_waters(self, floors: Mapping[str, int] | FenceFloors, *, default: int = 0) -> dict[str, int]:
        """Raise each named scope's mark, and every other's to ``default``, in one transaction (R4)."""
        checked, default = check_floors_and_default(floors, default)
        marks: dict[str, int] = {}
        with self._write() as conn:
            raise_default_floor(conn, default)
            for scope, floor in sorted(checked.items()):
                old, mark = self._mark(conn, scope)
                if floor > mark:
                    self._raise_high_water(conn, scope, old, floor)
                marks[scope] = max(mark, floor)
        return marks

    # -- applying ------------------------------------------------------------------------

    def _apply(self, conn: sqlite3.Connection, write: Write, token_value: int, high_water: int) -> WriteResult:
        """Apply an admitted write: data, audit record, idempotency record. Same transaction."""
        return apply_write(
            conn, write, token_value, high_water,
            audit_records_max=self.audit_records_max, idempotency_keys_max=self.idempotency_keys_max,
        )

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
        write = make_write(scope, key, "put", value, idempotency_key, value_bytes_max=self.value_bytes_max)
        return self.write_once(write, coerce_token(token))

    def delete(
        self, scope: str, key: str, *, token: FencingToken | str, idempotency_key: str | None = None
    ) -> WriteResult:
        """Remove ``(scope, key)`` if ``token`` passes the fence. Deleting a missing key is an accepted write.

        Args, Returns and Raises: as `put`.
        """
        write = make_write(scope, key, "delete", b"", idempotency_key, value_bytes_max=self.value_bytes_max)
        return self.write_once(write, coerce_token(token))

    @contextmanager
    def transaction(self, scope: str, *, token: FencingToken | str) -> Iterator[Tx]:
        """A multi-step write on one scope, fenced and atomic as a whole (R6), holding no lock while it runs.

        The token is checked when the block begins (a stale one raises before
        the body runs). The steps are kept in memory, and reads through the
        `Tx` see them; nothing in the file is locked while the caller's code
        runs, so a paused or slow caller stalls no other writer. When the
        block ends normally, one short write transaction checks the token
        against the mark again and applies every step, or none: if a higher
        token wrote to the scope meanwhile, the commit raises `StaleToken` and
        nothing of the transaction lands (R6: it never interleaves). An
        exception inside the block discards every step.

        Each step's `WriteResult` has ``commit_seq`` `PENDING_SEQ` (0); after
        the commit, ``tx.results`` holds the committed results in step order.

        Args:
            scope: the one scope this transaction writes.
            token: a `FencingToken` or its encoded string.

        Yields:
            A `Tx` with ``put``, ``delete`` and ``get``.

        Raises:
            InvalidArgument, StaleToken, TokenMismatch, BackendUnavailable: as `put`,
                at the start or at the commit.
            LimitExceeded: a step would pass `TX_WRITES_MAX` or `TX_BUFFER_BYTES_MAX`.
        """
        scope = validate_scope(scope)
        fencing_token = coerce_token(token)
        unit = BufferedUnit(self, scope, self._check_now(fencing_token, scope))
        tx = Tx(unit, fencing_token, value_bytes_max=self.value_bytes_max)
        try:
            yield tx
        finally:
            tx.close()
        tx.results = self._commit_buffered(fencing_token, scope, unit.writes)

    def _check_now(self, token: FencingToken, scope: str) -> int:
        """Check ``token`` against the mark in a short read, changing nothing; the mark it would set."""
        with self._read() as conn:
            _, mark = self._mark(conn, scope)
        return admit_mark(token, forged=self.forged(token), scope=scope, cluster=self.cluster_id, high_water=mark,
                          resource=self.resource, rule=self.fence_rule, refuse=reject)

    def _commit_buffered(
        self, token: FencingToken, scope: str, writes: Sequence[Write]
    ) -> builtins.list[WriteResult]:
        """Fence ``token`` again and apply ``writes``, all in one short IMMEDIATE transaction."""
        with self._write() as conn:
            high_water = self._admit(conn, token, scope, None, self.fence_rule)
            return [self._apply(conn, write, token.value, high_water) for write in writes]

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
        return self._apply_batch(writes, wait=True)

    def try_apply_batch(self, writes: Sequence[BatchWrite]) -> builtins.list[WriteResult | StockadeError] | None:
        """`apply_batch` if the store's write lock is free right now, else None at once (nothing done).

        For an event loop, which must never wait on a file lock: another process
        holding the store (a paused writer, a backup) makes this return None, and
        the caller hands the batch to a thread that may wait.
        """
        if not self._lock.acquire(blocking=False):
            return None
        self._lock.release()
        try:
            return self._apply_batch(writes, wait=False)
        except FileBusy:
            return None

    def _apply_batch(self, writes: Sequence[BatchWrite], *, wait: bool) -> builtins.list[WriteResult | StockadeError]:
        results: builtins.list[WriteResult | StockadeError] = []
        with self._connection() as locked, write_transaction(locked, wait_ms=None if wait else 0) as conn:
            for batch_write in writes:
                conn.execute("SAVEPOINT batch_write")
                try:
                    write = make_write(
                        batch_write.scope, batch_write.key, batch_write.op, batch_write.value,
                        batch_write.idempotency_key, value_bytes_max=self.value_bytes_max,
                    )
                    result: WriteResult | StockadeError = self._fenced_write_in(
                        conn, write, coerce_token(batch_write.token), self.fence_rule
                    )
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
            return get_item(conn, scope, key)

    def list(self, scope: str, *, after: str = "", limit: int = LIST_PAGE_MAX) -> builtins.list[Item]:
        """Items of ``scope`` with keys after ``after``, in key order (UTF-8 bytes), at most ``limit``.

        Raises:
            InvalidArgument: bad scope, ``after`` or ``limit`` (1..LIST_PAGE_MAX).
        """
        rows = self._page("key, value, token_value, commit_seq", scope, after, limit)
        return [Item(scope, k, v, t, s) for k, v, t, s in rows]

    def _page(self, columns: str, scope: str, after: str, limit: int) -> builtins.list[tuple[Any, ...]]:
        """One page of ``scope``'s rows in key order, after validating the arguments."""
        scope, after, limit = check_page(scope, after, limit)
        with self._read() as conn:
            return conn.execute(
                f"SELECT {columns} FROM kv WHERE scope = ? AND key > ? ORDER BY key LIMIT ?", (scope, after, limit)
            ).fetchall()

    def high_water(self, scope: str) -> int:
        """The scope's high-water mark; 0 if it was never written."""
        scope = validate_scope(scope)
        with self._read() as conn:
            return self._mark(conn, scope)[1]

    def high_waters(self) -> dict[str, int]:
        """Every scope's own high-water mark (at most `SCOPES_MAX` entries); others have `default_floor`."""
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
        scope, after_seq, limit = check_audit_page(scope, after_seq, limit)
        with self._read() as conn:
            return audit_after(conn, scope, after_seq, limit)

    def default_floor(self) -> int:
        """The mark of every scope not in `high_waters` (0 unless a restore raised it)."""
        with self._read() as conn:
            return default_floor(conn)

    def commit_seq(self) -> int:
        """The ``commit_seq`` of the last accepted write (0 if none)."""
        with self._read() as conn:
            return counter(conn, "commit_seq")

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
        if Path(dest_path).resolve() == self.path.resolve():
            raise InvalidArgument("dest_path", "must not be the store file itself")
        with self._read() as conn:
            return _backup.backup(self.path, conn, dest_path)
