"""The fenced shard log in the user's PostgreSQL (`stockade.recipes.log`; docs/shard-log.md).

Tables in the schema ``stockade_log`` (beside the fence's schema ``stockade``):
``heads`` (a shard's next offset) and ``entries`` (primary key shard, offset).
An append is one transaction, on an autocommit connection::

    BEGIN; SELECT stockade.fence(token, shard)     -- R1, R2, forged: the fence's one check
    INSERT INTO heads ... ON CONFLICT DO NOTHING;   -- a new shard's head row
    SELECT next_offset FROM heads ... FOR UPDATE    -- appends of a shard one after the other
    INSERT INTO entries ... ; UPDATE heads ...      -- consecutive offsets
    NOTIFY stockade_log, shard;  COMMIT

The fence holds the shard's scope lock (shared for the current token,
exclusive to raise the mark) until the commit, and the head's row lock orders
the appends of one token; both are taken in that order by every append, so
they cannot deadlock. A refused or failed append rolls back whole: no entry
and no offset of it remains. A refused stale append whose idempotency key is
already in the log returns that append's offsets (R3), read in a second,
read-only statement: an entry never changes once committed.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from stockade.core.errors import BackendUnavailable, InvalidArgument, StaleToken, invariant
from stockade.core.fence import Replay, check_write
from stockade.core.limits import validate_int, validate_scope
from stockade.core.tokens import FencingToken
from stockade.recipes._log_common import (
    ENTRY_BYTES_CEILING,
    ENTRY_BYTES_MAX,
    AppendResult,
    LogEntry,
    OffsetConflict,
    check_batch,
    check_read,
    fingerprint,
    recorded,
    wait_for_entries,
)
from stockade.resources import postgres as pg
from stockade.resources._inputs import coerce_token
from stockade.transport.postgres import error_text, open_connection

__all__ = ["PostgresShardLog", "install_log", "NOTIFY_CHANNEL", "LOG_SCHEMA", "LOG_INSTALL_LOCK_KEY"]

LOG_SCHEMA = "stockade_log"
NOTIFY_CHANNEL = "stockade_log"
LOG_INSTALL_LOCK_KEY = 0x73746B6400000010


def _tables(schema: str, unique_offsets: bool) -> str:
    offsets = "PRIMARY KEY (shard, log_offset)" if unique_offsets else "CHECK (true)"
    return f"""
    CREATE SCHEMA IF NOT EXISTS {schema};
    CREATE TABLE IF NOT EXISTS {schema}.heads (
        shard text PRIMARY KEY,
        next_offset bigint NOT NULL CHECK (next_offset >= 0)
    );
    CREATE TABLE IF NOT EXISTS {schema}.entries (
        shard text NOT NULL,
        log_offset bigint NOT NULL CHECK (log_offset >= 0),
        token_value bigint NOT NULL,
        data bytea NOT NULL,
        idempotency_key text,
        batch_count int,
        fingerprint text,
        {offsets}
    );
    CREATE UNIQUE INDEX IF NOT EXISTS entries_idempotency ON {schema}.entries (shard, idempotency_key)
        WHERE idempotency_key IS NOT NULL;
    CREATE INDEX IF NOT EXISTS entries_offset ON {schema}.entries (shard, log_offset);
    """


def install_log(conn: Any, *, schema: str = LOG_SCHEMA, unique_offsets: bool = True) -> None:
    """Create the log's tables if missing (idempotent; installs from several processes are serialised).

    ``schema`` and ``unique_offsets`` are the seam of the check-then-append control only.
    """
    with pg._edge(), conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOG_INSTALL_LOCK_KEY,))
        conn.execute(_tables(schema, unique_offsets))


class _Replayed(Exception):
    """Leaves a fenced block (rolling it back) with the offsets an idempotency key already has."""

    def __init__(self, result: AppendResult) -> None:
        self.result = result


class PostgresShardLog:
    """Fenced shard logs in the user's PostgreSQL; one connection per object, thread-safe.

    Args:
        dsn: a libpq connection string or ``postgresql://`` url.
        keys: the coordinator's keys, to install the fence with and to refuse a
            forged token without a round trip (``"unsigned"``: no MAC check).
        entry_bytes_max: the largest entry accepted (at most `ENTRY_BYTES_CEILING`).
        connect_timeout_s: how long a connection attempt may take.
    """

    def __init__(self, dsn: str, *, keys: object, entry_bytes_max: int = ENTRY_BYTES_MAX,
                 connect_timeout_s: int = 10, _schema: str = LOG_SCHEMA, _lock_head: bool = True) -> None:
        if not isinstance(dsn, str) or not dsn:
            raise InvalidArgument("dsn", "must be a libpq connection string or a postgresql:// url")
        if keys is None:
            raise InvalidArgument("keys", "pass the coordinator's keys, or 'unsigned' (unsafe: docs/tokens.md)")
        self.dsn = dsn
        self.keys = keys
        self.entry_bytes_max = validate_int("entry_bytes_max", entry_bytes_max, 0, ENTRY_BYTES_CEILING)
        self.connect_timeout_s = validate_int("connect_timeout_s", connect_timeout_s, 1, 3600)
        self._schema = _schema
        self._lock_head = _lock_head  # False: the check-then-append control (a gap or a duplicate offset)
        self._lock = threading.Lock()
        self._conn: Any = None
        self._listener: Any = None

    def __repr__(self) -> str:
        return "PostgresShardLog(<dsn>)"  # a dsn may hold a password

    # -- connections -------------------------------------------------------------------------------

    def _connect(self) -> Any:
        with pg._edge():
            conn = open_connection(psycopg.connect, self.dsn, autocommit=True, connect_timeout=self.connect_timeout_s)
            try:
                # READ COMMITTED whatever the database's or role's default: an append locks its head row, then
                # reads what is committed (at REPEATABLE READ or SERIALIZABLE its snapshot was of before the
                # lock: about one append in four failed with 40001 from 4 threads, half on one shard).
                conn.execute("SET default_transaction_isolation = 'read committed'")
            except BaseException:
                conn.close()
                raise
            return conn

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        with self._lock:
            if self._conn is None or self._conn.closed:
                self._conn = self._connect()
            try:
                yield self._conn
            except BackendUnavailable:
                self._drop()
                raise
            except psycopg.Error as error:
                # What the fence's edge does not count as a lost connection, e.g. the server ending a
                # transaction left idle too long (SQLSTATE 25P03) while this process was stopped.
                self._drop()
                raise BackendUnavailable(f"postgres shard log: {error_text(error)}") from error

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    def install(self, *, cluster_id: str | None = None) -> None:
        """Install (or migrate) the fence and create the log's tables (`install_log`)."""
        with self._connection() as conn:
            pg.install(conn, keys=self.keys, cluster_id=cluster_id)
            install_log(conn, schema=self._schema, unique_offsets=self._lock_head)

    def close(self) -> None:
        """Close the connections. Idempotent."""
        with self._lock:
            self._drop()
            listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.close()
            except psycopg.Error:
                pass

    def __enter__(self) -> PostgresShardLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- appends -----------------------------------------------------------------------------------

    def append(self, shard: str, data: bytes | str, *, token: FencingToken | str, idempotency_key: str | None = None,
               expected_offset: int | None = None) -> AppendResult:
        """Append one entry (`append_batch` of one)."""
        return self.append_batch(shard, [data], token=token, idempotency_key=idempotency_key,
                                 expected_offset=expected_offset)

    def append_batch(self, shard: str, entries: Sequence[bytes | str], *, token: FencingToken | str,
                     idempotency_key: str | None = None, expected_offset: int | None = None) -> AppendResult:
        """Append ``entries`` at consecutive offsets in one transaction; as `SQLiteShardLog.append_batch`.

        Raises:
            StaleToken, TokenMismatch, OffsetConflict, InvalidArgument, LimitExceeded: nothing appended.
            BackendUnavailable: the connection failed; the outcome is unknown (retry with the same
                idempotency key).
        """
        shard = validate_scope(shard, "shard")
        checked, key, expected = check_batch(entries, idempotency_key, expected_offset,
                                             entry_bytes_max=self.entry_bytes_max)
        fencing_token = coerce_token(token)
        print_ = fingerprint(checked)
        with self._connection() as conn:
            try:
                return self._append_in(conn, shard, checked, fencing_token, key, expected, print_)
            except _Replayed as replayed:
                return replayed.result
            except StaleToken as stale:
                if key is None:
                    raise
                earlier = self._earlier(conn, shard, key)
                if earlier is None:
                    raise
                # R3 after R1: a retry of an append that landed gets its answer after a newer writer wrote.
                decision = check_write(fencing_token, scope=shard, cluster=fencing_token.cluster,
                                       high_water=stale.high_water, fingerprint=print_,
                                       recorded=recorded(shard, key, earlier[0], earlier[1], stale.high_water,
                                                         earlier[3]))
                invariant(isinstance(decision, Replay), "a recorded append is not replayed")
                return AppendResult(shard, earlier[0], earlier[2], earlier[1], stale.high_water, replayed=True)

    def _earlier(self, conn: Any, shard: str, key: str) -> tuple[int, int, int, str] | None:
        with pg._edge():
            row = conn.execute(
                f"SELECT log_offset, token_value, batch_count, fingerprint FROM {self._schema}.entries "
                "WHERE shard = %s AND idempotency_key = %s", (shard, key)).fetchone()
        return None if row is None else (int(row[0]), int(row[1]), int(row[2]), str(row[3]))

    def _append_in(self, conn: Any, shard: str, entries: list[bytes], token: FencingToken, key: str | None,
                   expected: int | None, print_: str) -> AppendResult:
        schema = self._schema
        with pg.fenced(conn, token, shard, keys=self.keys):
            conn.execute(f"INSERT INTO {schema}.heads (shard, next_offset) VALUES (%s, 0) ON CONFLICT DO NOTHING",
                         (shard,))
            lock = " FOR UPDATE" if self._lock_head else ""
            next_offset = int(conn.execute(f"SELECT next_offset FROM {schema}.heads WHERE shard = %s{lock}",
                                           (shard,)).fetchone()[0])
            if key is not None:
                earlier = self._earlier(conn, shard, key)
                if earlier is not None:
                    # The fence passed: this is R3 alone (InvalidArgument if the key was used for other entries).
                    decision = check_write(token, scope=shard, cluster=token.cluster, high_water=token.value,
                                           fingerprint=print_, recorded=recorded(
                                               shard, key, earlier[0], earlier[1], token.value, earlier[3]))
                    assert isinstance(decision, Replay)  # or InvalidArgument: the key was used for other entries
                    raise _Replayed(AppendResult(shard, earlier[0], earlier[2], earlier[1], token.value,
                                                 replayed=True))
            if expected is not None and expected != next_offset:
                raise OffsetConflict(shard, expected, next_offset)
            # One statement, not executemany: psycopg sends that as a pipeline, whose trailing Flush
            # disarms the server's idle_in_transaction_session_timeout, and a writer paused before its
            # COMMIT then held the shard's lock for as long as it was paused (tests/test_shard_log.py).
            conn.execute(
                f"INSERT INTO {schema}.entries (shard, log_offset, token_value, data, idempotency_key, "
                "batch_count, fingerprint) SELECT %s, %s + t.o - 1, %s, t.d, CASE WHEN t.o = 1 THEN %s END, "
                "CASE WHEN t.o = 1 THEN %s::int END, CASE WHEN t.o = 1 THEN %s END "
                "FROM unnest(%s::bytea[]) WITH ORDINALITY AS t(d, o)",
                (shard, next_offset, token.value, key, len(entries), print_, entries))
            conn.execute(f"UPDATE {schema}.heads SET next_offset = %s WHERE shard = %s",
                         (next_offset + len(entries), shard))
            conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, shard))
        return AppendResult(shard, next_offset, len(entries), token.value, token.value)

    # -- reads -------------------------------------------------------------------------------------

    def read(self, shard: str, from_offset: int = 0, limit: int = 100, *, wait_ms: int = 0) -> builtins.list[LogEntry]:
        """Entries of ``shard`` from ``from_offset`` on, at most ``limit``; waits up to ``wait_ms`` for one.

        A wait listens on the channel `NOTIFY_CHANNEL` (each append notifies it on commit).
        """
        shard = validate_scope(shard, "shard")
        start, count, wait = check_read(from_offset, limit, wait_ms)

        def once() -> builtins.list[LogEntry]:
            with self._connection() as conn, pg._edge():
                rows = conn.execute(
                    f"SELECT log_offset, token_value, data FROM {self._schema}.entries WHERE shard = %s "
                    "AND log_offset >= %s ORDER BY log_offset LIMIT %s", (shard, start, count)).fetchall()
            return [LogEntry(shard, int(o), int(t), bytes(d)) for o, t, d in rows]

        if wait == 0:
            return once()
        self._listen()
        return wait_for_entries(once, wait, self._wait_notify)

    def _listen(self) -> None:
        with self._lock:
            if self._listener is None or self._listener.closed:
                listener = self._connect()
                with pg._edge():
                    listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
                self._listener = listener

    def _wait_notify(self, timeout_s: float) -> None:
        listener = self._listener
        if listener is None:
            return
        try:
            for _ in listener.notifies(timeout=timeout_s, stop_after=1):
                pass
        except psycopg.Error:
            with self._lock:
                self._listener = None

    def next_offset(self, shard: str) -> int:
        """The offset ``shard``'s next entry gets (0 for a shard never appended to)."""
        shard = validate_scope(shard, "shard")
        with self._connection() as conn, pg._edge():
            row = conn.execute(f"SELECT next_offset FROM {self._schema}.heads WHERE shard = %s", (shard,)).fetchone()
        return 0 if row is None else int(row[0])

    def shards(self) -> builtins.list[str]:
        """The shards appended to, in name order."""
        with self._connection() as conn, pg._edge():
            return [r[0] for r in conn.execute(f"SELECT shard FROM {self._schema}.heads ORDER BY shard").fetchall()]

    # -- marks and floors (R4): the fence's own ---------------------------------------------------

    def high_waters(self) -> dict[str, int]:
        with self._connection() as conn:
            return pg.high_waters(conn)

    def high_water(self, shard: str) -> int:
        shard = validate_scope(shard, "shard")
        with self._connection() as conn, pg._edge():
            row = conn.execute("SELECT greatest(coalesce((SELECT high_water FROM stockade.high_water WHERE scope = %s)"
                               ", 0), default_floor) FROM stockade.settings", (shard,)).fetchone()
        return int(row[0])

    def raise_high_waters(self, floors: Any, *, default: int = 0) -> dict[str, int]:
        """Raise shards' marks to floors, never lowering one (R4; what ``stockade floor`` does)."""
        with self._connection() as conn:
            return pg.raise_high_waters(conn, floors, default=default)
