"""The SQLite store's refusal journal: the fence's refusals, by scope, bounded (docs/history.md).

Rejections are seen by the stores, not the coordinator, so the store keeps them,
beside the coordinator's history of grants, expiries and releases. A refused
write changes nothing in the store (R1), and its file stays byte for byte as it
was: the notes go to a file of their own next to it, ``STORE.refusals``
(mode 0600). `reject` is `stockade.resources._observe.reject` (count, log,
raise) that also notes the refusal for the write transaction open in this
thread; `stockade.resources.store._sqlite_files.write_transaction` writes the notes
once the transaction has ended (committed, or rolled back): a refusal has no
change to share a commit with, so a crash at that moment can lose its note,
never a change. Bounded: the last `REJECTIONS_PER_SCOPE` per scope,
`REJECTIONS_TOTAL_MAX` in all, and at most `PENDING_MAX` notes per transaction.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from stockade.core.fence import Reject
from stockade.core.journal import HistoryEvent
from stockade.core.limits import validate_int, validate_scope
from stockade.core.tokens import FencingToken
from stockade.resources import _observe

__all__ = ["reject", "collecting", "journal", "journal_alone", "read_rejections", "rejections", "refusals_path",
           "REJECTIONS_PER_SCOPE",
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


def refusals_path(store_path: str | Path) -> Path:
    """The refusal journal of the store file at ``store_path``."""
    return Path(f"{store_path}.refusals")


_open_journals: dict[str, sqlite3.Connection] = {}
_open_lock = threading.Lock()
OPEN_JOURNALS_MAX = 64
JOURNAL_WAIT_MS = 1_000  # the longest a refusal's note waits for the journal file's lock


def _journal_of(store_path: str) -> sqlite3.Connection:
    side = _open_journals.get(store_path)
    if side is None:
        path = refusals_path(store_path)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        side = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=JOURNAL_WAIT_MS / 1000)
        side.execute("PRAGMA synchronous=FULL")
        if len(_open_journals) >= OPEN_JOURNALS_MAX:
            _open_journals.pop(next(iter(_open_journals))).close()
        _open_journals[store_path] = side
    return side


def journal_alone(conn: sqlite3.Connection, notes: list[Note], *, until_s: float | None = None) -> None:
    """Write ``notes`` to the refusal journal of ``conn``'s store file, in a transaction of their own; best effort.

    ``until_s``: the deadline (monotonic) of the refused write. The notes wait for the journal at most
    until then (and never more than `JOURNAL_WAIT_MS`), and are dropped rather than waited for past it:
    the refusal is counted and logged all the same (R5).
    """
    if not notes:
        return
    until_s = min(time.monotonic() + JOURNAL_WAIT_MS / 1000, float("inf") if until_s is None else until_s)
    if not _open_lock.acquire(timeout=max(0.0, until_s - time.monotonic())):
        return
    try:
        store_path = conn.execute("PRAGMA database_list").fetchone()[2]
        if not store_path:
            return  # an in-memory database keeps no journal
        side = _journal_of(store_path)
        side.execute(f"PRAGMA busy_timeout = {max(0, math.floor((until_s - time.monotonic()) * 1000))}")
        try:
            side.execute("BEGIN IMMEDIATE")
            journal(side, notes)
            side.execute("COMMIT")
        except BaseException:
            if side.in_transaction:
                side.execute("ROLLBACK")
            raise
    except (sqlite3.Error, OSError):
        pass  # a refused write changed nothing; losing its note is not losing a change
    finally:
        _open_lock.release()


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
    """The last ``limit`` refusals of ``scope`` noted for the store file at ``store_path``, read-only, oldest first."""
    validate_scope(scope)
    validate_int("limit", limit, 1, REJECTIONS_PER_SCOPE)
    path = refusals_path(store_path)
    if not path.is_file():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return read_rejections(conn, scope, limit)
    finally:
        conn.close()
