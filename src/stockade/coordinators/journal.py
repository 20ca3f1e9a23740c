"""The lease journal of a coordinator: what keeps it, and reading it (docs/history.md).

Every coordinator journals each scope's grants, expiries and releases in the same unit of work as the
change (the events, and what a change means, are pure: `stockade.core.journal`). Where each journal is:

- ``memory://``: `MemoryJournal`, here, bounded, in memory;
- the SQLite file: a table of its own (`stockade.coordinators.sqlite._journal`); ``stockade serve``
  keeps its table in memory and group-commits it to its coordinator file, journal included, so its
  history is read from the file: what has committed;
- PostgreSQL: a table of its own, in the transaction of each change
  (`stockade.coordinators.postgres._journal`);
- etcd: in etcd, in the Txn of each change (`stockade.coordinators.etcd._journal`), read through its
  port (`stockade.coordinators.etcd._async.journal`); ZooKeeper: in the ensemble, in the transaction
  of each change (`stockade.coordinators.zookeeper._journal`), read through its port.

The record stores of the first three are `Journaled`, and `history_of` reads them for the engine
port. Rejections are seen by the fenced stores, not the coordinator: the embedded SQLite store keeps
them (`stockade.resources.store._sqlite_journal`). The checker's operation history of a test run is
another thing (`stockade.testing.history`).
"""

from __future__ import annotations

import threading
from collections import deque

from stockade.core.errors import InvalidArgument
from stockade.core.journal import (
    HISTORY_PER_SCOPE,
    HISTORY_TOTAL_MAX,
    EventKind,
    HistoryEvent,
    events_of,
)
from stockade.core.limits import validate_int, validate_scope

__all__ = ["HistoryEvent", "EventKind", "HISTORY_PER_SCOPE", "HISTORY_TOTAL_MAX", "events_of", "MemoryJournal",
           "Journaled", "history_of"]



class Journaled:
    """A record store that journals its changes and reads them back: it says so by deriving from this.

    The embedded port reads a scope's history from its engine's record store when the store is one
    (`stockade.coordinators.journal.history_of`); a record store that is not keeps no history.
    """

    def history(self, scope: str, limit: int) -> list[HistoryEvent]:
        """The scope's last ``limit`` events, oldest first (what has committed)."""
        raise NotImplementedError


class MemoryJournal:
    """The history of a coordinator that keeps its records in memory (``memory://``): bounded, in order.

    Thread-safe. Events are added at the commit of their unit (`add`), never before.
    """

    def __init__(self, *, per_scope: int = HISTORY_PER_SCOPE, total_max: int = HISTORY_TOTAL_MAX) -> None:
        self.per_scope = per_scope
        self.total_max = total_max
        self._by_scope: dict[str, deque[HistoryEvent]] = {}
        self._all: deque[HistoryEvent] = deque()
        self._seq = 0
        self._lock = threading.Lock()

    def add(self, scope: str, kind: EventKind, holder: str, token_value: int, at_unix_ms: int) -> None:
        with self._lock:
            self._seq += 1
            event = HistoryEvent(self._seq, scope, kind, holder, token_value, at_unix_ms)
            events = self._by_scope.setdefault(scope, deque(maxlen=self.per_scope))
            events.append(event)
            self._all.append(event)
            while len(self._all) > self.total_max:
                oldest = self._all.popleft()
                kept = self._by_scope.get(oldest.scope)
                if kept and kept[0] is oldest:
                    kept.popleft()
                    if not kept:
                        del self._by_scope[oldest.scope]

    def history(self, scope: str, limit: int) -> list[HistoryEvent]:
        """The scope's last ``limit`` events, oldest first."""
        with self._lock:
            events = list(self._by_scope.get(scope, ()))
        return events[-limit:]


def history_of(records: object, scope: str, limit: int = HISTORY_PER_SCOPE) -> list[HistoryEvent]:
    """The last ``limit`` events of ``scope`` in a record store, oldest first.

    Raises:
        InvalidArgument: a bad scope or limit, or a record store that keeps no history.
    """
    validate_scope(scope)
    validate_int("limit", limit, 1, HISTORY_PER_SCOPE)
    if isinstance(records, Journaled):  # memory://, the SQLite file, PostgreSQL: each reads its own journal
        return records.history(scope, limit)
    raise InvalidArgument("url", f"this coordinator ({type(records).__name__}) keeps no lease history")
