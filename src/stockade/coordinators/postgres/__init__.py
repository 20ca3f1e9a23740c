"""The PostgreSQL coordinator: the lease table in PostgreSQL tables, its tokens safe across a failover.

``stockade.connect("postgresql://user@h1,h2/db?target_session_attrs=read-write")`` opens one (any libpq url).

This module is a record store (`PostgresRecords`, the port of
`stockade.core.engine`) and the one lease engine over it
(`PostgresCoordinator`); the common cases (a free scope's grant, a live
lease's renewal or release, nobody queued) run as one server-side statement
each with the same rules (`SERVER_RULES`, held to the engine by a model check).
PostgreSQL gives where the records live and three things the rules need:

- **The clock.** Every unit's first statement reads the server's
  ``clock_timestamp()``, and that is ``now_ns`` for the whole unit
  (`ServerClock`). No client's clock judges an expiry (C3).
- **The order.** A write unit locks each scope before it reads the scope's
  rows (EXCLUSIVE on the scope's view in a schema no other role may use,
  until the transaction ends: `LOCK_SCOPE`), so two units on one scope run one
  after the other, in any process on any host; units on different scopes run
  in parallel and commit together (PostgreSQL's group commit).
- **The epoch.** A token value is ``epoch << 22 | counter`` as everywhere
  (`stockade.core.tokens`), and here the epoch is the server's *timeline*
  in its high bits: ``epoch = (timeline + timeline_offset) << 16 | generation``.
  A promoted standby writes on a timeline above every timeline before it, so
  its first token of any scope is above every token the old primary ever
  issued, even one whose commit never reached the standby. The first unit on
  a new timeline also applies the restart rule (every held lease is held a
  full TTL from now on the new server's clock, C3; a pending lock-delay starts
  again, C5; queued waiters are dropped and queue again), in the same
  transaction that records the new timeline, so exactly one unit applies it.

The server must be durable: `check_settings` refuses ``fsync=off``,
``full_page_writes=off`` and ``synchronous_commit=off`` (a crash would lose
acknowledged grants on the same timeline, and a token would repeat). One kind
of transaction does not wait for the disk, deliberately: the one-statement
release (`stockade.coordinators.postgres._rows.RELEASE_ASYNC`); a crash can
forget it, and the lease is then held until its deadline (C3). See
docs/coordinator-postgres.md for failover, restore and the keyring; docs/history.md for the journal.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stockade.coordinators._mint import new_cluster_id
from stockade.coordinators.journal import Journaled
from stockade.coordinators.postgres._call import Prepared, run_prepared
from stockade.coordinators.postgres._journal import HISTORY_READ, events_of_row
from stockade.coordinators.postgres._notify import Notifier, ServerClock
from stockade.coordinators.postgres._rows import (
    EXPECT_SQLSTATE,
    HELD_SCOPE,
    LEASE_ROWS_MAX,
    LOCK_SCOPE,
    MIGRATION_LOCK,
    MIGRATIONS,
    RECORD_COLUMNS,
    RECORD_SELECT,
    RULE_NAMES,
    SCHEMA_VERSION,
    TIMELINE_KEY,
    get_meta,
    record_of_row,
    set_meta,
    timeline_key,
)
from stockade.coordinators.postgres._tx import GENERATION_BITS, PgTx, first_rows
from stockade.core import limits
from stockade.core.engine import LeaseEngine, Outcome, recover_records
from stockade.core.errors import BackendUnavailable, InvariantViolation, LimitExceeded, NotHolder
from stockade.core.journal import HistoryEvent
from stockade.core.leases import AcquireRequest, Granted, Lease, LeasePolicy, Queued, Released, lease_hint
from stockade.core.leases import acquire as core_acquire
from stockade.core.limits import validate_int, validate_scope
from stockade.core.tokens import EPOCH_MAX, FencingToken
from stockade.transport.postgres import error_text, open_connection

__all__ = [
    "PostgresCoordinator", "PostgresRecords", "check_settings", "open_postgres", "GENERATION_BITS", "Attempt",
]

POOL_SIZE_MAX = 16
#: psycopg's own preparation of a statement run this often (None: never). Off: the coordinator prepares its
#: one-statement calls itself (`_call`), and psycopg, once it holds prepared statements of its own, answers a
#: ROLLBACK by deallocating every prepared statement of the session, those too: each later call of them on
#: that pooled connection then failed ("prepared statement ... does not exist", SQLSTATE 26000). psycopg's
#: default, 5, only in the control of tests/test_postgres_prepared.py.
PSYCOPG_PREPARE_THRESHOLD: int | None = None
CONNECT_TIMEOUT_S = 10
STATEMENT_TIMEOUT_MS_DEFAULT = 5_000
_KEYRING_NAME = Path("postgresql table stockade_coord_keyring")

#: Settings the coordinator refuses to run with: each would let a crash forget an acknowledged grant.
REFUSED_SETTINGS = {"fsync": "off", "full_page_writes": "off", "synchronous_commit": "off"}


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
        raise BackendUnavailable("postgresql:// needs psycopg 3 (pip install 'psycopg[binary]')",
                                 certain_no_effect=True) from exc
    return psycopg


def check_settings(conn: Any) -> None:
    """Refuse a server (or session) that may lose an acknowledged commit.

    Raises:
        BackendUnavailable: ``fsync``, ``full_page_writes`` or ``synchronous_commit`` is off.
    """
    for name, refused in REFUSED_SETTINGS.items():
        value = conn.execute(f"SHOW {name}").fetchone()[0]
        if value == refused:
            raise BackendUnavailable(
                f"PostgreSQL runs with {name}={value}: a crash could forget granted tokens; "
                f"the coordinator refuses it (docs/coordinator-postgres.md)", certain_no_effect=True)


_NOW = "(extract(epoch FROM clock_timestamp()) * 1000000000)::bigint"
_META = (f"SELECT {_NOW}, pg_walfile_name(pg_current_wal_lsn()), "
         f"(SELECT v FROM stockade_coord_meta WHERE k = '{TIMELINE_KEY}'), "
         "(SELECT v FROM stockade_coord_meta WHERE k = 'timeline_offset'), "
         "(SELECT v FROM stockade_coord_meta WHERE k = 'epoch'), "
         "(SELECT v FROM stockade_coord_meta WHERE k = 'forgotten_floor')")
_LOCK_SCOPE = f"SELECT %s::text, {LOCK_SCOPE.format(scope='%s')}"
_LOCK_LEASE = (f"SELECT s.scope, {LOCK_SCOPE.format(scope='s.scope')} "
               f"FROM {HELD_SCOPE.format(lease_id='%s')} AS s(scope)")
_META_SCOPE = (f"{_META}, {LEASE_ROWS_MAX}, r.* FROM (SELECT 1) AS one "
               f"LEFT JOIN LATERAL ({RECORD_SELECT}WHERE s.scope = %s) AS r ON true")
_META_LEASE = (f"{_META}, NULL, r.* FROM (SELECT 1) AS one LEFT JOIN LATERAL ({RECORD_SELECT}"
               f"WHERE s.scope = {HELD_SCOPE.format(lease_id='%s')}) AS r ON true")


#: How long a lease id may be to travel inside the first round trip (longer ones take the plain path).
_INLINE_ID_MAX = 256
#: The common cases, one call of a server-side function each (`SERVER_RULES`); each answers the server's time last.
_GRANT = Prepared(RULE_NAMES[0], f"SELECT token, now_ns FROM {RULE_NAMES[0]}($1, $2, $3, $4, $5)", (int, int))
_KEEP = Prepared(RULE_NAMES[1], "SELECT scope, holder, token, ttl_ms, granted_ns, expires_ns, now_ns "
                 f"FROM {RULE_NAMES[1]}($1, $2)", (str, str, int, int, int, int, int))


@dataclass(frozen=True, slots=True)
class Attempt:
    """One acquire attempt of `PostgresCoordinator.attempt`.

    Attributes:
        outcome: what the engine decided.
        wait_deadline_ns: the attempt's wait deadline on the server's clock (pass it to the next attempt).
        retry_ms: when a queued attempt should look again at the latest even without a notification
            (the holder's deadline, the end of a lock-delay, or a bound that keeps the waiter alive).
    """

    outcome: Outcome
    wait_deadline_ns: int
    retry_ms: int


class PostgresRecords(Journaled):
    """A record store (`stockade.core.engine.RecordStore`) in PostgreSQL tables.

    Thread-safe: a small pool of connections, one per unit in flight. A unit
    is one transaction; its first statement reads the server's time, the
    timeline, and the stored epoch (one round trip).

    Args:
        conninfo: a libpq url or key=value string.
        statement_timeout_ms: bound on every statement and lock wait of a unit.
        on_new_timeline: called with the unit that first finds the server on a
            new timeline (a promotion): the coordinator applies the restart rule there.

    Attributes:
        cluster_id: the coordinator's cluster id (stored in the database).
        timelines: whether tokens carry the timeline; a seam for the controls
            of the test suite, never off in production.

    Raises:
        BackendUnavailable: the server cannot be reached, is a standby, or runs unsafely.
    """

    timelines = True
    idle_in_transaction_ms = 2_000  # a unit paused between its statements (SIGSTOP) frees its scopes this soon

    def __init__(
        self,
        conninfo: str,
        *,
        statement_timeout_ms: int = STATEMENT_TIMEOUT_MS_DEFAULT,
        on_new_timeline: Callable[[PgTx, int], object] | None = None,
    ) -> None:
        validate_int("statement_timeout_ms", statement_timeout_ms, 1, 600_000)
        self._conninfo = conninfo
        self._statement_timeout_ms = statement_timeout_ms
        self._on_new_timeline = on_new_timeline
        self._pool: list[Any] = []
        self._pool_lock = threading.Lock()
        self._local = threading.local()
        self._closed = False
        self.clock = ServerClock(self._query_now)
        self.cluster_id = ""
        self.keyring_doc = b""
        self._initialise()
        self.notifier = Notifier(lambda: self._connect(autocommit_only=True))
        if not self.notifier.ready(CONNECT_TIMEOUT_S):
            self.close()
            raise BackendUnavailable("cannot LISTEN on the coordinator database", certain_no_effect=True)

    # -- connections -----------------------------------------------------------------------

    def _connect(self, *, autocommit_only: bool = False) -> Any:
        psycopg = _psycopg()
        extra = {} if "connect_timeout" in self._conninfo else {"connect_timeout": CONNECT_TIMEOUT_S}
        try:  # in UTF8 whatever the database's encoding (`stockade.transport.postgres`)
            conn = open_connection(psycopg.connect, self._conninfo, autocommit=True, **extra)
        except psycopg.Error as exc:
            raise BackendUnavailable(f"cannot connect to the coordinator database: {error_text(exc)}",
                                     certain_no_effect=True) from exc
        conn.prepare_threshold = PSYCOPG_PREPARE_THRESHOLD
        if not autocommit_only:
            try:
                check_settings(conn)
                timeout = self._statement_timeout_ms
                # READ COMMITTED whatever the database's or role's default: each unit takes its scope's
                # lock, then reads what is committed (a snapshot of before the lock, as REPEATABLE READ
                # keeps, failed about one operation in ten with SQLSTATE 40001 under contention).
                conn.execute(f"SET statement_timeout = {timeout}; SET lock_timeout = {timeout}; "
                             f"SET idle_in_transaction_session_timeout = {self.idle_in_transaction_ms}; "
                             "SET default_transaction_isolation = 'read committed'")
            except BaseException:
                conn.close()
                raise
        return conn

    def _take(self) -> Any:
        with self._pool_lock:
            if self._closed:
                raise BackendUnavailable("the coordinator is closed", certain_no_effect=True)
            if self._pool:
                return self._pool.pop()
        return self._connect()

    def _give(self, conn: Any, healthy: bool) -> None:
        stale: list[Any] = []
        with self._pool_lock:
            if healthy and not self._closed and len(self._pool) < POOL_SIZE_MAX and not conn.closed:
                self._pool.append(conn)
                return
            if getattr(conn, "broken", False) or conn.closed:
                # The server went away (a crash, a failover): the pooled connections went with it.
                # Drop them all, so that each later unit does not fail once on one of them.
                stale, self._pool = self._pool, []
        for dead in [conn, *stale]:
            dead.close()

    def call(self, statement: Prepared, params: tuple[object, ...]) -> Any:
        """Run one statement as its own transaction (one round trip, `run_prepared`); its first row, or None.

        Raises:
            BackendUnavailable: the server or the connection failed (``certain_no_effect``
                only when the server refused the statement, so that it committed nothing).
            InvariantViolation: a check inside the statement failed.
        """
        psycopg = _psycopg()
        conn = self._take()
        healthy = False
        try:
            row = run_prepared(conn, statement, params)
            healthy = True
        except psycopg.Error as exc:
            if getattr(exc, "sqlstate", None) == EXPECT_SQLSTATE:
                raise InvariantViolation(error_text(exc)) from exc
            refused = getattr(exc, "sqlstate", None) is not None and not conn.broken
            healthy = refused
            raise BackendUnavailable(f"coordinator database: {error_text(exc)}", certain_no_effect=refused) from exc
        finally:
            self._give(conn, healthy)
        if row is not None:
            self.clock.observe(int(row[-1]))  # every such statement answers with the server's time last
        return row

    def history(self, scope: str, limit: int) -> list[HistoryEvent]:
        """The scope's last ``limit`` events, oldest first: what has committed (one round trip)."""
        return events_of_row(scope, self.call(HISTORY_READ, (scope, limit)))

    def _query_now(self) -> int:
        with self.read():
            return self.clock.now_ns()

    def close(self) -> None:
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, []
        notifier = getattr(self, "notifier", None)
        if notifier is not None:
            notifier.close()
        for conn in pool:
            conn.close()

    # -- units -----------------------------------------------------------------------------

    @contextmanager
    def _unit(self, *, write: bool, scope: str | None = None, lease_id: str | None = None) -> Iterator[PgTx]:
        current: PgTx | None = getattr(self._local, "tx", None)
        if current is not None:  # a unit inside a unit of this thread joins it (PostgresCoordinator.attempt)
            if write and not current.writable:
                raise AssertionError("a write unit inside a read unit")
            yield current
            return
        psycopg = _psycopg()
        conn = self._take()
        healthy = False
        committing = False
        rejected = False  # the server refused a statement before the COMMIT: the transaction did nothing
        try:
            try:
                tx = self._begin(conn, write=write, scope=scope, lease_id=lease_id)
                self._local.tx = tx
                yield tx
                committing = True
                tx.commit()
                healthy = True
            finally:
                self._local.tx = None
                if not healthy and not conn.closed:
                    rejected = conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
                    try:
                        conn.execute("ROLLBACK")
                        healthy = not committing or rejected
                    except psycopg.Error:
                        pass
        except psycopg.Error as exc:
            if getattr(exc, "sqlstate", None) == EXPECT_SQLSTATE:
                raise InvariantViolation(error_text(exc)) from exc
            raise BackendUnavailable(f"coordinator database: {error_text(exc)}",
                                     certain_no_effect=not committing or rejected) from exc
        finally:
            self._give(conn, healthy)
        if tx.woken:
            self.notifier.wake(tx.woken)

    def _begin(self, conn: Any, *, write: bool, scope: str | None = None, lease_id: str | None = None) -> PgTx:
        """Open the unit's transaction and read the server's time (and, to write, its timeline), one round trip.

        A write unit that names its ``scope`` takes the scope's lock in the
        same round trip, before the SELECT, whose snapshot then sees the
        latest state of the scope: its record, and the forgotten floor (a
        forget of the scope commits under the same lock). One that names a
        ``lease_id`` does the same for the scope that holds that lease.
        """
        new = self._new_tx
        if not write:
            row = first_rows(conn, [("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", ()), (f"SELECT {_NOW}", ())])
            return new(conn, self.clock.observe(row[-1][0]), epoch=0, writable=False)
        statements: list[tuple[str, tuple[object, ...]]] = [("BEGIN", ())]
        if scope is not None:
            statements += [(_LOCK_SCOPE, (scope, scope)), (_META_SCOPE, (scope,))]
        elif lease_id is not None:
            statements += [(_LOCK_LEASE, (lease_id,)), (_META_LEASE, (lease_id,))]
        else:
            statements.append((_META, ()))
        while True:
            rows = first_rows(conn, statements)  # BEGIN, the lock and the SELECT in one round trip
            now_ns, walfile, stored, offset, epoch, floor = rows[-1][:6]
            timeline = int(walfile[:8], 16) + int(offset or 0)
            if stored is not None and timeline == int(stored):
                break
            conn.execute("ROLLBACK")
            self._start_timeline(conn, timeline)
        tx = new(conn, self.clock.observe(now_ns), epoch=int(epoch), writable=True)
        if len(rows) == 2:
            return tx
        locked = rows[1]  # (scope, _) of the lock statement: None when no lease has that id
        columns = rows[-1][7:7 + RECORD_COLUMNS]  # after the meta values and the lease table's bound
        if locked is None:
            tx.prefetched(lease=(str(lease_id), None))
            return tx
        tx.prelocked(locked[0], int(floor or 0))
        if scope is not None:
            tx.prefetched(record_of_row(self.cluster_id, scope, columns), lease_rows_max=int(rows[-1][6]))
        elif columns[0] == locked[0]:  # the lease's scope now is the scope locked (a release, a renewal)
            tx.prefetched(record_of_row(self.cluster_id, locked[0], columns), lease=(str(lease_id), locked[0]))
        else:  # the lease went (or moved) between the lock and the SELECT: the engine loads what it needs
            tx.prefetched(lease=(str(lease_id), locked[0]))
        return tx

    def _new_tx(self, conn: Any, now_ns: int, *, epoch: int, writable: bool) -> PgTx:
        return PgTx(conn, now_ns, cluster_id=self.cluster_id, timelines=self.timelines, epoch=epoch, writable=writable)

    def _start_timeline(self, conn: Any, timeline: int) -> None:
        """First unit on a new timeline: record it, start its epoch, apply the restart rule, in one transaction."""
        try:
            conn.execute("BEGIN")  # in the try: an interrupt as it returns must not leave the transaction open
            stored = conn.execute("SELECT v FROM stockade_coord_meta WHERE k = %s FOR UPDATE",
                                  (TIMELINE_KEY,)).fetchone()
            if stored is None:
                raise BackendUnavailable("the coordinator tables are not initialised", certain_no_effect=True)
            if int(stored[0]) > timeline:
                raise BackendUnavailable(
                    f"the database is on timeline {timeline}, below the {stored[0]} its coordinator tables "
                    "recorded: a copy restored without a promotion to a new timeline would issue tokens again; "
                    "raise timeline_offset as docs/coordinator-postgres.md says", certain_no_effect=True)
            if int(stored[0]) < timeline:
                now_ns = conn.execute(
                    "SELECT (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint").fetchone()[0]
                epoch = int(get_meta(conn, "epoch") or 0)
                if self.timelines:
                    epoch = max(epoch, timeline << GENERATION_BITS)
                    if epoch > EPOCH_MAX:
                        raise LimitExceeded("EPOCH_MAX", EPOCH_MAX, "timelines have used up the token epochs")
                tx = self._new_tx(conn, self.clock.observe(now_ns), epoch=epoch, writable=True)
                if self._on_new_timeline is not None:
                    self._on_new_timeline(tx, self.clock.now_ns())
                    tx.flush()
                set_meta(conn, "epoch", str(epoch))
                set_meta(conn, TIMELINE_KEY, str(timeline))
            conn.execute("COMMIT")
        except BaseException:
            try:
                conn.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - a broken connection: the error being raised says more
                pass
            raise
        self.notifier.wake(())  # the restart rule dropped every waiter: each queues again at once

    def _initialise(self) -> None:
        """Create or migrate the tables and read the cluster id and the keyring (one transaction)."""
        psycopg = _psycopg()
        conn = self._connect()
        healthy = False
        try:
            conn.execute("BEGIN")
            if conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]:
                raise BackendUnavailable("the coordinator's server is a standby (read-only); connect to the primary "
                                         "(target_session_attrs=read-write)", certain_no_effect=True)
            if not _installed(conn):  # an installed database of this version opens without the install lock
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                exists = conn.execute("SELECT to_regclass('stockade_coord_meta') IS NOT NULL").fetchone()[0]
                version = int(get_meta(conn, "schema_version") or 0) if exists else 0
                if version > SCHEMA_VERSION:
                    raise BackendUnavailable(f"coordinator tables are of schema version {version}, newer than this "
                                             f"stockade ({SCHEMA_VERSION})", certain_no_effect=True)
                for migration in MIGRATIONS[version:]:
                    conn.execute(migration)
                set_meta(conn, "schema_version", str(SCHEMA_VERSION))
            cluster_id = get_meta(conn, "cluster_id")
            if cluster_id is None:
                cluster_id = new_cluster_id()
                walfile = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()[0]
                timeline = int(walfile[:8], 16)
                set_meta(conn, "cluster_id", cluster_id)
                set_meta(conn, timeline_key(SCHEMA_VERSION), str(timeline))  # the key of the version installed
                set_meta(conn, "timeline_offset", "0")
                set_meta(conn, "epoch", str(timeline << GENERATION_BITS if self.timelines else 0))
            doc = conn.execute("SELECT doc FROM stockade_coord_keyring WHERE id = 1").fetchone()
            if doc is None:
                from stockade.keys import _dump, ephemeral_keyring

                doc = (_dump(ephemeral_keyring(cluster_id)),)
                conn.execute("INSERT INTO stockade_coord_keyring (id, doc) VALUES (1, %s)", doc)
            conn.execute("COMMIT")
            healthy = True
            self.cluster_id = cluster_id
            self.keyring_doc = bytes(doc[0])
        except psycopg.Error as exc:
            raise BackendUnavailable(f"cannot open the coordinator tables: {error_text(exc)}",
                                     certain_no_effect=True) from exc
        finally:
            self._give(conn, healthy)

    # -- the record store port -------------------------------------------------------------

    @contextmanager
    def write(self, scope: str | None = None, *, lease_id: str | None = None) -> Iterator[PgTx]:
        """A write unit; naming the ``scope`` (or the ``lease_id``) it is about saves round trips.

        The scope's lock and its record then come with BEGIN (`_begin`).
        """
        with self._unit(write=True, scope=scope, lease_id=lease_id) as tx:
            yield tx

    @contextmanager
    def read(self) -> Iterator[PgTx]:
        with self._unit(write=False) as tx:
            yield tx


