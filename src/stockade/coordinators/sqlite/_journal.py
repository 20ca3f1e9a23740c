"""The history journal in the coordinator file: a table written in the transaction of each change.

`journal_change` runs inside `stockade.coordinators.sqlite._rows.store_record`,
on the same connection and in the same transaction (or SAVEPOINT) as the
record change it describes: both commit, or neither does.

Bounded, and kept cheap to write: an event is one INSERT (one row, one entry in
the by-scope index); the trims that bound the journal run in batches, not at
every event, because each one rewrites old pages:

- a scope's events are trimmed to its last `HISTORY_PER_SCOPE` at each of its
  grants whose token is a multiple of `SCOPE_TRIM_EVERY` (tokens of one scope
  rise by one per grant, and a grant brings at most one more event, its end), so
  a scope holds at most ``HISTORY_PER_SCOPE + 2 * SCOPE_TRIM_EVERY`` events on
  disk; a read returns at most `HISTORY_PER_SCOPE` of them, the newest;
- the file's events are trimmed to the last `HISTORY_TOTAL_MAX` at each event
  whose sequence number is a multiple of `total_trim_every` (a thousandth of
  the bound), so the file holds at most that many more.

Sequence numbers are the table's rowid: one above the highest (the trims only
ever delete older events, so a number is never reused). See `stockade.coordinators.journal`.
"""

from __future__ import annotations

import sqlite3
import time

from stockade.coordinators.journal import HISTORY_PER_SCOPE, HISTORY_TOTAL_MAX, HistoryEvent, events_of
from stockade.core.leases import ScopeRecord

__all__ = ["JOURNAL_SCHEMA", "SCOPE_TRIM_EVERY", "journal_change", "migrate_journal", "read_history",
           "total_trim_every", "HistoryEvent"]

#: A scope's journal is trimmed at its grants whose token is a multiple of this.
SCOPE_TRIM_EVERY = 32

JOURNAL_SCHEMA = """
CREATE TABLE IF NOT EXISTS history (
    seq INTEGER PRIMARY KEY,
    scope TEXT NOT NULL,
    kind TEXT NOT NULL,
    holder TEXT NOT NULL,
    token INTEGER NOT NULL,
    at_unix_ms INTEGER NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS history_by_scope ON history (scope, seq);
"""

_INSERT = "INSERT INTO history (scope, kind, holder, token, at_unix_ms) VALUES (?, ?, ?, ?, ?)"


def total_trim_every() -> int:
    """The file's journal is trimmed at events whose sequence number is a multiple of this."""
    return max(1, HISTORY_TOTAL_MAX // 1000)


def journal_change(conn: sqlite3.Connection, old: ScopeRecord, new: ScopeRecord | None) -> None:
    """Record the events of ``old -> new`` in the caller's open transaction, and trim the journal when due."""
    events = events_of(old, new)
    if not events:
        return
    scope = old.scope
    at_ms = time.time_ns() // 1_000_000
    for kind, holder, token in events:
        seq = conn.execute(_INSERT, (scope, kind, holder, token, at_ms)).lastrowid or 0
        if kind == "grant" and token % SCOPE_TRIM_EVERY == 0:
            conn.execute(
                "DELETE FROM history WHERE scope = ? AND seq <= "
                "(SELECT seq FROM history WHERE scope = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)",
                (scope, scope, HISTORY_PER_SCOPE),
            )
        if seq % (HISTORY_TOTAL_MAX // 1000 or 1) == 0:  # `total_trim_every`, without its two calls per event
            conn.execute("DELETE FROM history WHERE seq <= ?", (seq - HISTORY_TOTAL_MAX,))


def migrate_journal(conn: sqlite3.Connection) -> None:
    """Rebuild a version-1 journal (AUTOINCREMENT: one more page written per event) as this one, keeping its events."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'history'").fetchone() is None:
        return  # a file older than the journal: the schema creates it
    conn.execute("ALTER TABLE history RENAME TO history_v1")
    conn.execute("DROP INDEX IF EXISTS history_by_scope")
    for statement in JOURNAL_SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("INSERT INTO history (seq, scope, kind, holder, token, at_unix_ms) "
                 "SELECT seq, scope, kind, holder, token, at_unix_ms FROM history_v1")
    conn.execute("DROP TABLE history_v1")


def read_history(conn: sqlite3.Connection, scope: str, limit: int) -> list[HistoryEvent]:
    """The scope's last ``limit`` events, oldest first."""
    rows = conn.execute(
        "SELECT seq, scope, kind, holder, token, at_unix_ms FROM history WHERE scope = ? ORDER BY seq DESC LIMIT ?",
        (scope, min(limit, HISTORY_PER_SCOPE)),
    ).fetchall()
    return [HistoryEvent(*row) for row in reversed(rows)]
