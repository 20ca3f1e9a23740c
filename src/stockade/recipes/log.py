"""A fenced, append-only log per shard (docs/shard-log.md).

A shard is a scope: its one writer holds the scope's lease and carries the
lease's token on every append. An append is judged by the one fence rule
(`stockade.core.fence.check_write`: forged, then R2, then the idempotency
record, then R1) in the same transaction that reads the shard's next offset,
writes the entries at consecutive offsets and moves the next offset on:

- an append whose token is below the shard's high-water mark is refused
  (`StaleToken`, counted and logged by `stockade.resources._observe.reject`, R5)
  and writes nothing; a forged token or one of another scope or cluster is
  refused the same way (`TokenMismatch`);
- offsets are 0, 1, 2, ... with no gap: a refused, failed or killed append
  rolls back with its transaction, the next offset included;
- a writer that retries after an unknown outcome (a timeout, a lost
  connection) passes the same **idempotency key**: if the first try landed,
  the retry returns its offsets (``replayed=True``) and appends nothing, even
  if a newer writer has raised the mark since (R3). ``expected_offset`` makes
  an append conditional instead (`OffsetConflict` if the shard moved on);
- readers tail a shard with ``read(shard, from_offset, limit, wait_ms=...)``.

Two backends share this contract and the conformance tests:

- `SQLiteShardLog`: in stockade's own store file (`stockade.resources.store.sqlite_store`),
  in the same ``BEGIN IMMEDIATE`` transaction as the store's high-water mark;
  ``stockade floor sqlite:///path`` raises its marks (R4). SQLite has one writer per
  file and a writer frozen inside an append keeps the file's lock: ``partitions=N``
  spreads the shards over N files so that it holds up only its own file's shards
  (docs/shard-log.md, "A frozen writer").
- `PostgresShardLog` (`open_postgres_log`): in the user's PostgreSQL, behind
  the SQL function ``stockade.fence(token, scope)`` of
  `stockade.resources.postgres`, in the same transaction; ``stockade floor
  postgresql://...`` raises its marks (R4).

Bounds: `ENTRY_BYTES_MAX` per entry, `BATCH_ENTRIES_MAX` / `BATCH_BYTES_MAX`
per append, `READ_LIMIT_MAX` per read, `READ_WAIT_MS_MAX` per wait; a store
file holds at most `stockade.resources.store.sqlite_store.SCOPES_MAX` shards.
Entries are kept until the store is deleted: the log is never truncated.
"""

from __future__ import annotations

import builtins
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stockade.core.errors import BackendUnavailable, InvalidArgument, invariant
from stockade.core.fence import Replay
from stockade.core.limits import validate_int, validate_scope
from stockade.core.tokens import FencingToken
from stockade.recipes._log_common import (
    BATCH_BYTES_MAX,
    BATCH_ENTRIES_MAX,
    ENTRY_BYTES_CEILING,
    ENTRY_BYTES_MAX,
    READ_LIMIT_MAX,
    READ_WAIT_MS_MAX,
    AppendResult,
    LogEntry,
    OffsetConflict,
    check_batch,
    check_read,
    fingerprint,
    recorded,
    wait_for_entries,
)
from stockade.resources._admit import admit
from stockade.resources._inputs import BUSY_TIMEOUT_MS_DEFAULT, BUSY_TIMEOUT_MS_MAX, coerce_token
from stockade.resources.store._sqlite_files import write_transaction
from stockade.resources.store._sqlite_journal import reject as journal_reject
from stockade.resources.store.sqlite_store import SQLiteStore

if TYPE_CHECKING:
    from stockade.recipes._log_postgres import PostgresShardLog

__all__ = [
    "SQLiteShardLog", "PostgresShardLog", "open_postgres_log", "LogEntry", "AppendResult", "OffsetConflict",
    "ENTRY_BYTES_MAX", "ENTRY_BYTES_CEILING", "BATCH_ENTRIES_MAX", "BATCH_BYTES_MAX", "READ_LIMIT_MAX",
    "READ_WAIT_MS_MAX", "PARTITIONS_MAX", "partition_of",
]

