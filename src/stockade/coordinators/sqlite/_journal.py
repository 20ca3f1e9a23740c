"""The history journal in the coordinator file: a table written in the transaction of each change.

`journal_change` runs inside `stockade.coordinators.sqlite._rows.store_record`,
on the same connection and in the same transaction (or SAVEPOINT) as the
record change it describes: both commit, or neither does.

Bounded, and kept cheap to write: an event is one INSERT into ``history_recent``,
a table with no index but its rowid, so the events of one commit share one page
whatever their scopes. Each event whose sequence number is a multiple of
`total_trim_every` (a thousandth of the bound) moves the recent events into
``history``, which is indexed by scope, in one statement: their index entries
are written a hundred at a time, a few pages for many events, not one page per
scope per commit (the index was half the pages of a lock cycle). The trims
that bound the journal run in batches too, because each one rewrites old pages:

- a scope's events in ``history`` are trimmed to its last `HISTORY_PER_SCOPE` at
  each of its grants whose token is a multiple of `SCOPE_TRIM_EVERY` (tokens of
  one scope rise by one per grant, and a grant brings at most one more event,
  its end), so a scope holds at most ``HISTORY_PER_SCOPE + 2 * SCOPE_TRIM_EVERY +
  total_trim_every() - 1`` events in both tables (the last term: those still
  recent at its last trim); a read returns at most `HISTORY_PER_SCOPE` of them,
  the newest of both tables;
- the file's events are trimmed to the last `HISTORY_TOTAL_MAX` when the recent
  ones move, so the file holds at most ``total_trim_every() - 1`` more.

Sequence numbers: one above the highest of both tables (the recent table's, else
the moved ones'), so they are consecutive and the move keeps them as they are
(``history`` numbers its rows one above its highest, and the trims only ever
delete older events, so a number is never reused). See `stockade.coordinators.journal`.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable

from stockade.coordinators.journal import HISTORY_PER_SCOPE, HISTORY_TOTAL_MAX, HistoryEvent, events_of
from stockade.core.leases import ScopeRecord

__all__ = ["JOURNAL_SCHEMA", "SCOPE_TRIM_EVERY", "journal_change", "journal_changes", "migrate_journal", "move_recent",
           "read_history", "last_seq", "total_trim_every", "HistoryEvent"]

#: A scope's journal is trimmed at its grants whose token is a multiple of this.
SCOPE_TRIM_EVERY = 32

# The columns of an event, in both tables (the moved events keep their numbers).
_EVENT_TABLE = """(
    seq INTEGER PRIMARY KEY,
    scope TEXT NOT NULL,
    kind TEXT NOT NULL,
    holder TEXT NOT NULL,
    token INTEGER NOT NULL,
    at_unix_ms INTEGER NOT NULL
) STRICT"""

JOURNAL_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS history {_EVENT_TABLE};
CREATE INDEX IF NOT EXISTS history_by_scope ON history (scope, seq);
CREATE TABLE IF NOT EXISTS history_recent {_EVENT_TABLE};
"""

# The number of the file's last event (0: none); the next one is numbered one above it.
_LAST_SEQ = "COALESCE((SELECT MAX(seq) FROM history_recent), (SELECT MAX(seq) FROM history), 0)"
_INSERT = ("INSERT INTO history_recent (seq, scope, kind, holder, token, at_unix_ms) VALUES "
           f"({_LAST_SEQ} + 1, ?, ?, ?, ?, ?)")
# The same row numbered by its writer (`journal_changes`, which knows the number `_INSERT` would give).
_INSERT_NUMBERED = "INSERT INTO history_recent (seq, scope, kind, holder, token, at_unix_ms) VALUES (?, ?, ?, ?, ?, ?)"
_TRIM_SCOPE = ("DELETE FROM history WHERE scope = ? AND seq <= "
               "(SELECT seq FROM history WHERE scope = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)")
# `_MOVE` of events not yet in the recent table (`journal_changes`): their number, ?1, is left to ``history``.
_MOVE_ROWS = "INSERT INTO history (scope, kind, holder, token, at_unix_ms) VALUES (?2, ?3, ?4, ?5, ?6)"
# Numbered on by ``history`` in seq order: the same numbers (`journal_change`), and still unique and in order
# if a process of schema version 2 added rows to ``history`` meanwhile.
_MOVE = ("INSERT INTO history (scope, kind, holder, token, at_unix_ms) "
         "SELECT scope, kind, holder, token, at_unix_ms FROM history_recent ORDER BY seq")
