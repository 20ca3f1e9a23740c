"""The coordinator file's rows: one scope's record read and written back, and the file's meta values.

Used by `stockade.coordinators.sqlite.SQLiteRecords` inside its transactions;
every function takes the open connection and never commits.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace

from stockade.coordinators._record_diff import SQLITE, check_change, lease_and_queue, scope_row_changed
from stockade.coordinators.sqlite._journal import JOURNAL_SCHEMA, journal_change, migrate_journal
from stockade.core.errors import invariant
from stockade.core.leases import Lease, ScopeRecord, Waiter
from stockade.core.tokens import FencingToken

__all__ = [
    "SCHEMA", "LEASE_COLUMNS", "migrate_v1", "set_meta", "forgotten_floor", "times_pending", "load_record",
    "forget_record", "store_record", "write_record"]

#: The lease columns of a scope's row: NULL when it holds no lease.
LEASE_COLUMNS = ("lease_id", "holder", "token", "ttl_ms", "granted_ns", "expires_ns")

#: The coordinator file's tables (schema version 2). A scope's lease is in its
#: own row: a grant or a release rewrites that one row, and the only other index
#: it touches is the partial one that finds a lease by its id (`SQLiteTx.scope_of_lease`).
#: Version 1 kept leases in a table of their own, indexed twice (`migrate_v1`).
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS scopes (
    scope TEXT PRIMARY KEY,
    last_token INTEGER NOT NULL,
    delay_until_ns INTEGER NOT NULL,
    lease_id TEXT,
    holder TEXT,
    token INTEGER,
    ttl_ms INTEGER,
    granted_ns INTEGER,
    expires_ns INTEGER
) STRICT;
CREATE INDEX IF NOT EXISTS scopes_by_lease ON scopes (lease_id) WHERE lease_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS waiters (
    scope TEXT NOT NULL,
    seq INTEGER NOT NULL,
    lease_id TEXT NOT NULL UNIQUE,
    holder TEXT NOT NULL,
    deadline_ns INTEGER NOT NULL,
    stale_ns INTEGER NOT NULL,
    PRIMARY KEY (scope, seq)
) STRICT;
""" + JOURNAL_SCHEMA  # the history journal, written in each change's own transaction


def migrate_v1(conn: sqlite3.Connection) -> None:
    """Turn a version-1 file into this version, in the caller's open transaction (all or nothing).

    Each lease moves into its scope's row and the ``leases`` table goes; the
    journal loses its AUTOINCREMENT (`stockade.coordinators.sqlite._journal.migrate_journal`).
    Tokens, epochs and the forgotten floor are in rows this leaves as they are.
    """
    for column, kind in zip(LEASE_COLUMNS, ("TEXT", "TEXT", "INTEGER", "INTEGER", "INTEGER", "INTEGER"), strict=True):
        conn.execute(f"ALTER TABLE scopes ADD COLUMN {column} {kind}")
    listed = ", ".join(LEASE_COLUMNS)
    conn.execute(f"UPDATE scopes SET ({listed}) = (SELECT {listed} FROM leases WHERE leases.scope = scopes.scope) "
                 "WHERE scope IN (SELECT scope FROM leases)")
    conn.execute("DROP TABLE leases")
    migrate_journal(conn)


def set_meta(conn: sqlite3.Connection, key: str, value: str) -> None:
    conn.execute("INSERT INTO meta (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v", (key, value))


