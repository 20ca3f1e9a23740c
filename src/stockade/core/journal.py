"""A lease history's events, pure: which events a record change means (docs/history.md).

A coordinator journals, per scope, the last `HISTORY_PER_SCOPE` events
(grants, expiries, releases), and at most `HISTORY_TOTAL_MAX` in all, in the
same unit of work as the change each records. The events are read off the
change itself, ``(old, new)`` as the engine saves it, so no operation can
change a record and skip its event:

- ``grant``: ``new`` holds a lease that ``old`` did not;
- ``expire``: ``old``'s lease is gone and the lock-delay was set from its
  expiry (the rule that settles a lapsed lease does exactly that);
- ``release``: ``old``'s lease is gone otherwise (given back before its expiry).

A fenced store's refusals (``reject``) are journaled by the store itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stockade.core.leases import ScopeRecord

__all__ = ["HistoryEvent", "EventKind", "HISTORY_PER_SCOPE", "HISTORY_TOTAL_MAX", "events_of"]

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
