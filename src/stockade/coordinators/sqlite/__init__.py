"""The embedded coordinator: the lease table kept in one SQLite file.

This module is a record store (`SQLiteRecords`, the port of
`stockade.core.engine`); the coordinator is the one lease engine over it
(`SQLiteCoordinator`). Every engine operation is one ``BEGIN IMMEDIATE``
transaction: load the scope's record, apply the rule, write back what
changed, ``COMMIT``. The file is in WAL mode with ``synchronous=FULL``, so a
commit has reached the disk before the call returns: a token is durable
before anyone sees it (C1).

Several threads and several processes on one host may share one file: SQLite's
write lock serialises the transactions, and lease deadlines are on
``CLOCK_MONOTONIC``, which all processes of one boot share. A process that
dies holding a lease leaves a row whose deadline passes; the next transaction
that touches the scope expires it. After a reboot the monotonic clock starts
again, so on first open after a boot every held lease is given a full TTL
from now (C3) and queued waiters, whose deadlines meant the old clock, are
dropped.

The engine offers non-blocking primitives only (`try_acquire` answers at
once). Waiting is the client's job (`stockade.client`), which polls with a
deadline so that no call here blocks beyond SQLite's busy timeout.
"""

from __future__ import annotations

import os
import random
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from stockade.clock import SystemClock
from stockade.coordinators._mint import (  # new_lease_id: re-exported for callers of the engine
    new_cluster_id,
    new_lease_id,
)
from stockade.coordinators.journal import HistoryEvent, Journaled
from stockade.coordinators.memory import wait_for_epoch
from stockade.coordinators.sqlite._file import (
    APPLICATION_ID,
    KIND,
    STORE_APPLICATION_ID,
    TIMENS_OFFSETS,
    boot_id,
    claim_is_alone,
    claim_lock_file,
    classify,
    create_private,
    drop_lock_file,
    inspect_coordinator_path,
    monotonic_offset_ns,
    private_sidecars,
)
from stockade.coordinators.sqlite._journal import read_history
from stockade.coordinators.sqlite._log import (
    GENERATION_KEY,
    PendingChange,
    RecordLog,
    apply_log_changes,
    log_path,
    replay_log,
    stored_generation,
)
from stockade.coordinators.sqlite._renewals import RenewalFiles, RenewingEngine
from stockade.coordinators.sqlite._rows import (
    SCHEMA,
    forgotten_floor,
    load_record,
    migrate_v1,
    set_meta,
    store_record,
    times_pending,
)
from stockade.coordinators.sqlite._tx import SQLiteTx as _SQLiteTx
from stockade.core.clock import Clock
from stockade.core.engine import RecordTx, recover_records
from stockade.core.errors import BackendUnavailable, ClockMismatch, StockadeError, WrongFileKind
from stockade.core.leases import Lease, LeasePolicy, ScopeRecord
from stockade.core.limits import validate_int
from stockade.core.tokens import epoch_floor, epoch_of

__all__ = [
    "SQLiteCoordinator", "SQLiteRecords", "new_lease_id",
    # the file's own checks, kept importable from here (stockade.coordinators.sqlite._file)
    "APPLICATION_ID", "STORE_APPLICATION_ID", "KIND", "TIMENS_OFFSETS", "classify", "inspect_coordinator_path",
    "monotonic_offset_ns",
]