_COLUMNS = "seq, scope, kind, holder, token, at_unix_ms"


def total_trim_every() -> int:
    """The file's journal is trimmed at events whose sequence number is a multiple of this."""
    return max(1, HISTORY_TOTAL_MAX // 1000)


def journal_change(conn: sqlite3.Connection, old: ScopeRecord, new: ScopeRecord | None,
                   at_ms: int | None = None) -> None:
    """Record the events of ``old -> new`` in the caller's open transaction, and trim the journal when due
    (``at_ms``: when they happened, Unix ms; None: now)."""
    events = events_of(old, new)
    if not events:
        return
    scope = old.scope
    if at_ms is None:
        at_ms = time.time_ns() // 1_000_000
    for kind, holder, token in events:
        seq = conn.execute(_INSERT, (scope, kind, holder, token, at_ms)).lastrowid or 0
        if kind == "grant" and token % SCOPE_TRIM_EVERY == 0:
            conn.execute(_TRIM_SCOPE, (scope, scope, HISTORY_PER_SCOPE))
        if seq % (HISTORY_TOTAL_MAX // 1000 or 1) == 0:  # `total_trim_every`, without its two calls per event
            move_recent(conn)
            conn.execute("DELETE FROM history WHERE seq <= ?", (seq - HISTORY_TOTAL_MAX,))


def journal_changes(conn: sqlite3.Connection, changes: Iterable[tuple[ScopeRecord, ScopeRecord | None, int]]
                    ) -> None:
    """`journal_change` of each ``(old, new, at_ms)`` in order, in the caller's open transaction: the same rows,
    in a few statements (a fold of the record log: a statement an event was most of its time).

    The events are numbered here as `_INSERT` numbers them: one above the last (`last_seq`, read again after
    each move). Between two moves they would only sit in the recent table, which no trim reads: they are kept
    here, and at the move go into ``history`` with ONE ``executemany``, numbered there as `_MOVE` numbers them
    (after the recent table's own events, moved first); a scope's trim runs after the same event as there, so
    it sees the same rows. The events after the last move go into the recent table with one ``executemany``.
    """
    seq = last_seq(conn)
    every = total_trim_every()
    rows: list[tuple[int, str, str, str, int, int]] = []
    recent_moved = False  # the recent table's events from before this call: moved at the first move
    for old, new, at_ms in changes:
        for kind, holder, token in events_of(old, new):
            seq += 1
            rows.append((seq, old.scope, kind, holder, token, at_ms))
            if kind == "grant" and token % SCOPE_TRIM_EVERY == 0:
                conn.execute(_TRIM_SCOPE, (old.scope, old.scope, HISTORY_PER_SCOPE))
            if seq % every == 0:
                if not recent_moved:
                    move_recent(conn)
                    recent_moved = True
                conn.executemany(_MOVE_ROWS, rows)
                rows = []
                conn.execute("DELETE FROM history WHERE seq <= ?", (seq - HISTORY_TOTAL_MAX,))
                seq = last_seq(conn)
    if rows:
        conn.executemany(_INSERT_NUMBERED, rows)


def move_recent(conn: sqlite3.Connection) -> None:
    """Move the recent events into ``history`` (indexed by scope), in the caller's open transaction."""
    conn.execute(_MOVE)
    conn.execute("DELETE FROM history_recent")


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


def last_seq(conn: sqlite3.Connection) -> int:
    """The number of the file's last event (0: none): the next one is numbered one above it."""
    return int(conn.execute(f"SELECT {_LAST_SEQ}").fetchone()[0])


def read_history(conn: sqlite3.Connection, scope: str, limit: int) -> list[HistoryEvent]:
    """The scope's last ``limit`` events, oldest first (of both tables; a file of schema version 2 or older,
    read as it is, has no recent table)."""
    recent = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'history_recent'").fetchone()
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM history WHERE scope = ?"
        + (f" UNION ALL SELECT {_COLUMNS} FROM history_recent WHERE scope = ?" if recent else "")
        + " ORDER BY seq DESC LIMIT ?",
        (scope, scope, min(limit, HISTORY_PER_SCOPE)) if recent else (scope, min(limit, HISTORY_PER_SCOPE)),
    ).fetchall()
    return [HistoryEvent(*row) for row in reversed(rows)]
