"""The SQLite store's rejection journal: the fence's refusals, by scope, bounded (docs/history.md).

Rejections are seen by the stores, not the coordinator, so the store keeps them
in its own file (table ``fence_journal``), beside the coordinator's history
of grants, expiries and releases. `reject` is `stockade.resources._observe.reject`
(count, log, raise) that also notes the refusal for the write transaction open
in this thread; `stockade.resources._sqlite_files.write_transaction` writes
the notes when the transaction ends: in its own COMMIT when it commits (a
batch of ``stockade serve`` whose other writes landed), or in a short
transaction of their own right after the rollback (a refused write changes
nothing, so there is no change for them to share a commit with; a crash in
between loses that note, never a change). Bounded: the last
`REJECTIONS_PER_SCOPE` per scope, `REJECTIONS_TOTAL_MAX` in all, and at most
`PENDING_MAX` notes per transaction.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from stockade.coordinators._history import HistoryEvent
from stockade.core.fence import Reject
from stockade.core.limits import validate_int, validate_scope
from stockade.core.tokens import FencingToken
from stockade.resources import _observe

__all__ = ["reject", "collecting", "journal", "read_rejections", "rejections", "REJECTIONS_PER_SCOPE",
           "REJECTIONS_TOTAL_MAX", "PENDING_MAX"]

REJECTIONS_PER_SCOPE = 100
REJECTIONS_TOTAL_MAX = 100_000
PENDING_MAX = 1_000

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS fence_journal (seq INTEGER PRIMARY KEY AUTOINCREMENT, scope TEXT NOT NULL, "
    "token INTEGER NOT NULL, detail TEXT NOT NULL, at_unix_ms INTEGER NOT NULL) STRICT",
    "CREATE INDEX IF NOT EXISTS fence_journal_by_scope ON fence_journal (scope, seq)",
)

Note = tuple[str, int, str, int]  # scope, token value, detail, at_unix_ms
_current = threading.local()


def reject(
    decision: Reject, *, resource: str, cluster: str, token: FencingToken, scope: str, key: str | None
) -> NoReturn:
    """Note the refusal for this thread's open write transaction, then count, log and raise it (R5)."""
    pending: list[Note] | None = getattr(_current, "pending", None)
    if pending is not None and len(pending) < PENDING_MAX:
        detail = f"{decision.reason}, high-water {decision.high_water}"
        pending.append((scope, token.value, detail, time.time_ns() // 1_000_000))
    _observe.reject(decision, resource=resource, cluster=cluster, token=token, scope=scope, key=key)


@contextmanager
def collecting() -> Iterator[list[Note]]:
    """Collect the refusals noted in this thread while the block runs (a write transaction)."""
    outer = getattr(_current, "pending", None)
    pending: list[Note] = []
    _current.pending = pending
    try:
        yield pending
    finally:
        _current.pending = outer


def journal(conn: sqlite3.Connection, notes: list[Note]) -> None:
    """Write ``notes`` in the caller's open transaction, and trim the journal."""
    for statement in _SCHEMA:
        conn.execute(statement)
    conn.executemany("INSERT INTO fence_journal (scope, token, detail, at_unix_ms) VALUES (?, ?, ?, ?)", notes)
    for scope in {note[0] for note in notes}:
        conn.execute(
            "DELETE FROM fence_journal WHERE scope = ? AND seq <= "
            "(SELECT seq FROM fence_journal WHERE scope = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)",
            (scope, scope, REJECTIONS_PER_SCOPE),
        )
    conn.execute("DELETE FROM fence_journal WHERE seq <= (SELECT MAX(seq) FROM fence_journal) - ?",
                 (REJECTIONS_TOTAL_MAX,))


def journal_alone(conn: sqlite3.Connection, notes: list[Note]) -> None:
    """Write ``notes`` in a transaction of their own (after a rollback); best effort."""
    if not notes:
        return
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            journal(conn, notes)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    except sqlite3.Error:
        pass  # a refused write changed nothing; losing its note is not losing a change


def read_rejections(conn: sqlite3.Connection, scope: str, limit: int) -> list[HistoryEvent]:
    """The scope's last ``limit`` refusals, oldest first."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'fence_journal'").fetchone() is None:
        return []
    rows = conn.execute(
        "SELECT seq, scope, token, at_unix_ms, detail FROM fence_journal WHERE scope = ? ORDER BY seq DESC LIMIT ?",
        (scope, limit),
    ).fetchall()
    return [HistoryEvent(seq, sc, "reject", "", token, at, detail) for seq, sc, token, at, detail in reversed(rows)]


def rejections(store_path: str | Path, scope: str, limit: int = REJECTIONS_PER_SCOPE) -> list[HistoryEvent]:
    """The last ``limit`` refusals of ``scope`` in the store file at ``store_path``, read-only, oldest first."""
    validate_scope(scope)
    validate_int("limit", limit, 1, REJECTIONS_PER_SCOPE)
    conn = sqlite3.connect(f"file:{Path(store_path)}?mode=ro", uri=True)
    try:
        return read_rejections(conn, scope, limit)
    finally:
        conn.close()
