"""The ZooKeeper coordinator's lease journal, sans-IO: its nodes, the scope's journal record, the events.

Each scope's journal lives under ``<chroot>/stockade/hist`` (docs/history.md)::

    hist/<scope>          the scope's journal record (persistent), JSON:
                          {"n": events written, "floor": lowest event number kept,
                           "open": [token, holder] of the grant not yet ended, or null,
                           "queued": an upper bound on the queue nodes besides the open grant's}
    hist/<scope>/e-<n>    event number n (persistent), JSON [kind, holder, token, slot]

Every transaction that changes who holds the scope sets the record **with the
version it read** (a compare-and-set) and creates the events in the same
transaction, so the change, its events and the record land together or not
at all, and two writers cannot both think they wrote event ``n + 1``. The
record's event count names the node that falls out of the window, which the
same transaction deletes (the last `HISTORY_PER_SCOPE` are kept).

``queued`` is what lets an uncontended grant be journaled in its enqueue's
transaction: every enqueue sets the record, so a record with no open grant
and ``queued == 0`` at version ``v`` means that the queue was empty at ``v``;
a compare-and-set on ``v`` in the enqueue makes the new node the holder,
with nobody before it. Nodes leave the queue without a write (an expired
session, a waiter that gave up), so ``queued`` can only be too high, never
too low; the next waiter that finds itself first counts the queue again.

A token of `OWN_ZXID` in the record or in an event stands for the zxid of
the transaction that wrote it (the record's ``mzxid``, the event's
``czxid``): the enqueue that creates the holder's node cannot know its czxid
before it commits, and it is that same zxid.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from stockade.core.journal import HISTORY_PER_SCOPE, HISTORY_TOTAL_MAX, EventKind, HistoryEvent

__all__ = ["EventKind", "OWN_ZXID", "JournalRecord", "JournalWrite", "record_of", "initial_record", "plan",
           "event_number",
           "event_of", "event_name", "HISTORY_PER_SCOPE", "HISTORY_TOTAL_MAX", "SLOTS_MAX"]

#: In a record or an event: the token is the zxid of the transaction that wrote it.
OWN_ZXID = -1
#: Events one transaction writes at most (an expiry it settles, and a grant); they share one zxid.
SLOTS_MAX = 2
_EVENT_PREFIX = "e-"
_KINDS = ("grant", "release", "expire")


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """A scope's journal record as read at ``version`` (-1: not read; the node does not exist yet)."""

    count: int = 0
    floor: int = 1
    open_token: int = 0
    open_holder: str = ""
    queued: int = 0
    version: int = -1

    @property
    def free(self) -> bool:
        """No grant open and nobody queued: an enqueue on this version is the holder at once."""
        return self.open_token == 0 and self.queued == 0


def initial_record() -> bytes:
    return _value(0, 1, 0, "", 0)


def _value(count: int, floor: int, open_token: int, open_holder: str, queued: int) -> bytes:
    shown = [open_token, open_holder] if open_token else None
    return json.dumps({"n": count, "floor": floor, "open": shown, "queued": queued}).encode()


def record_of(data: bytes, stat: Any) -> JournalRecord:
    """The record read with its ``stat`` (an unreadable one counts as empty, at that version)."""
    try:
        shown = json.loads(data or b"{}")
        count, floor, queued = int(shown.get("n", 0)), int(shown.get("floor", 1)), int(shown.get("queued", 0))
        token, holder = shown.get("open") or (0, "")
        token = stat.mzxid if int(token) == OWN_ZXID else int(token)
        return JournalRecord(count, max(1, floor), token, str(holder), max(0, queued), stat.version)
    except (ValueError, TypeError, AttributeError):
        return JournalRecord(version=stat.version)


def event_name(number: int) -> str:
    return f"{_EVENT_PREFIX}{number:019d}"


def event_number(name: str) -> int | None:
    """An event node's number (``e-0000000000000000012`` -> 12); None for anything else."""
    digits = name[len(_EVENT_PREFIX):]
    return int(digits) if name.startswith(_EVENT_PREFIX) and digits.isdigit() else None


def event_of(scope: str, data: bytes, stat: Any) -> HistoryEvent | None:
    """The event an event node holds: ``seq`` = 2 × its czxid + its slot in the transaction, its
    time the node's ``ctime`` (the server's clock); None if unreadable."""
    try:
        kind, holder, token, slot = json.loads(data)
        if kind not in _KINDS or not 0 <= int(slot) < SLOTS_MAX:
            return None
        value = stat.czxid if int(token) == OWN_ZXID else int(token)
        return HistoryEvent(stat.czxid * SLOTS_MAX + int(slot), scope, kind, str(holder), value, int(stat.ctime))
    except (ValueError, TypeError):
        return None


@dataclass(frozen=True, slots=True)
class JournalWrite:
    """What one transaction adds for the journal: the record's compare-and-set, the events, the trims."""

    record_path: str
    record_value: bytes
    version: int
    creates: tuple[tuple[str, bytes], ...] = ()
    deletes: tuple[str, ...] = ()
    after: JournalRecord = field(default_factory=JournalRecord)

    def add_to(self, tx: Any) -> None:
        """Add the ops to a kazoo transaction: the record first (its result says what the record became)."""
        tx.set_data(self.record_path, self.record_value, version=self.version)
        for path, value in self.creates:
            tx.create(path, value)
        for path in self.deletes:
            tx.delete(path)


def plan(record_path: str, record: JournalRecord, events: list[tuple[EventKind, str, int]], *,
         open_token: int, open_holder: str, queued: int, per_scope: int | None = None) -> JournalWrite:
    """The journal's part of a transaction that writes ``events`` and leaves the record with that
    open grant (``open_token`` 0: none; `OWN_ZXID`: this transaction's) and ``queued``.

    Events numbered ``count + 1 ..`` are created; those falling out of the last ``per_scope``
    are deleted (only those still kept: a global trim may have taken some already).
    """
    if len(events) > SLOTS_MAX:
        raise ValueError(f"at most {SLOTS_MAX} events in one transaction")
    keep = HISTORY_PER_SCOPE if per_scope is None else per_scope
    count = record.count + len(events)
    floor = max(record.floor, count - keep + 1)
    creates = tuple((f"{record_path}/{event_name(record.count + 1 + slot)}",
                     json.dumps([kind, holder, token, slot]).encode())
                    for slot, (kind, holder, token) in enumerate(events))
    deletes = tuple(f"{record_path}/{event_name(number)}"
                    for number in range(record.floor, min(floor, record.count + 1)))
    after = JournalRecord(count, floor, open_token, open_holder if open_token else "", max(0, queued),
                          record.version + 1)
    return JournalWrite(record_path, _value(count, floor, open_token, open_holder, max(0, queued)),
                        record.version, creates, deletes, after)
