"""The history journal in the coordinator file: a table written in the transaction of each change.

`journal_change` runs inside `stockade.coordinators.sqlite._rows.store_record`,
on the same connection and in the same transaction (or SAVEPOINT) as the
record change it describes: both commit, or neither does. Bounded: a scope keeps
its last `HISTORY_PER_SCOPE` events; the file keeps at most `HISTORY_TOTAL_MAX`
(the oldest go first). See `stockade.coordinators.journal`.
"""

from __future__ import annotations

import sqlite3
import time

from stockade.coordinators.journal import HISTORY_PER_SCOPE, HISTORY_TOTAL_MAX, HistoryEvent, events_of
from stockade.core.leases import ScopeRecord

__all__ = ["JOURNAL_SCHEMA", "journal_change", "read_history", "HistoryEvent"]

JOURNAL_SCHEMA = """
CREATE TABLE IF NOT EXISTS history (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    scope TEXT NOT NULL,
    kind TEXT NOT NULL,
    holder TEXT NOT NULL,
    token INTEGER NOT NULL,
    at_unix_ms INTEGER NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS history_by_scope ON history (scope, seq);
"""


def journal_change(conn: sqlite3.Connection, old: ScopeRecord, new: ScopeRecord | None) -> None:
    """Record the events of ``old -> new`` in the caller's open transaction, and trim the journal."""
    events = events_of(old, new)
    if not events:
        return
    scope = old.scope
    at_ms = time.time_ns() // 1_000_000
    for kind, holder, token in events:
        conn.execute(
            "INSERT INTO history (scope, kind, holder, token, at_unix_ms) VALUES (?, ?, ?, ?, ?)",
            (scope, kind, holder, token, at_ms),
        )
    conn.execute(
        "DELETE FROM history WHERE scope = ? AND seq <= "
        "(SELECT seq FROM history WHERE scope = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)",
        (scope, scope, HISTORY_PER_SCOPE),
    )
    conn.execute("DELETE FROM history WHERE seq <= (SELECT MAX(seq) FROM history) - ?", (HISTORY_TOTAL_MAX,))


def read_history(conn: sqlite3.Connection, scope: str, limit: int) -> list[HistoryEvent]:
    """The scope's last ``limit`` events, oldest first."""
    rows = conn.execute(
        "SELECT seq, scope, kind, holder, token, at_unix_ms FROM history WHERE scope = ? ORDER BY seq DESC LIMIT ?",
        (scope, limit),
    ).fetchall()
    return [HistoryEvent(*row) for row in reversed(rows)]

