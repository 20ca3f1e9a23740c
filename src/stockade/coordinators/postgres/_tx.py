"""One unit of the PostgreSQL coordinator: a transaction whose writes travel with its COMMIT.

`PgTx` is the record store's unit (`stockade.core.engine.RecordTx`) on one
psycopg connection. Round trips are what a lock cycle costs here, so it
sends as few as the rules allow:

- The unit's first round trip (`stockade.coordinators.postgres`) begins
  the transaction, takes the scope's lock and reads the server's clock, the
  epoch and, when the unit names its scope (or the lease it is about), that
  scope's record and the lease count: `prefetched`.
- A save only queues its statements. They go out with the COMMIT, in one
  round trip (`first_rows`): the compare-and-set on
  ``last_token`` checks itself inside its statement, so a mismatch aborts the
  transaction before its COMMIT runs. Anything that reads the tables sends the
  queued statements first (`flush`), so a unit always reads its own writes.

An acquire is then two round trips, as is a release; the engine, in Python,
still decides everything between them.
"""

from __future__ import annotations

from typing import Any

from stockade.coordinators.postgres._notify import CHANNEL
from stockade.coordinators.postgres._rows import (
    HELD_SCOPE,
    LOCK_SCOPE,
    Statement,
    forget_record,
    forgotten_floor,
    leases_at_least,
    load_record,
    record_writes,
)
from stockade.core.errors import LimitExceeded
from stockade.core.leases import ScopeRecord
from stockade.core.tokens import epoch_floor

__all__ = ["PgTx", "GENERATION_BITS", "first_rows", "send_together"]

#: Low bits of an epoch: generations within one timeline (a scope whose 22-bit counter ran out moves on one).
GENERATION_BITS = 16


def first_rows(conn: Any, statements: list[Statement]) -> list[Any]:
    """Run ``statements`` in order in one round trip; the first row of each (None: no rows or no result).

    Several statements go as one simple-protocol query, their parameters quoted by the
    client (psycopg's ``ClientCursor``). It ends with the server's ReadyForQuery, so a
    transaction left open counts as idle and ``idle_in_transaction_session_timeout``
    ends it when the client pauses before its next round trip. A pipeline does not do
    that: the Flush psycopg sends after its Sync disarms the server's idle timer, and a
    client paused between a unit's round trips would hold its scopes' locks for as long
    as it stays paused (measured on PostgreSQL 15 with psycopg 3.3;
    tests/test_coordinator_cancel.py). The first failure skips the rest and raises.
    """
    if len(statements) == 1:
        cursor = conn.execute(*statements[0])
    else:
        import psycopg  # the coordinator's connections are psycopg's

        mogrify = psycopg.ClientCursor(conn).mogrify
        cursor = conn.execute("; ".join(mogrify(sql, params or None) for sql, params in statements))
    rows = []
    while True:
        rows.append(cursor.fetchone() if cursor.description is not None else None)
        if not cursor.nextset():
            return rows


def send_together(conn: Any, statements: list[Statement]) -> None:
    """Run ``statements`` in order in one round trip (`first_rows`); the first failure skips the rest and raises."""
    first_rows(conn, statements)