# 2: each lease in its scope's row; version 1 is migrated on open (`migrate_v1`). 3: the journal's recent events
# in a table without a per-scope index (`stockade.coordinators.sqlite._journal`); a version-2 file gets it on open.
SCHEMA_VERSION = "3"
BUSY_TIMEOUT_MS_DEFAULT = 5_000
PAGE_BYTES = 1024  # the page size of a new file
SQLITE_BUSY_WAIT_MS = 2  # SQLite's own busy handler, per statement
BUSY_RETRY_S = 0.0005  # our retry step for BEGIN IMMEDIATE (jittered)
#: The tables a coordinator file of this version has (an opener that finds them all may join reading only).
_SCHEMA_TABLES = frozenset(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", SCHEMA))

class _ChangeFailed(Exception):
    """Carries the error of a single change out of its transaction (which is rolled back)."""

    def __init__(self, error: StockadeError | sqlite3.Error) -> None:
        super().__init__(str(error))
        self.error = error


class SQLiteRecords(Journaled):
    """A record store (`stockade.core.engine.RecordStore`) in one SQLite file.

    Thread-safe (one connection behind a lock); shareable across processes on
    one host (SQLite's write lock serialises the transactions).

    The file knows what it is: ``PRAGMA application_id`` is `APPLICATION_ID`
    and ``meta`` says ``kind = coordinator``. Anything else at ``path`` (a
    store file, a foreign SQLite database, a file that is not SQLite, a
    directory, a device) is refused with `WrongFileKind` before anything is
    written, and no ``PATH.lock`` is left behind. A missing or empty file
    becomes a coordinator, created mode 0600 (so are its ``-wal``, ``-shm``
    and ``.lock`` files).

    An opener that finds nobody else using the file (the first after a
    restore always does; so does ``stockade serve``) starts a new token epoch
    (`stockade.core.tokens`): every token handed out from then on is above
    every token of the file's history, even of a history an older copy of the
    file no longer remembers (docs/coordinator-files.md). Openers that join
    others keep the epoch in use.

    Args:
        path: the database file (created with a new cluster id if missing).
        busy_timeout_ms: how long a unit waits for the connection and for
            SQLite's write lock before failing with `BackendUnavailable`.
        exclusive: claim the file for this process alone (``stockade serve``
            keeps the table in memory, so nobody else may write the file).
            Embedded users share the file; either kind refuses to open a file
            the other kind holds (a lock on ``PATH.lock``), so two writers can
            never hand out the same token.

        on_reboot: called with the opening transaction when the host rebooted
            since the file was last opened (its stored times are on a clock that
            is gone): the coordinator applies the restart rule there, so that
            exactly one opener applies it, atomically with noticing the reboot.

    Attributes:
        cluster_id: the file's cluster id.
        epoch: the token epoch this opener started or joined.

    Raises:
        WrongFileKind: ``path`` is not a coordinator file (nothing was touched).
        ClockMismatch: the file's leases are on a monotonic clock this process
            does not share (another time namespace).
        BackendUnavailable: the file cannot be opened, or is held by the other kind of user.
    """

    #: Whether tokens carry epochs; a seam for the controls of the test suite, never off in production.
    epochs = True
    #: Whether a caller's deadline bounds a unit's wait (`within`) and a joiner opens reading only; a seam
    #: for the controls of the test suite (the old behaviour: every wait is the busy timeout), never off in production.
    bounded_waits = True
    #: Whether renewals written beside the file (`stockade.coordinators.sqlite._renewals`) count; a seam for the
    #: controls of the test suite (the old behaviour: a renewal is a write transaction), never off in production.
    renewal_files = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS_DEFAULT,
        exclusive: bool = False,
        on_reboot: Callable[[RecordTx], object] | None = None,
    ) -> None:
        validate_int("busy_timeout_ms", busy_timeout_ms, 0, 60_000)
        self._on_reboot = on_reboot
        self.path = Path(path)
        self._lock = threading.Lock()
        self._busy_timeout_ms = busy_timeout_ms
        self._budget = threading.local()  # a unit's own bound, set by `within` (per thread)
        self.epoch = 0
        self._epoch_floor = 0
        self._alone_at_open = False
        self.renewals = RenewalFiles(self.path, boot_id())
        #: The leases this process renews through their files (set by `SQLiteCoordinator`): ending one of
        #: them here needs no end mark, its holder's own next renewal is refused by its deadline or not made.
        self.renewing: Mapping[str, Lease] = {}
        exists = inspect_coordinator_path(self.path)
        if not exists:
            create_private(self.path)
        self._claim, lock_created = self._claim_file(exclusive)
        try:
            self._conn = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False, timeout=SQLITE_BUSY_WAIT_MS / 1000
            )
        except sqlite3.Error as exc:
            self._drop_claim(lock_created)
            raise BackendUnavailable(f"cannot open coordinator file {self.path}: {exc}") from exc
        try:
            # Before anything is written (WAL mode rewrites the header): is it ours?
            self._retry_busy(lambda: self._check_kind(self._conn))
            # Switching to WAL needs a moment of exclusive access: another process
            # opening or recovering the file at the same time makes it fail with
            # "locked", so retry it like BEGIN IMMEDIATE, within the busy timeout.
            # A new file gets small pages: a commit writes whole pages to the WAL, and a lock
            # cycle changes a few rows in 4 of them; 1 KiB pages cut the bytes written and
            # checksummed by 4 (about 35 of 180 us of CPU per commit, measured). An existing
            # file keeps its page size (only an empty database takes this).
            self._conn.execute(f"PRAGMA page_size = {PAGE_BYTES}")
            self._retry_busy(lambda: self._conn.execute("PRAGMA journal_mode=WAL"))
            self._conn.execute("PRAGMA synchronous=FULL")
            private_sidecars(self.path)
        except BaseException as exc:
            self._conn.close()
            self._drop_claim(lock_created and isinstance(exc, WrongFileKind))
            if isinstance(exc, (BackendUnavailable, KeyboardInterrupt, SystemExit)):
                raise
            raise BackendUnavailable(f"cannot open coordinator file {self.path}: {exc}") from exc
        self.cluster_id = ""
        try:
            self.cluster_id = self._initialise()
        except BaseException:
            self.close()
            raise

    # -- lifecycle -------------------------------------------------------------------------

    def _claim_file(self, exclusive: bool) -> tuple[int, bool]:
        fd, created, self._alone_at_open = claim_lock_file(self.path, exclusive)
        return fd, created

    def _drop_claim(self, remove: bool) -> None:
        fd, self._claim = self._claim, -1
        drop_lock_file(self.path, fd, remove)

    def _check_kind(self, conn: sqlite3.Connection) -> None:
        """Refuse a file that is not a coordinator, reading only (the header may not be rewritten yet)."""
        try:
            conn.execute("BEGIN")
            application_id = conn.execute("PRAGMA application_id").fetchone()[0]
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            meta = dict(conn.execute("SELECT k, v FROM meta").fetchall()) if "meta" in tables else {}
        except sqlite3.DatabaseError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise
            raise WrongFileKind(str(self.path), "coordinator", "not an SQLite database") from None
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        found = classify(application_id, tables, meta)
        if found is not None:
            raise WrongFileKind(str(self.path), "coordinator", found)

    def _initialise(self) -> str:
        joined = self._join_reading() if self.bounded_waits else None
        if joined is not None:
            return joined
        with self._write() as conn:
            found = classify(conn.execute("PRAGMA application_id").fetchone()[0],
                             {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")},
                             {})
            if found is not None:  # changed since it was checked (another opener): nothing written yet
                raise WrongFileKind(str(self.path), "coordinator", found)
            migrating = self._migrating(conn)
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            meta = dict(conn.execute("SELECT k, v FROM meta").fetchall())
            offset = monotonic_offset_ns()
            if "cluster_id" not in meta:
                cluster = new_cluster_id()
                conn.executemany(
                    "INSERT INTO meta (k, v) VALUES (?, ?)",
                    [("cluster_id", cluster), ("schema_version", SCHEMA_VERSION), ("boot_id", boot_id()),
                     ("kind", KIND), ("mono_offset_ns", str(offset))],
                )
                self.cluster_id = cluster
                self._start_epoch(conn, meta)
                self._sweep_renewals(conn)
                return cluster
            if migrating:
                set_meta(conn, "schema_version", SCHEMA_VERSION)
            elif meta.get("schema_version") != SCHEMA_VERSION:
                raise BackendUnavailable(f"{self.path}: schema version {meta.get('schema_version')!r} is not supported")
            self.cluster_id = meta["cluster_id"]
            set_meta(conn, "kind", KIND)
            # Before the restart rule: the log's frames carry times on the clock the file's rows are on.
            replay_log(conn, self.path, self.cluster_id, lambda: self._stored_records(conn))
            if meta.get("boot_id") != boot_id():
                # In the same transaction that notices the reboot: of several
                # processes opening the file after a boot, exactly one applies
                # the restart rule, and a crash in between applies none of it.
                if self._on_reboot is not None:
                    self._on_reboot(_SQLiteTx(self, conn))
                conn.execute("UPDATE meta SET v = ? WHERE k = 'boot_id'", (boot_id(),))
                set_meta(conn, "mono_offset_ns", str(offset))
            else:
                self._check_clock(conn, meta.get("mono_offset_ns"), offset)
            self._start_epoch(conn, meta)
            self._sweep_renewals(conn)
            return meta["cluster_id"]

    def _migrating(self, conn: sqlite3.Connection) -> bool:
        """Migrate a file of version 1 or 2 in the opening transaction; returns whether it was one.

        The whole migration commits with the rest of the opening, or not at all.
        A process of version 1 that still has the file open fails its next
        write (its ``leases`` table is gone) rather than writing beside it. A
        version-2 file only lacks the journal's recent table, which the schema
        creates; a process of version 2 still writing it adds its events to
        ``history`` directly, numbered after them (`stockade.coordinators.sqlite._journal`).
        """
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        version = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone() if "meta" in tables else None
        if "leases" not in tables:
            return version is not None and version[0] == "2"
        if version is not None and version[0] != "1":
            raise BackendUnavailable(f"{self.path}: schema version {version[0]!r} is not supported")
        migrate_v1(conn)
        return True

    def _join_reading(self) -> str | None:
        """Join a file that others have open and that needs no change, reading only; None if it needs one.

        Opening must not need the write lock: a process frozen inside a write
        unit holds it for as long as it is frozen, and a new process's
        ``connect()`` would wait for it (docs/leases.md, "A frozen party").
        The file needs a write only when it is new or of another version, after
        a reboot, on another clock, or when this opener is alone (a new epoch);
        a WAL reader sees the last committed state and takes no write lock.
        """
        if self._alone_at_open:
            return None  # a new epoch is written (and nobody else can hold the write lock)
        conn = self._conn
        try:
            try:
                conn.execute("BEGIN")
                application_id = conn.execute("PRAGMA application_id").fetchone()[0]
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                meta = dict(conn.execute("SELECT k, v FROM meta").fetchall()) if "meta" in tables else {}
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
        except sqlite3.Error:
            return None  # the writing path says what is wrong, within the busy timeout
        if (
            application_id != APPLICATION_ID or not _SCHEMA_TABLES <= tables or "cluster_id" not in meta
            or meta.get("schema_version") != SCHEMA_VERSION or meta.get("kind") != KIND
            or meta.get("boot_id") != boot_id() or meta.get("mono_offset_ns") != str(monotonic_offset_ns())
        ):
            return None
        self.cluster_id = meta["cluster_id"]
        self._start_epoch(conn, meta)  # joins: reads only
        return self.cluster_id

    def _sweep_renewals(self, conn: sqlite3.Connection) -> None:
        """Alone (nobody else can be renewing) and holding the write lock: drop renewal files of ended leases."""
        if self._alone_at_open:
            self.renewals.sweep(r[0] for r in conn.execute("SELECT lease_id FROM scopes WHERE lease_id IS NOT NULL"))

    def renewed(self, record: ScopeRecord) -> ScopeRecord:
        """``record`` with its lease's deadline moved to its last renewal beside the file, if that is later.

        Every unit that loads a lease reads it through here. A unit that decides
        an expiry must read its clock before it loads (the order the renewal
        rule relies on: `stockade.coordinators.sqlite._renewals`).
        """
        lease = record.lease
        if lease is None or not self.renewal_files:
            return record
        own = self.renewing.get(lease.lease_id)  # this process's own lease: its latest renewal, no file read
        until = own.expires_ns if own is not None else self.renewals.read(lease.lease_id)
        if until is None or until <= lease.expires_ns:
            return record
        return replace(record, lease=replace(lease, expires_ns=until))

    def _check_clock(self, conn: sqlite3.Connection, stored: str | None, offset: int) -> None:
        """Same boot: refuse when the file's times are on another time namespace's monotonic clock."""
        if stored is None or int(stored) == offset:
            if stored is None:
                set_meta(conn, "mono_offset_ns", str(offset))
            return
        shift_ns = offset - int(stored)  # our monotonic clock reads this much more than the file's
        busy = times_pending(conn, time.monotonic_ns() - shift_ns)
        if busy or not self._alone():
            raise ClockMismatch(
                str(self.path),
                f"this process's monotonic clock is {shift_ns / 1e9:+.3f} s off the clock of the processes that "
                f"use this file (another time namespace, unshare --time); its lease times cannot be compared. "
                f"Open it from the same time namespace as the others"
                + (" (it holds leases, waiters or a lock-delay now)" if busy else " (others have it open now)"),
            )
        set_meta(conn, "mono_offset_ns", str(offset))  # idle and ours alone: adopt this clock

    def _alone(self) -> bool:
        return claim_is_alone(self._claim)

    def _start_epoch(self, conn: sqlite3.Connection, meta: dict[str, str]) -> None:
        """Start this opener's epoch: above every epoch the file knows of, and past on the wall clock."""
        known = int(meta.get("epoch", "0"))
        if not self.epochs or not self._alone_at_open:
            # Others have the file open: it cannot have been replaced by an older
            # copy under them, so their epoch stands (the first opener after a
            # restore is alone, and starts a new one).
            self.epoch = known
            self._epoch_floor = epoch_floor(known) if self.epochs else 0
            return
        highest = conn.execute("SELECT MAX(last_token) FROM scopes").fetchone()[0] or 0
        known = max(known, epoch_of(highest), epoch_of(int(meta.get("forgotten_floor", "0"))))
        self.epoch = wait_for_epoch(known, time.time_ns)
        self._epoch_floor = epoch_floor(self.epoch)
        set_meta(conn, "epoch", str(self.epoch))

    def token_floor_now(self) -> tuple[int, int]:
        """``(epoch floor, forgotten floor)`` as they stand (for a server loading the table)."""
        with self._locked() as conn:
            return self._epoch_floor, forgotten_floor(conn)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
            if self._claim >= 0:
                os.close(self._claim)  # releases the flock
                self._claim = -1

    @contextmanager
    def within(self, until_s: float) -> Iterator[None]:
        """Units begun in this thread inside the block wait for the file at most until ``until_s``.

        ``until_s`` is on ``time.monotonic()``. Past it a unit still makes one
        attempt at the write lock, so an expired bound means "only if free now".
        The bound never extends the busy timeout.
        """
        if not self.bounded_waits:
            yield
            return
        previous = getattr(self._budget, "until_s", None)
        self._budget.until_s = until_s if previous is None else min(previous, until_s)
        try:
            yield
        finally:
            self._budget.until_s = previous

    def _wait_until_s(self) -> tuple[float, int]:
        """(monotonic deadline, its length in ms) of the wait for the connection and the write lock."""
        now_s = time.monotonic()
        until_s = now_s + self._busy_timeout_ms / 1000
        bound = getattr(self._budget, "until_s", None)
        if bound is not None:
            until_s = min(until_s, max(now_s, bound))
        return until_s, round((until_s - now_s) * 1000)

    def history(self, scope: str, limit: int) -> list[HistoryEvent]:
        """The scope's last ``limit`` events in the file, oldest first (what has committed)."""
        with self._locked() as conn:
            return read_history(conn, scope, limit)

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        """This process's connection, waited for at most the busy timeout (or the thread's `within` bound)."""
        if not self._lock.acquire(blocking=False):  # free, the usual case: no deadline to work out
            until_s, wait_ms = self._wait_until_s()
            if not self._lock.acquire(timeout=max(0.0, until_s - time.monotonic())):
                raise BackendUnavailable(f"coordinator busy for {wait_ms} ms", certain_no_effect=True)
        try:
            yield self._conn
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"coordinator read failed: {exc}", certain_no_effect=True) from exc
        finally:
            self._lock.release()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction; its COMMIT is fsync'd before we return."""
        with self._locked() as conn:
            try:
                # Inside the try: an interrupt (KeyboardInterrupt) raised as BEGIN returns must not leave
                # the transaction, and the file's write lock, open on this connection.
                self._begin_immediate(conn)
                yield conn
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise BackendUnavailable(f"coordinator write failed: {exc}", certain_no_effect=True) from exc
                raise
            self._commit_now(conn)

    def _begin_immediate(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("BEGIN IMMEDIATE")  # the write lock is free, the usual case (a server's always)
        except sqlite3.Error:
            self._retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"), bounded=True)

    @staticmethod
    def _commit_now(conn: sqlite3.Connection) -> None:
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise BackendUnavailable(f"coordinator commit failed: {exc}") from exc

    def _retry_busy(self, statement: Any, *, bounded: bool = False) -> None:
        # SQLite's own busy handler sleeps in growing steps (up to 100 ms), so a
        # process that loops on the lock starves the others. Retrying here in
        # short, jittered steps keeps entry to the queue fair between processes.
        if bounded:
            deadline, wait_ms = self._wait_until_s()
        else:
            deadline, wait_ms = time.monotonic() + self._busy_timeout_ms / 1000, self._busy_timeout_ms
        while True:
            try:
                statement()
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise BackendUnavailable(f"coordinator unavailable: {exc}", certain_no_effect=True) from exc
                if time.monotonic() >= deadline:
                    raise BackendUnavailable(f"coordinator busy for {wait_ms} ms", certain_no_effect=True) from exc
                time.sleep(BUSY_RETRY_S * (0.5 + random.random()))
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"coordinator unavailable: {exc}", certain_no_effect=True) from exc

    # -- the record store port -------------------------------------------------------------

    @contextmanager
    def write(self) -> Iterator[_SQLiteTx]:
        with self._write() as conn:
            yield _SQLiteTx(self, conn)

    @contextmanager
    def read(self) -> Iterator[_SQLiteTx]:
        """A read transaction: every statement of it sees one snapshot of the file (a scope's row, its
        waiters and the list of names agree, whatever another process commits meanwhile)."""
        with self._locked() as conn:
            try:
                conn.execute("BEGIN")
                yield _SQLiteTx(self, conn)
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")  # nothing was written: ending it releases the snapshot

    # -- group commit (for a server that keeps the lease table in memory) -------------------

    def records(self) -> dict[str, ScopeRecord]:
        """Every scope's record as stored, waiters included, in scope order.

        A process that is the file's only user (``stockade serve``) loads the
        table once, decides in memory, and writes the changes back with
        `commit_records`.
        """
        with self._locked() as conn:
            names = [r[0] for r in conn.execute("SELECT scope FROM scopes ORDER BY scope")]
            return {name: self.renewed(load_record(conn, self.cluster_id, name)) for name in names}

    def commit_records(
        self, changes: Sequence[tuple[ScopeRecord, ScopeRecord | None]]
    ) -> list[StockadeError | None]:
        """Write many ``(old, new)`` record changes in one transaction: one COMMIT, one fsync.

        The changes are applied in order, each in its own SAVEPOINT, so one that
        fails (its slot in the result holds the error; its change is undone)
        does not abort the others. Each ``old`` must be what is stored for its
        scope at that point: the previous change's ``new``, or the loaded record.

        A batch is first written without savepoints (two statements fewer per
        change): only if a change fails is that transaction rolled back and the
        batch written again, each change in its SAVEPOINT, as said above.

        Returns:
            One slot per change: None when written, else the error.

        Raises:
            BackendUnavailable: BEGIN or COMMIT failed; nothing of the batch is durable.
        """
        if len(changes) == 1:
            return self._commit_one(*changes[0])
        try:
            with self._write() as conn:
                for old, new in changes:
                    try:
                        store_record(conn, old, new)
                    except (StockadeError, sqlite3.Error) as exc:
                        raise _ChangeFailed(exc) from exc  # rolled back: nothing of this attempt was written
            return [None] * len(changes)
        except _ChangeFailed:
            pass
        results: list[StockadeError | None] = []
        with self._write() as conn:
            for old, new in changes:
                conn.execute("SAVEPOINT change")
                try:
                    store_record(conn, old, new)
                except (StockadeError, sqlite3.Error) as exc:
                    conn.execute("ROLLBACK TO change")
                    conn.execute("RELEASE change")
                    if isinstance(exc, sqlite3.Error):
                        exc = BackendUnavailable(f"coordinator write failed: {exc}", certain_no_effect=True)
                    results.append(exc)
                    continue
                conn.execute("RELEASE change")
                results.append(None)
        return results

    def _stored_records(self, conn: sqlite3.Connection) -> dict[str, ScopeRecord]:
        names = [r[0] for r in conn.execute("SELECT scope FROM scopes ORDER BY scope")]
        return {name: load_record(conn, self.cluster_id, name) for name in names}

    # -- the record log (for a server, the file's only user) ---------------------------------

    def open_log(self, **options: Any) -> RecordLog:
        """The file's record log (`stockade.coordinators.sqlite._log`), for the process that opened it exclusively:
        its changes are appended there and folded into the file (`fold_log`). ``options``: `RecordLog`'s."""
        with self._locked() as conn:
            generation = stored_generation(conn)
        return RecordLog(log_path(self.path), self.cluster_id, generation, self.fold_log, **options)

    def fold_log(self, pending: Sequence[PendingChange], generation: int) -> None:
        """Write the log's pending changes into the file and store its next ``generation``, in one transaction
        (after its COMMIT the log's frames count for nothing)."""
        with self._write() as conn:
            try:
                apply_log_changes(conn, pending)
            except StockadeError as exc:
                raise BackendUnavailable(f"record log fold failed: {exc}", certain_no_effect=True) from exc
            set_meta(conn, GENERATION_KEY, str(generation))

    def _commit_one(self, old: ScopeRecord, new: ScopeRecord | None) -> list[StockadeError | None]:
        # A batch of one needs no SAVEPOINT: if its change fails, rolling the whole
        # transaction back undoes exactly that change, as ROLLBACK TO would.
        if self._lock.acquire(blocking=False):  # free: a server's every lone commit
            try:
                return self._commit_one_locked(self._conn, old, new)
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"coordinator read failed: {exc}", certain_no_effect=True) from exc
            finally:
                self._lock.release()
        with self._locked() as conn:  # another thread of this process has it: waited for, within the bound
            return self._commit_one_locked(conn, old, new)

    def _commit_one_locked(self, conn: sqlite3.Connection, old: ScopeRecord,
                           new: ScopeRecord | None) -> list[StockadeError | None]:
        """`_commit_one` with the connection's lock held: `_write`'s transaction and outcomes, written out.

        Without its two generator context managers (about 20 Python calls a
        commit): the server commits every lone change here, on its event loop.
        """
        try:
            # Inside the try, as in `_write`: an interrupt raised as BEGIN returns must not leave the
            # transaction, and the file's write lock, open on this connection.
            self._begin_immediate(conn)
            try:
                store_record(conn, old, new)
            except (StockadeError, sqlite3.Error) as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    return [BackendUnavailable(f"coordinator write failed: {exc}", certain_no_effect=True)]
                return [exc]
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self._commit_now(conn)
        return [None]