def forgotten_floor(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT v FROM meta WHERE k = 'forgotten_floor'").fetchone()
    return int(row[0]) if row else 0


def times_pending(conn: sqlite3.Connection, now_ns: int) -> bool:
    """Whether the file holds a lease, a waiter, or a lock-delay not over at ``now_ns`` (the file's clock)."""
    return bool(
        conn.execute("SELECT 1 FROM scopes WHERE lease_id IS NOT NULL LIMIT 1").fetchone()
        or conn.execute("SELECT 1 FROM waiters LIMIT 1").fetchone()
        or conn.execute("SELECT 1 FROM scopes WHERE delay_until_ns > MAX(?, 0) LIMIT 1", (now_ns,)).fetchone()
    )


def load_record(conn: sqlite3.Connection, cluster_id: str, scope: str) -> ScopeRecord:
    """One scope's record as the file holds it (a never-used scope: an empty record)."""
    row = conn.execute(_LOAD, (scope,)).fetchone()
    if row is None:
        return ScopeRecord(scope)
    last_token, delay_until_ns, lease_id, holder, token, ttl_ms, granted_ns, expires_ns = row
    lease = None
    if lease_id is not None:
        invariant(token <= last_token, f"lease token {token} above last_token {last_token} in {scope!r}")
        lease = Lease(lease_id, holder, FencingToken(cluster_id, scope, token), ttl_ms, granted_ns, expires_ns)
    waiters = tuple(
        Waiter(*w)
        for w in conn.execute(
            "SELECT lease_id, holder, deadline_ns, stale_ns FROM waiters WHERE scope = ? ORDER BY seq", (scope,)
        )
    )
    return ScopeRecord(scope, last_token=last_token, lease=lease, delay_until_ns=delay_until_ns, waiters=waiters)


_LOAD = f"SELECT last_token, delay_until_ns, {', '.join(LEASE_COLUMNS)} FROM scopes WHERE scope = ?"
_UPDATE = ("UPDATE scopes SET last_token = ?, delay_until_ns = ?, "
           + ", ".join(f"{c} = ?" for c in LEASE_COLUMNS) + " WHERE scope = ? AND last_token = ?")
_INSERT = f"INSERT INTO scopes (scope, last_token, delay_until_ns, {', '.join(LEASE_COLUMNS)}) VALUES ({'?, ' * 8}?)"
_NO_LEASE = (None,) * len(LEASE_COLUMNS)


def _lease_values(lease: Lease | None) -> tuple[object, ...]:
    if lease is None:
        return _NO_LEASE
    return lease.lease_id, lease.holder, lease.token.value, lease.ttl_ms, lease.granted_ns, lease.expires_ns


def forget_record(conn: sqlite3.Connection, old: ScopeRecord) -> None:
    """Drop an idle scope's row, folding its last token into the forgotten floor (C1)."""
    scope = old.scope
    invariant(old.lease is None, f"forgetting {scope!r}, which holds a lease")
    deleted = conn.execute(
        "DELETE FROM scopes WHERE scope = ? AND last_token = ?", (scope, old.last_token)
    ).rowcount
    if deleted == 0:
        exists = conn.execute("SELECT 1 FROM scopes WHERE scope = ?", (scope,)).fetchone()
        invariant(exists is None, f"last_token of {scope!r} changed underneath this coordinator")
    conn.execute("DELETE FROM waiters WHERE scope = ?", (scope,))
    set_meta(conn, "forgotten_floor", str(max(forgotten_floor(conn), old.last_token)))

def store_record(conn: sqlite3.Connection, old: ScopeRecord, new: ScopeRecord | None) -> None:
    """Write back the difference between two records of one scope (``new`` None: forget it)."""
    journal_change(conn, old, new)  # its events, in this same transaction (docs/history.md)
    write_record(conn, old, new)


def write_record(conn: sqlite3.Connection, old: ScopeRecord, new: ScopeRecord | None) -> None:
    """`store_record` without the journal: the rows only."""
    if new is None:
        forget_record(conn, old)
        return
    # A grant moves ``last_token``, a release or an expiry drops the lease: a change for sure, not compared
    # field by field (a dataclass's ``==`` is a Python call, and its lease's another, on every change).
    if new is old or (new.last_token == old.last_token and (new.lease is None) == (old.lease is None)
                      and new == old):
        return
    check_change(old, new)
    scope = new.scope
    if scope_row_changed(old, new) or (new.lease is None) != (old.lease is None) or new.lease != old.lease:
        # One statement for the scope's row, lease included. Compare-and-set on
        # last_token: if the stored value is not the one this change was computed
        # from, someone else wrote the file and a token could repeat. Refuse
        # rather than overwrite (C1).
        values = (new.last_token, new.delay_until_ns, *_lease_values(new.lease))
        if conn.execute(_UPDATE, (*values, scope, old.last_token)).rowcount == 0:
            exists = conn.execute("SELECT 1 FROM scopes WHERE scope = ?", (scope,)).fetchone()
            invariant(exists is None, f"last_token of {scope!r} changed underneath this coordinator")
            conn.execute(_INSERT, (scope, *values))
    if new.waiters != old.waiters:
        for sql, params in lease_and_queue(replace(old, lease=new.lease), new, SQLITE):  # the queue's statements
            conn.execute(sql, params)