class PostgresCoordinator(LeaseEngine):
    """The lease engine over `PostgresRecords`, on the server's clock.

    Thread-safe; any number of processes on any hosts may open the same
    database. Waiting is native: `attempt` plus `Notifier` (LISTEN/NOTIFY), used by
    the client's port (`stockade.client`), FIFO by the queue in the tables.

    Args:
        conninfo: a libpq url (``postgresql://...``, multi-host allowed) or key=value string.
        policy: lock-delay and queue settings.
        statement_timeout_ms: bound on each statement and lock wait.

    Raises:
        BackendUnavailable: unreachable, a standby, or unsafe settings (`check_settings`).
    """

    records: PostgresRecords
    #: Whether the common cases run as one statement each (`SERVER_RULES`); a seam for the
    #: tests that hold them to the engine's answers, never off in production.
    server_rules = True

    def __init__(self, conninfo: str, *, policy: LeasePolicy | None = None,
                 statement_timeout_ms: int = STATEMENT_TIMEOUT_MS_DEFAULT) -> None:
        policy = policy or LeasePolicy()

        def after_failover(tx: PgTx, now_ns: int) -> int:
            # The stored times are on the old primary's clock: every lease gets a full TTL on this one (C3).
            return recover_records(tx, now_ns, policy, same_clock=False)

        records = PostgresRecords(conninfo, statement_timeout_ms=statement_timeout_ms, on_new_timeline=after_failover)
        super().__init__(records, cluster_id=records.cluster_id, clock=records.clock, policy=policy)

    def __enter__(self) -> PostgresCoordinator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def attempt(self, scope: str, *, lease_id: str, holder: str, ttl_ms: int, wait_ms: int | None,
                wait_deadline_ns: int | None = None) -> Attempt:
        """One acquire attempt whose wait deadline is on the server's clock.

        Args:
            wait_ms: the wait, counted from the server's time of the first attempt (None: no deadline).
            wait_deadline_ns: the deadline an earlier attempt returned (None on the first).

        Raises:
            As `LeaseEngine.try_acquire`.
        """
        # A first attempt (most find the scope free), unless a test replaced the engine's grant rule.
        if wait_deadline_ns is None and self.server_rules and self.acquire_rule is core_acquire:
            AcquireRequest(cluster=self.cluster_id, scope=scope, lease_id=lease_id, holder=holder, ttl_ms=ttl_ms,
                           wait_deadline_ns=0)  # the checks of every acquire, before anything is sent
            row = self.records.call(_GRANT, (scope, lease_id, holder, ttl_ms, self.leases_max))
            if row is not None:
                token, now_ns = row
                lease = Lease(lease_id, holder, FencingToken(self.cluster_id, scope, token), ttl_ms, now_ns,
                              now_ns + ttl_ms * 1_000_000)
                return Attempt(Granted(self._signed(lease)), limits.wait_deadline_ns(now_ns, wait_ms), 1)
        validate_scope(scope)
        with self.records.write(scope) as tx:
            now_ns = tx.now_ns
            deadline_ns = wait_deadline_ns if wait_deadline_ns is not None else limits.wait_deadline_ns(now_ns, wait_ms)
            outcome = self.try_acquire(scope, lease_id=lease_id, holder=holder, ttl_ms=ttl_ms,
                                       wait_deadline_ns=deadline_ns)
            retry_ms = self.policy.waiter_stale_ms // 4  # looked at again well before it counts as dead
            if isinstance(outcome, Queued):
                record = tx.load(scope)
                ends = [record.delay_until_ns] + ([record.lease.expires_ns] if record.lease is not None else [])
                for end_ns in ends:
                    if end_ns > now_ns:
                        retry_ms = min(retry_ms, (end_ns - now_ns) // 1_000_000 + 1)
        return Attempt(outcome, deadline_ns, max(1, retry_ms))

    def _keep(self, lease_id: str, *, release: bool) -> Lease | None | bool:
        """Renew or release a live lease with nobody queued in one round trip.

        Returns:
            The lease as renewed (True: released); False when no lease has this id
            (not held, nothing changed); None for every other case (the engine's path).
        """
        if not self.server_rules:
            return None
        row = self.records.call(_KEEP, (lease_id, release))
        if row is None:
            return None
        scope, holder, token, ttl_ms, granted_ns, expires_ns, _ = row
        if scope is None:
            return False
        if release:
            return True  # the caller needs no lease object (a lock cycle's Python work is its client CPU)
        return Lease(lease_id, holder, FencingToken(self.cluster_id, scope, token), ttl_ms, granted_ns, expires_ns)

    def renew(self, lease_id: str) -> Lease:
        """As `LeaseEngine.renew`: one round trip for a live lease, else two (the scope comes with BEGIN)."""
        if not _inline_id(lease_id):
            return super().renew(lease_id)
        kept = self._keep(lease_id, release=False)
        if kept is False:
            raise NotHolder(lease_hint(lease_id), "lease expired, was released, or never existed")
        if isinstance(kept, Lease):
            return self._signed(kept)
        refused: NotHolder | None = None
        with self.records.write(lease_id=lease_id):
            try:
                return super().renew(lease_id)
            except NotHolder as exc:  # the expiry it found is recorded: commit, then refuse
                refused = exc
        raise refused

    def release(self, lease_id: str) -> Released:
        """As `LeaseEngine.release`: one round trip for a live lease, else two (the scope comes with BEGIN)."""
        if not _inline_id(lease_id):
            return super().release(lease_id)
        kept = self._keep(lease_id, release=True)
        if kept is not None:
            return Released(kept is not False, self.clock.now_ns())
        with self.records.write(lease_id=lease_id):
            return super().release(lease_id)

    def seen(self, scope: str) -> tuple[int, int]:
        """The scope's notification count (`Notifier.seen`); read it before an attempt."""
        return self.records.notifier.seen(scope)

    def wait_for_change(self, scope: str, seen: tuple[int, int], timeout_ms: int) -> bool:
        """Sleep until ``scope`` is notified after ``seen``, or ``timeout_ms`` passes."""
        return self.records.notifier.wait(scope, seen, timeout_ms / 1000)


def _installed(conn: Any) -> bool:
    """Whether the tables are of this version, with their cluster id and keyring (read without the install lock:
    a migration commits all of it at once). Then opening takes no lock that another role could hold."""
    if not conn.execute("SELECT to_regclass('stockade_coord_keyring') IS NOT NULL").fetchone()[0]:
        return False
    if get_meta(conn, "schema_version") != str(SCHEMA_VERSION) or get_meta(conn, "cluster_id") is None:
        return False
    return conn.execute("SELECT 1 FROM stockade_coord_keyring WHERE id = 1").fetchone() is not None


def _inline_id(lease_id: object) -> bool:
    return isinstance(lease_id, str) and len(lease_id) <= _INLINE_ID_MAX and "\x00" not in lease_id


def open_postgres(conninfo: str, policy: LeasePolicy) -> PostgresCoordinator:
    """A `PostgresCoordinator` that signs its tokens with the keyring stored in its database.

    The keyring is the row of ``stockade_coord_keyring``, created with the
    tables and readable by the coordinator's role only (``REVOKE ALL ... FROM
    PUBLIC``): whoever can read it can mint tokens (docs/coordinator-postgres.md).
    """
    from stockade.keys import FixedKeys, _parse

    coordinator = PostgresCoordinator(conninfo, policy=policy)
    try:
        keyring = _parse(coordinator.records.keyring_doc, _KEYRING_NAME)
        if keyring.cluster_id != coordinator.cluster_id:
            raise BackendUnavailable("the stored keyring belongs to another cluster", certain_no_effect=True)
        coordinator.signer = FixedKeys(keyring)
    except BaseException:
        coordinator.close()
        raise
    return coordinator

