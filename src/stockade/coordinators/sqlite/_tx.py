"""One unit of the embedded coordinator's record store: its transaction, seen as the engine's `RecordTx`.

Used by `stockade.coordinators.sqlite.SQLiteRecords`, which opens the
transaction; every method runs inside it and never commits. Loading a lease
goes through the records' renewal files (`SQLiteRecords.renewed`), and ending
a lease another process holds marks its file (`stockade.coordinators.sqlite._renewals`).
"""

from __future__ import annotations

import sqlite3
import time
from typing import TYPE_CHECKING

from stockade.coordinators.memory import wait_for_epoch
from stockade.coordinators.sqlite._rows import forget_record, forgotten_floor, load_record, set_meta, store_record
from stockade.core.leases import ScopeRecord

if TYPE_CHECKING:
    from stockade.coordinators.sqlite import SQLiteRecords

__all__ = ["SQLiteTx"]


class SQLiteTx:
    """One unit of `SQLiteRecords`: a transaction on its connection (`stockade.core.engine.RecordTx`)."""

    __slots__ = ("_records", "_conn")

    def __init__(self, records: SQLiteRecords, conn: sqlite3.Connection) -> None:
        self._records = records
        self._conn = conn

    def load(self, scope: str) -> ScopeRecord:
        return self._records.renewed(load_record(self._conn, self._records.cluster_id, scope))

    def scope_of_lease(self, lease_id: str) -> str | None:
        row = self._conn.execute("SELECT scope FROM scopes WHERE lease_id = ?", (lease_id,)).fetchone()
        return row[0] if row else None

    def leases_at_least(self, n: int) -> bool:
        row = self._conn.execute(
            "SELECT COUNT(*) >= ? FROM (SELECT 1 FROM scopes WHERE lease_id IS NOT NULL LIMIT ?)", (n, n)).fetchone()
        return bool(row[0])

    def lapsed_scopes(self, now_ns: int) -> list[str]:
        return [r[0] for r in self._conn.execute(
            "SELECT scope FROM scopes WHERE lease_id IS NOT NULL AND expires_ns <= ?", (now_ns,))]

    def names(self, *, after: str, limit: int) -> list[str]:
        return [r[0] for r in self._conn.execute(
            "SELECT scope FROM scopes WHERE scope > ? ORDER BY scope LIMIT ?", (after, limit))]

    def save(self, old: ScopeRecord, new: ScopeRecord) -> None:
        store_record(self._conn, old, new)
        ended = old.lease
        records = self._records
        if ended is not None and records.renewal_files and ended.lease_id not in records.renewing and (
            new.lease is None or new.lease.lease_id != ended.lease_id
        ):
            records.renewals.end(ended.lease_id)  # its holder (another process) is refused its next renewal

    def token_floor(self) -> int:
        row = self._conn.execute("SELECT v FROM meta WHERE k = 'forgotten_floor'").fetchone()
        return max(self._records._epoch_floor, int(row[0]) if row else 0)

    def new_epoch(self, after: int) -> int | None:
        records = self._records
        if not records.epochs:
            return None
        row = self._conn.execute("SELECT v FROM meta WHERE k = 'epoch'").fetchone()
        known = max(after, int(row[0]) if row else 0)
        epoch = wait_for_epoch(known, time.time_ns)
        set_meta(self._conn, "epoch", str(epoch))
        return epoch

    def forgotten_floor(self) -> int:
        return forgotten_floor(self._conn)

    def forget(self, record: ScopeRecord) -> None:
        forget_record(self._conn, record)

    def oldest(self, limit: int) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT scope FROM scopes ORDER BY rowid LIMIT ?", (limit,))]

    def full(self) -> bool:
        return False  # the file bounds its leases (LEASES_MAX), not its scopes
