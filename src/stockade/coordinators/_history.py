"""The lease history of a coordinator that keeps its records in memory: a bounded journal.

The events and what a change means are in `stockade.core.history`; the SQLite
file's journal is `stockade.coordinators.sqlite._journal`. Rejections are seen
by the fenced stores, not the coordinator: the embedded SQLite store keeps them
(`stockade.resources.store._sqlite_journal`).
"""

from __future__ import annotations

import threading
from collections import deque

from stockade.core.history import (
    HISTORY_PER_SCOPE,
    HISTORY_TOTAL_MAX,
    EventKind,
    HistoryEvent,
    events_of,
)

__all__ = ["HistoryEvent", "EventKind", "HISTORY_PER_SCOPE", "HISTORY_TOTAL_MAX", "events_of", "MemoryJournal",
           "Journaled"]


class Journaled:
    """A record store that journals its changes and reads them back: it says so by deriving from this.

    The embedded port reads a scope's history from its engine's record store when the store is one
    (`stockade.coordinators.history.history_of`); a record store that is not keeps no history.
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