#: The most partition files a log may be spread over (docs/shard-log.md, "A frozen writer").
PARTITIONS_MAX = 256

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS log_heads (shard TEXT PRIMARY KEY, next_offset INTEGER NOT NULL "
    "CHECK (next_offset >= 0)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS log_entries (shard TEXT NOT NULL, log_offset INTEGER NOT NULL, "
    "token_value INTEGER NOT NULL, data BLOB NOT NULL, idempotency_key TEXT, batch_count INTEGER, "
    "fingerprint TEXT, PRIMARY KEY (shard, log_offset)) WITHOUT ROWID",
    "CREATE UNIQUE INDEX IF NOT EXISTS log_entries_idempotency ON log_entries (shard, idempotency_key) "
    "WHERE idempotency_key IS NOT NULL",
    "CREATE TABLE IF NOT EXISTS log_layout (k TEXT PRIMARY KEY, v INTEGER NOT NULL) WITHOUT ROWID",
)


_operation = threading.local()  # until_s: the monotonic deadline of this thread's operation on a log


@contextmanager
def _within(bound_ms: int) -> Iterator[None]:
    """Every wait of this thread inside the block ends ``bound_ms`` after it began (the outermost block's)."""
    if getattr(_operation, "until_s", None) is not None:
        yield
        return
    _operation.until_s = time.monotonic() + bound_ms / 1000
    try:
        yield
    finally:
        _operation.until_s = None


def partition_of(shard: str, partitions: int) -> int:
    """The partition file (0..partitions-1) that holds ``shard``: crc32 of its name, modulo ``partitions``."""
    return zlib.crc32(shard.encode()) % partitions


def _partition_path(path: Path, index: int) -> Path:
    return path.with_name(f"{path.name}.part{index:03d}")


