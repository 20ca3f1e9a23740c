"""The SQLite store's units: the buffered transaction, and the short locked unit of `admitted`.

`BufferedUnit` is what `SQLiteStore.transaction` hands its `Tx`: the steps
are kept in this process's memory (reads see them), and nothing in SQLite is
locked while the caller's code runs. When the block ends normally the store
opens one short ``BEGIN IMMEDIATE`` transaction, checks the token against the
mark *then* (R1), and applies every step or none (R6). A process that is
paused, swapped out or stuck inside the block therefore holds no lock that
other writers, of this scope or any other, would wait for.

`LockedUnit` is the unit of `SQLiteStore.admitted`: the write transaction is
open (and the write lock held) for as long as its block runs. The store uses
it only for work of its own that does not run caller code.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from stockade.core.errors import BackendUnavailable, LimitExceeded
from stockade.core.values import Item, Write, WriteResult
from stockade.resources.store._sqlite_files import get_item

if TYPE_CHECKING:
    from stockade.resources.store.sqlite_store import SQLiteStore

__all__ = ["BufferedUnit", "LockedUnit", "TX_BUFFER_BYTES_MAX", "PENDING_SEQ"]

TX_BUFFER_BYTES_MAX = 64 * 1024 * 1024  # bytes of values one open transaction may buffer in memory
PENDING_SEQ = 0  # commit_seq of a step's result before its commit (seqs start at 1)


class BufferedUnit:
    """The steps of one open `SQLiteStore.transaction`, held in memory until it commits (a `FencedUnit`).

    Attributes:
        scope: the transaction's scope.
        high_water: the mark the token was checked against at the start (the
            commit checks again).
        writes: the buffered steps, in order.
    """

    def __init__(self, store: SQLiteStore, scope: str, high_water: int) -> None:
        self.scope = scope
        self.high_water = high_water
        self.writes: list[Write] = []
        self._store = store
        self._overlay: dict[str, Item | None] = {}  # this transaction's view of the keys it wrote
        self._bytes = 0

    def apply(self, write: Write, *, token_value: int) -> WriteResult:
        """Buffer one step. Its result's ``commit_seq`` is `PENDING_SEQ` until the commit."""
        if self._bytes + len(write.value) > TX_BUFFER_BYTES_MAX:
            raise LimitExceeded("TX_BUFFER_BYTES_MAX", TX_BUFFER_BYTES_MAX, "values buffered by one transaction")
        self._bytes += len(write.value)
        self.writes.append(write)
        self._overlay[write.key] = (
            Item(self.scope, write.key, write.value, token_value, PENDING_SEQ) if write.op == "put" else None
        )
        return WriteResult(self.scope, write.key, token_value, self.high_water, PENDING_SEQ, replayed=False)

    def get(self, key: str) -> Item | None:
        """``key`` as this transaction sees it: its own steps first, else the store (a short read)."""
        if key in self._overlay:
            return self._overlay[key]
        return self._store.get(self.scope, key)


class LockedUnit:
    """The open IMMEDIATE transaction of `SQLiteStore.admitted` (a `FencedUnit`)."""

    def __init__(self, store: SQLiteStore, conn: sqlite3.Connection, scope: str, high_water: int) -> None:
        self.scope = scope
        self.high_water = high_water
        self.failed = False  # a step failed inside SQLite: the transaction must not commit
        self._store = store
        self._conn = conn

    def apply(self, write: Write, *, token_value: int) -> WriteResult:
        try:
            return self._store._apply(self._conn, write, token_value, self.high_water)
        except sqlite3.Error as exc:
            self.failed = True
            raise BackendUnavailable(f"transaction step failed: {exc}", certain_no_effect=True) from exc

    def get(self, key: str) -> Item | None:
        try:
            return get_item(self._conn, self.scope, key)
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"transaction read failed: {exc}", certain_no_effect=True) from exc