class PgTx:
    """One unit of `stockade.coordinators.postgres.PostgresRecords` (a transaction on one connection).

    Attributes:
        now_ns: the server's clock at the unit's start.
        epoch: the stored epoch as the unit began (raised by `new_epoch`).
        writable: a write unit (a read unit is REPEATABLE READ, READ ONLY).
        woken: scopes whose waiters are notified at COMMIT.
    """

    __slots__ = ("_conn", "_cluster_id", "_timelines", "now_ns", "epoch", "writable", "woken", "_locked", "_floor",
                 "_pending", "_records", "_lease_rows_max", "_lease_scope")

    def __init__(self, conn: Any, now_ns: int, *, cluster_id: str, timelines: bool, epoch: int,
                 writable: bool) -> None:
        self._conn = conn
        self._cluster_id = cluster_id
        self._timelines = timelines
        self.now_ns = now_ns
        self.epoch = epoch
        self.writable = writable
        self.woken: set[str] = set()
        self._locked: set[str] = set()
        self._floor: int | None = None  # the forgotten floor as read under the one scope's lock
        self._pending: list[Statement] = []
        self._records: dict[str, ScopeRecord] = {}  # what the tables hold for a locked scope, after this unit's saves
        self._lease_rows_max: int | None = None  # `LEASE_ROWS_MAX` as read at the start, while no lease was written
        self._lease_scope: tuple[str, str | None] | None = None  # (lease id, its scope) as read under the lock

    # -- what the first round trip read ----------------------------------------------------

    def prelocked(self, scope: str, forgotten_floor: int) -> None:
        """The unit began holding ``scope``'s lock and read ``forgotten_floor`` after taking it."""
        self._locked.add(scope)
        self._floor = forgotten_floor

    def prefetched(self, record: ScopeRecord | None = None, *, lease_rows_max: int | None = None,
                   lease: tuple[str, str | None] | None = None) -> None:
        """What the first round trip read under the lock: a scope's record, the lease table's bound on its rows
        (`LEASE_ROWS_MAX`), a lease's scope."""
        if record is not None:
            self._records[record.scope] = record
        self._lease_rows_max = lease_rows_max
        self._lease_scope = lease

    # -- round trips ---------------------------------------------------------------------

    def flush(self) -> None:
        """Send the queued writes (one round trip), so that what follows reads them."""
        if self._pending:
            pending, self._pending = self._pending, []
            send_together(self._conn, pending)

    def _execute(self, sql: str, params: tuple[object, ...] = ()) -> Any:
        self.flush()
        return self._conn.execute(sql, params)

    def commit(self) -> None:
        """Send the queued writes, the notifications and the COMMIT together (one round trip)."""
        statements = self._pending
        self._pending = []
        if self.woken:
            statements.append(("SELECT pg_notify(%s, s) FROM unnest(%s::text[]) AS s", (CHANNEL, sorted(self.woken))))
        statements.append(("COMMIT", ()))
        send_together(self._conn, statements)

    # -- the record store port -----------------------------------------------------------

    def _lock(self, scope: str) -> None:
        # One lock per scope per unit, released at COMMIT/ROLLBACK: units on one scope run one after the other.
        if self.writable and scope not in self._locked:
            self._execute(f"SELECT {LOCK_SCOPE.format(scope='%s')}", (scope,))
            self._locked.add(scope)

    def load(self, scope: str) -> ScopeRecord:
        self._lock(scope)
        record = self._records.get(scope)
        if record is None:
            self.flush()
            record = load_record(self._conn, self._cluster_id, scope)
            if self.writable:  # held under the lock until COMMIT: later loads of this unit need no round trip
                self._records[scope] = record
        return record

    def scope_of_lease(self, lease_id: str) -> str | None:
        if self._lease_scope is not None and self._lease_scope[0] == lease_id:
            return self._lease_scope[1]
        if not self.writable:
            row = self._execute(f"SELECT {HELD_SCOPE.format(lease_id='%s')}", (lease_id,)).fetchone()
            row = None if row is None or row[0] is None else row
            return None if row is None else str(row[0])
        # Found and locked in one round trip; the load that follows is a later statement, so it
        # reads what the lock protects (a scope re-granted meanwhile shows another lease id).
        row = self._execute(
            f"SELECT s.scope, {LOCK_SCOPE.format(scope='s.scope')} FROM {HELD_SCOPE.format(lease_id='%s')} "
            "AS s(scope) WHERE s.scope IS NOT NULL",
            (lease_id,)).fetchone()
        if row is None:
            return None
        self._locked.add(row[0])
        return str(row[0])

    def leases_at_least(self, n: int) -> bool:
        if self._lease_rows_max is not None and self._lease_rows_max < n:
            return False  # the table cannot hold n rows: nothing to count
        return bool(self._execute(f"SELECT {leases_at_least('%s::bigint')}", (n,) * 3).fetchone()[0])

    def lapsed_scopes(self, now_ns: int) -> list[str]:
        rows = self._execute("SELECT scope FROM stockade_coord_log WHERE end_kind IS NULL AND expires_ns <= %s "
                             "ORDER BY scope",
                             (now_ns,))
        return [r[0] for r in rows]

    def names(self, *, after: str, limit: int) -> list[str]:
        rows = self._execute(
            "SELECT scope FROM stockade_coord_scopes WHERE scope COLLATE \"C\" > %s ORDER BY scope COLLATE \"C\" "
            "LIMIT %s", (after, limit))
        return [r[0] for r in rows]

    def save(self, old: ScopeRecord, new: ScopeRecord) -> None:
        self._lock(new.scope)
        statements, wake = record_writes(old, new)
        if not statements:
            return
        self._pending += statements
        self._records[new.scope] = new
        if new.lease != old.lease:
            self._lease_rows_max = None
        if wake:
            self.woken.add(new.scope)

    def token_floor(self) -> int:
        # The floor read at BEGIN is good while the unit holds no other scope's lock (then the
        # grant is of that scope); after a forget of other scopes in this unit, read it again.
        floor = self._floor if self._floor is not None and len(self._locked) == 1 else self.forgotten_floor()
        return max(epoch_floor(self.epoch), floor)

    def new_epoch(self, after: int) -> int | None:
        if not self._timelines:
            return None
        epoch = max(after, self.epoch) + 1
        if epoch >> GENERATION_BITS != self.epoch >> GENERATION_BITS:
            raise LimitExceeded("GENERATIONS_PER_TIMELINE", 1 << GENERATION_BITS,
                                "this timeline's token generations are used up; a promotion starts new ones")
        row = self._execute(
            "UPDATE stockade_coord_meta SET v = GREATEST(v::bigint, %s)::text WHERE k = 'epoch' RETURNING v",
            (epoch,)).fetchone()
        self.epoch = int(row[0])
        return self.epoch

    def forgotten_floor(self) -> int:
        self.flush()
        return forgotten_floor(self._conn)

    def forget(self, record: ScopeRecord) -> None:
        self._lock(record.scope)
        self.flush()
        forget_record(self._conn, record)
        self._records.pop(record.scope, None)
        self.woken.add(record.scope)

    def oldest(self, limit: int) -> list[str]:
        rows = self._execute("SELECT scope FROM stockade_coord_scopes ORDER BY created LIMIT %s", (limit,))
        return [r[0] for r in rows]

    def full(self) -> bool:
        return False  # the tables bound their leases (LEASES_MAX), not their scopes