class SQLiteShardLog(SQLiteStore):
    """Fenced shard logs in stockade's store file (the store's own key-value API stays usable beside them).

    Thread-safe, and several processes on one host may open the same file.

    Args:
        path, cluster_id, busy_timeout_ms, keys, issued: as `SQLiteStore`. ``busy_timeout_ms`` is one
            deadline per operation, on the monotonic clock: an append's waits (for this object, for its
            partition file's opening, for the file's write lock) end within it, then it raises
            `BackendUnavailable` (``certain_no_effect``; the message names the file and what holds it).
        entry_bytes_max: the largest entry accepted (at most `ENTRY_BYTES_CEILING`).
        partitions: spread the shards over this many files (1..`PARTITIONS_MAX`), ``PATH.part000``
            and on (`partition_of`), so that a writer frozen inside an append holds up only the
            shards of its own file; a partition file is opened when a shard of it is first used.
            Recorded in the file when it is created; ``None`` (the default) opens an existing file
            with its recorded layout and creates a new one with 1 (one file).

    Raises:
        InvalidArgument, BackendUnavailable: as `SQLiteStore`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        cluster_id: str | None = None,
        entry_bytes_max: int = ENTRY_BYTES_MAX,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS_DEFAULT,
        keys: object = None,
        issued: Callable[[str], int] | None = None,
        partitions: int | None = None,
    ) -> None:
        self.entry_bytes_max = validate_int("entry_bytes_max", entry_bytes_max, 0, ENTRY_BYTES_CEILING)
        wanted = None if partitions is None else validate_int("partitions", partitions, 1, PARTITIONS_MAX)
        bound_ms = validate_int("busy_timeout_ms", busy_timeout_ms, 0, BUSY_TIMEOUT_MS_MAX)
        with _within(bound_ms):  # every transaction of the opening, within one bound
            super().__init__(path, cluster_id=cluster_id, busy_timeout_ms=bound_ms, keys=keys, issued=issued)
            self.resource = f"sqlite-log:{self.path}"
            self._parts: builtins.list[SQLiteShardLog | None] = []
            self._part_options: dict[str, Any] = {"cluster_id": self.cluster_id, "entry_bytes_max": entry_bytes_max,
                                  "busy_timeout_ms": bound_ms, "keys": keys, "issued": issued}
            try:
                with self._write() as conn:
                    for statement in _SCHEMA:
                        conn.execute(statement)
                    self.partitions, created = self._layout(conn, wanted)
                if self.partitions > 1:
                    self._parts = [None] * self.partitions
                    self._part_locks = [threading.Lock() for _ in range(self.partitions)]
                    if created or not self.lazy_partitions:  # a new log makes its files now; an old one on use
                        self._every_part()
            except BaseException:
                self.close()
                raise

    # A partition file is opened (which writes to it: its schema is checked in a write transaction) when a
    # shard of it is first used, so a writer frozen in one file does not keep a new process from opening the
    # log and using the others. False: the control, every file opened with the log (as before).
    lazy_partitions = True

    @contextmanager
    def _write(self) -> Iterator[Any]:
        """The store's write transaction, begun by the deadline of the whole operation (`_within`) if one is set."""
        until_s = getattr(_operation, "until_s", None)
        if until_s is None or not self.bounded_waits:
            with super()._write() as conn:
                yield conn
            return
        with self._connection(until_s) as conn, write_transaction(conn, until_s=until_s) as open_conn:
            yield open_conn

    def _open_part(self, index: int) -> SQLiteShardLog:
        """Partition file ``index``, opened now if it is not yet (within the deadline of the operation)."""
        part = self._parts[index]
        if part is not None:
            return part
        until_s = getattr(_operation, "until_s", None)
        left_s = self.busy_timeout_ms / 1000 if until_s is None else max(0.0, until_s - time.monotonic())
        if not self._part_locks[index].acquire(timeout=left_s):
            raise BackendUnavailable(f"{_partition_path(self.path, index)}: another thread of this process is "
                                     f"opening it past the {self.busy_timeout_ms} ms bound", certain_no_effect=True)
        try:
            part = self._parts[index]
            if part is None:
                part = SQLiteShardLog(_partition_path(self.path, index), partitions=1, **self._part_options)
                self._parts[index] = part
            return part
        finally:
            self._part_locks[index].release()

    def _every_part(self) -> builtins.list[SQLiteShardLog]:
        return [self._open_part(index) for index in range(len(self._parts))]

    @staticmethod
    def _layout(conn: Any, wanted: int | None) -> tuple[int, bool]:
        """The recorded number of partition files, and whether it was recorded now (a file that had none)."""
        row = conn.execute("SELECT v FROM log_layout WHERE k = 'partitions'").fetchone()
        if row is None:
            used = conn.execute("SELECT count(*) FROM log_heads").fetchone()[0]
            if used and (wanted or 1) != 1:  # an older single-file log: its shards stay where they are
                raise InvalidArgument("partitions", f"this log already holds {used} shards in one file; "
                                      "partitions apply to a new log (docs/shard-log.md, moving a log)")
            conn.execute("INSERT INTO log_layout (k, v) VALUES ('partitions', ?)", (wanted or 1,))
            return wanted or 1, True
        if wanted is not None and wanted != int(row[0]):
            raise InvalidArgument("partitions", f"this log was created with {row[0]} partitions, not {wanted}")
        return int(row[0]), False

    def _part(self, shard: str) -> SQLiteShardLog:
        return self._open_part(partition_of(shard, self.partitions)) if self._parts else self

    def close(self) -> None:
        """Close the file and its partition files. Idempotent."""
        for part in self._parts:
            if part is not None:
                part.close()
        super().close()

    def append(
        self, shard: str, data: bytes | str, *, token: FencingToken | str, idempotency_key: str | None = None,
        expected_offset: int | None = None,
    ) -> AppendResult:
        """Append one entry to ``shard`` if ``token`` passes the fence; `append_batch` of one."""
        return self.append_batch(shard, [data], token=token, idempotency_key=idempotency_key,
                                 expected_offset=expected_offset)

    def append_batch(
        self, shard: str, entries: Sequence[bytes | str], *, token: FencingToken | str,
        idempotency_key: str | None = None, expected_offset: int | None = None,
    ) -> AppendResult:
        """Append ``entries`` at consecutive offsets, all or none, in one transaction.

        Args:
            shard: the shard (the token's scope).
            entries: 1..`BATCH_ENTRIES_MAX` entries of bytes (str: UTF-8).
            token: the writer's lease token (a `FencingToken` or its encoded string).
            idempotency_key: binds this append: a retry with the same key and entries
                returns the first try's offsets and appends nothing.
            expected_offset: append only if the shard's next offset is this one.

        Returns:
            `AppendResult` (durable: the commit was fsync'd).

        Raises:
            StaleToken: the token is below the shard's mark (do not retry: K3). Nothing appended.
            TokenMismatch: a forged token, or one of another shard or cluster. Nothing appended.
            OffsetConflict: ``expected_offset`` is not the next offset. Nothing appended.
            InvalidArgument: a bad argument, or the key used before for other entries.
            LimitExceeded: an entry, the batch, or the store's shards above their bound.
            BackendUnavailable: SQLite failed or stayed busy (see ``certain_no_effect``).
        """
        shard = validate_scope(shard, "shard")
        if self._parts:
            with _within(self.busy_timeout_ms):  # opening the shard's file and appending: one bound
                return self._part(shard).append_batch(shard, entries, token=token, idempotency_key=idempotency_key,
                                                      expected_offset=expected_offset)
        checked, key, expected = check_batch(entries, idempotency_key, expected_offset,
                                             entry_bytes_max=self.entry_bytes_max)
        fencing_token = coerce_token(token)
        print_ = fingerprint(checked)
        with self._write() as conn:
            row = conn.execute("SELECT next_offset FROM log_heads WHERE shard = ?", (shard,)).fetchone()
            next_offset = 0 if row is None else int(row[0])
            old, mark = self._mark(conn, shard)
            earlier = None if key is None else conn.execute(
                "SELECT log_offset, token_value, batch_count, fingerprint FROM log_entries "
                "WHERE shard = ? AND idempotency_key = ?", (shard, key)).fetchone()
            decision = admit(
                fencing_token, forged=self.forged(fencing_token), scope=shard, cluster=self.cluster_id,
                high_water=mark, resource=self.resource, fingerprint=None if key is None else print_,
                recorded=None if earlier is None or key is None else recorded(
                    shard, key, earlier[0], earlier[1], mark, earlier[3]),
                rule=self.fence_rule, refuse=journal_reject,
            )
            if isinstance(decision, Replay):
                assert earlier is not None
                return AppendResult(shard, earlier[0], earlier[2], earlier[1], mark, replayed=True)
            if expected is not None and expected != next_offset:
                raise OffsetConflict(shard, expected, next_offset)
            self._raise_high_water(conn, shard, old, decision.new_high_water)
            last = conn.execute("SELECT max(log_offset) FROM log_entries WHERE shard = ?", (shard,)).fetchone()[0]
            invariant((-1 if last is None else last) == next_offset - 1,
                      f"shard {shard!r}: next offset {next_offset} but last entry {last}")
            conn.executemany(
                "INSERT INTO log_entries (shard, log_offset, token_value, data, idempotency_key, batch_count, "
                "fingerprint) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(shard, next_offset + i, fencing_token.value, entry,
                  key if i == 0 else None, len(checked) if i == 0 else None, print_ if i == 0 else None)
                 for i, entry in enumerate(checked)],
            )
            conn.execute("INSERT INTO log_heads (shard, next_offset) VALUES (?, ?) ON CONFLICT (shard) "
                         "DO UPDATE SET next_offset = excluded.next_offset", (shard, next_offset + len(checked)))
            return AppendResult(shard, next_offset, len(checked), fencing_token.value, decision.new_high_water)

    def read(self, shard: str, from_offset: int = 0, limit: int = 100, *, wait_ms: int = 0) -> builtins.list[LogEntry]:
        """Entries of ``shard`` from ``from_offset`` on, in offset order, at most ``limit``.

        Args:
            wait_ms: if there is none yet, wait up to this long for one (0..`READ_WAIT_MS_MAX`).

        Returns:
            The entries (empty if none came within ``wait_ms``).

        Raises:
            InvalidArgument: a bad shard, offset, limit (1..`READ_LIMIT_MAX`) or wait.
        """
        shard = validate_scope(shard, "shard")
        if self._parts:
            return self._part(shard).read(shard, from_offset, limit, wait_ms=wait_ms)
        start, count, wait = check_read(from_offset, limit, wait_ms)

        def once() -> builtins.list[LogEntry]:
            with self._read() as conn:
                rows = conn.execute(
                    "SELECT log_offset, token_value, data FROM log_entries WHERE shard = ? AND log_offset >= ? "
                    "ORDER BY log_offset LIMIT ?", (shard, start, count)).fetchall()
            return [LogEntry(shard, o, t, bytes(d)) for o, t, d in rows]

        return wait_for_entries(once, wait)

    def next_offset(self, shard: str) -> int:
        """The offset ``shard``'s next entry gets (0 for a shard never appended to)."""
        shard = validate_scope(shard, "shard")
        if self._parts:
            return self._part(shard).next_offset(shard)
        with self._read() as conn:
            row = conn.execute("SELECT next_offset FROM log_heads WHERE shard = ?", (shard,)).fetchone()
        return 0 if row is None else int(row[0])

    def shards(self) -> builtins.list[str]:
        """The shards appended to (at most `SCOPES_MAX` per file), in name order."""
        if self._parts:
            return sorted(shard for part in self._every_part() for shard in part.shards())
        with self._read() as conn:
            return [r[0] for r in conn.execute("SELECT shard FROM log_heads ORDER BY shard").fetchall()]

    # The marks (R4) of a partitioned log are its partition files' (each shard's in its own file);
    # the store's own scopes stay in this file.

    def high_water(self, scope: str) -> int:
        """The shard's (or the store scope's) high-water mark; 0 if it was never written."""
        scope = validate_scope(scope)
        if not self._parts:
            return super().high_water(scope)
        return max(super().high_water(scope), self._part(scope).high_water(scope))

    def high_waters(self) -> dict[str, int]:
        """Every scope's own mark, in this file and in its partition files."""
        marks = super().high_waters()
        for part in self._every_part():
            for scope, mark in part.high_waters().items():
                marks[scope] = max(mark, marks.get(scope, 0))
        return dict(sorted(marks.items()))

    def raise_high_waters(self, floors: Any, *, default: int = 0) -> dict[str, int]:
        """Raise the marks (R4) in every partition file, each in its own transaction, then in this file.

        Every file gets every floor (a bad one is refused by the first file, before anything is written).
        """
        marks: dict[str, int] = {}
        with _within(self.busy_timeout_ms):  # every file's transaction, within one bound
            for part in self._every_part():
                marks.update(part.raise_high_waters(floors, default=default))
            for scope, mark in super().raise_high_waters(floors, default=default).items():
                marks[scope] = max(mark, marks.get(scope, 0))
        return marks


def open_postgres_log(dsn: str, *, keys: object, entry_bytes_max: int = ENTRY_BYTES_MAX,
                      connect_timeout_s: int = 10, install: bool = True) -> PostgresShardLog:
    """Fenced shard logs in the user's PostgreSQL (psycopg 3): `PostgresShardLog` by its connection string.

    Args:
        dsn: a libpq connection string or ``postgresql://`` url.
        keys: the coordinator's keys (as `stockade.resources.postgres.install`), or ``"unsigned"``.
        install: create the fence (``stockade.fence``) and the log's tables if missing.

    Raises:
        InvalidArgument: bad arguments, or keys of another cluster than the database's fence.
        BackendUnavailable: the database cannot be reached.
    """
    from stockade.recipes._log_postgres import PostgresShardLog

    log = PostgresShardLog(dsn, keys=keys, entry_bytes_max=entry_bytes_max, connect_timeout_s=connect_timeout_s)
    if install:
        log.install()
    return log


def __getattr__(name: str) -> Any:
    if name == "PostgresShardLog":  # lazily: psycopg is an optional dependency
        from stockade.recipes._log_postgres import PostgresShardLog

        return PostgresShardLog
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