class SQLiteCoordinator(RenewingEngine):
    """The embedded coordinator: the lease engine over a `SQLiteRecords` file.

    Thread-safe; shareable across processes on one host. After a reboot (the
    file's boot id differs) the restart rule is applied once, on open: every
    held lease gets a full TTL from now (C3), a recorded lock-delay starts
    again (C5), queued waiters are dropped.

    Args:
        path, busy_timeout_ms, exclusive: as for `SQLiteRecords`.
        clock: monotonic clock; defaults to the host's.
        policy: lock-delay and queue settings.

    Raises:
        BackendUnavailable: the file cannot be opened, or is held by the other kind of user.
    """

    records: SQLiteRecords

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        policy: LeasePolicy | None = None,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS_DEFAULT,
        exclusive: bool = False,
    ) -> None:
        clock = clock or SystemClock()
        policy = policy or LeasePolicy()

        def after_reboot(tx: RecordTx) -> int:
            return recover_records(tx, clock.now_ns(), policy, same_clock=False)

        records = SQLiteRecords(path, busy_timeout_ms=busy_timeout_ms, exclusive=exclusive, on_reboot=after_reboot)
        super().__init__(records, cluster_id=records.cluster_id, clock=clock, policy=policy)
        self.path = records.path
        self._start_renewing(records.renewals if records.renewal_files else None)
        records.renewing = self._held

    def __enter__(self) -> SQLiteCoordinator:
        return self

    def within(self, until_ns: int) -> AbstractContextManager[None]:
        """Units begun in this thread inside the block wait for the file at most until ``until_ns`` (engine clock)."""
        return self.records.within(time.monotonic() + (until_ns - self.clock.now_ns()) / 1e9)

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _debug_records(self) -> dict[str, ScopeRecord]:
        """Every record, for tests that compare state before and after."""
        return self.records.records()
