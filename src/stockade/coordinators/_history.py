"""The lease history: which events a record change means, and a bounded journal of them in memory.

A coordinator records, per scope, the last `HISTORY_PER_SCOPE` events
(grants, expiries, releases), and at most `HISTORY_TOTAL_MAX` in all, in the
same unit of work as the change each records (docs/history.md). The events
are read off the change itself, ``(old, new)`` as the engine saves it, so no
operation can change a record and skip its event:

- ``grant``: ``new`` holds a lease that ``old`` did not;
- ``expire``: ``old``'s lease is gone and the lock-delay was set from its
  expiry (the rule that settles a lapsed lease does exactly that);
- ``release``: ``old``'s lease is gone otherwise (given back before its expiry).

Rejections are seen by the fenced stores, not the coordinator: the embedded
SQLite store keeps them in its own journal (`stockade.resources._sqlite_journal`).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Literal

from stockade.core.leases import ScopeRecord

__all__ = ["HistoryEvent", "EventKind", "HISTORY_PER_SCOPE", "HISTORY_TOTAL_MAX", "events_of", "MemoryJournal"]

#: Events kept per scope (the oldest go first).
HISTORY_PER_SCOPE = 100
#: Events kept in all, whatever the scope (the oldest go first).
HISTORY_TOTAL_MAX = 100_000

EventKind = Literal["grant", "release", "expire", "reject"]


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One event of a scope's history.

    Attributes:
        seq: its position in the journal (increasing; never reused).
        scope: the scope.
        kind: ``grant``, ``release``, ``expire`` (or ``reject``, in a store's journal).
        holder: the lease's holder name ("" for a rejection).
        token_value: the lease's token (a rejection: the refused token).
        at_unix_ms: the wall-clock time it was recorded.
        detail: for a rejection, the reason and the mark ("stale, high-water 7").
    """

    seq: int
    scope: str
    kind: EventKind
    holder: str
    token_value: int
    at_unix_ms: int
    detail: str = ""

    def as_json(self) -> dict[str, object]:
        return {"seq": self.seq, "scope": self.scope, "kind": self.kind, "holder": self.holder,
                "token_value": self.token_value, "at_unix_ms": self.at_unix_ms, "detail": self.detail}


def events_of(old: ScopeRecord, new: ScopeRecord | None) -> list[tuple[EventKind, str, int]]:
    """``(kind, holder, token value)`` of each event the change ``old -> new`` means, in order.

    A forgotten scope (``new`` None) is idle: no lease ends there, and nothing is recorded.
    """
    if new is None:
        return []
    before, after = old.lease, new.lease
    events: list[tuple[EventKind, str, int]] = []
    if before is not None and (after is None or after.lease_id != before.lease_id):
        expired = new.delay_until_ns >= before.expires_ns
        events.append(("expire" if expired else "release", before.holder, before.token.value))
    if after is not None and (before is None or before.lease_id != after.lease_id):
        events.append(("grant", after.holder, after.token.value))
    return events


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
