"""The coordinator file's rows: one scope's record read and written back, and the file's meta values.

Used by `stockade.coordinators.sqlite.SQLiteRecords` inside its transactions;
every function takes the open connection and never commits.
"""

from __future__ import annotations

import sqlite3

from stockade.coordinators._record_diff import SQLITE, check_change, lease_and_queue, scope_row_changed
from stockade.coordinators.sqlite._journal import JOURNAL_SCHEMA, journal_change
from stockade.core.errors import invariant
from stockade.core.leases import Lease, ScopeRecord, Waiter
from stockade.core.tokens import FencingToken

__all__ = [
    "SCHEMA","set_meta", "forgotten_floor", "times_pending", "load_record", "forget_record", "store_record"]

#: The coordinator file's tables.
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS scopes (
    scope TEXT PRIMARY KEY,
    last_token INTEGER NOT NULL,
    delay_until_ns INTEGER NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS leases (
    scope TEXT PRIMARY KEY,
    lease_id TEXT NOT NULL UNIQUE,
    holder TEXT NOT NULL,
    token INTEGER NOT NULL,
    ttl_ms INTEGER NOT NULL,
    granted_ns INTEGER NOT NULL,
    expires_ns INTEGER NOT NULL
) STRICT;
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


def set_meta(conn: sqlite3.Connection, key: str, value: str) -> None:
    conn.execute("INSERT INTO meta (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v", (key, value))


def forgotten_floor(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT v FROM meta WHERE k = 'forgotten_floor'").fetchone()
    return int(row[0]) if row else 0


def times_pending(conn: sqlite3.Connection, now_ns: int) -> bool:
    """Whether the file holds a lease, a waiter, or a lock-delay not over at ``now_ns`` (the file's clock)."""
    return bool(
        conn.execute("SELECT 1 FROM leases LIMIT 1").fetchone()
        or conn.execute("SELECT 1 FROM waiters LIMIT 1").fetchone()
        or conn.execute("SELECT 1 FROM scopes WHERE delay_until_ns > MAX(?, 0) LIMIT 1", (now_ns,)).fetchone()
    )


def load_record(conn: sqlite3.Connection, cluster_id: str, scope: str) -> ScopeRecord:
    """One scope's record as the file holds it (a never-used scope: an empty record)."""
    row = conn.execute("SELECT last_token, delay_until_ns FROM scopes WHERE scope = ?", (scope,)).fetchone()
    if row is None:
        return ScopeRecord(scope)
    lease = None
    lease_row = conn.execute(
        "SELECT lease_id, holder, token, ttl_ms, granted_ns, expires_ns FROM leases WHERE scope = ?", (scope,)
    ).fetchone()
    if lease_row is not None:
        lease_id, holder, token, ttl_ms, granted_ns, expires_ns = lease_row
        invariant(token <= row[0], f"lease token {token} above last_token {row[0]} in {scope!r}")
        token_obj = FencingToken(cluster_id, scope, token)
        lease = Lease(lease_id, holder, token_obj, ttl_ms, granted_ns, expires_ns)
    waiters = tuple(
        Waiter(*w)
        for w in conn.execute(
            "SELECT lease_id, holder, deadline_ns, stale_ns FROM waiters WHERE scope = ? ORDER BY seq", (scope,)
        )
    )
    return ScopeRecord(scope, last_token=row[0], lease=lease, delay_until_ns=row[1], waiters=waiters)

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
    if new is None:
        forget_record(conn, old)
        return
    if new == old:
        return
    check_change(old, new)
    scope = new.scope
    if scope_row_changed(old, new):
        # Compare-and-set on last_token: if the stored value is not the one this
        # change was computed from, someone else wrote the file and a token
        # could repeat. Refuse rather than overwrite (C1).
        updated = conn.execute(
            "UPDATE scopes SET last_token = ?, delay_until_ns = ? WHERE scope = ? AND last_token = ?",
            (new.last_token, new.delay_until_ns, scope, old.last_token),
        ).rowcount
        if updated == 0:
            exists = conn.execute("SELECT 1 FROM scopes WHERE scope = ?", (scope,)).fetchone()
            invariant(exists is None, f"last_token of {scope!r} changed underneath this coordinator")
            conn.execute(
                "INSERT INTO scopes (scope, last_token, delay_until_ns) VALUES (?, ?, ?)",
                (scope, new.last_token, new.delay_until_ns),
            )
    for sql, params in lease_and_queue(old, new, SQLITE):
        conn.execute(sql, params)
