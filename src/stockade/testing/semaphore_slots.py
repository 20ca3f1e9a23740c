"""P10, the semaphore: never more holders of its slots at once than it has slots; each slot's tokens rise.

A semaphore of N slots (`stockade.Semaphore`, docs/semaphore.md) is N scopes, each
an ordinary lease. What it promises as a whole is a count: at any moment at most N
of its slots' leases are held, and each slot's tokens strictly increase from one
holder to the next (C1 per slot), so each slot's resource can fence its holders.
The count is judged on the coordinator's own lease log, in coordinator time (the
axis of `stockade.testing.lock_delay.coordinator_log`), because it is a rule about
when the coordinator counts a lease as held (C3):

- a lease is held from its grant until its release, or until its deadline (that
  of its grant or latest renew) passes on the axis;
- at each grant, the leases of the semaphore's slots held then, the new one
  included, must be at most N; a correct coordinator never has two of one slot
  (C2), so a count above N is a holder outside the N slots (a recipe that
  miscounts its slots) or two holders of one slot;
- per slot, each grant's token is above the previous grant's.

A restart can only lengthen a lease (C3: held a full TTL from the restart), which
the log does not record: the count then leaves such a lease out early, which can
hide a violation but never invent one. So the check is sound for every correct
coordinator.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from stockade.testing._verdict import Violation
from stockade.testing.lock_delay import coordinator_log

__all__ = ["check_semaphore"]

_MS = 1_000_000


def check_semaphore(records: list[dict[str, Any]], slots: int,
                    scopes: Collection[Any] | None = None) -> list[Violation]:
    """P10 over the coordinator's lease log in ``records``: the leases of ``scopes`` (None: of every scope)
    are the holders of one semaphore of ``slots`` slots.

    Returns:
        One violation per grant that made more than ``slots`` holders at once, and per grant of a slot
        whose token is not above that slot's previous one.
    """
    found: list[Violation] = []
    held: dict[Any, tuple[Any, int, int]] = {}  # lease -> (scope, deadline on the axis, log index of its grant)
    last: dict[Any, tuple[int, int]] = {}  # scope -> (last granted token, log index)
    for entry in coordinator_log(records):
        if scopes is not None and entry.scope not in scopes:
            continue
        if entry.fresh:
            held.clear()  # deadlines on a clock that cannot be compared any more
        value, lease = entry.value, entry.value.get("lease")
        deadline = entry.offset + int(value.get("expires_ns", value.get("at_ns", 0)))
        if entry.f == "grant":
            token = int(value.get("token", 0))
            previous = last.get(entry.scope)
            if previous is not None and token <= previous[0]:
                where = f"coordinator log [#{previous[1]}], [#{entry.index}]"
                found.append(Violation("P10", f"slot {entry.scope!r}: token {token} granted after token {previous[0]}",
                                       (where,), (previous[1], entry.index)))
            last[entry.scope] = (max(token, previous[0]) if previous else token, entry.index)
            held = {other: h for other, h in held.items() if h[1] > entry.axis}
            held[lease] = (entry.scope, deadline, entry.index)
            if len(held) > slots:
                found.append(_too_many(held, slots, entry.index))
        elif lease in held and entry.f == "renew":
            scope, _, granted = held[lease]
            held[lease] = (scope, deadline, granted)
        elif entry.f == "release":
            held.pop(lease, None)
    return found


def _too_many(held: dict[Any, tuple[Any, int, int]], slots: int, index: int) -> Violation:
    holders = sorted(held.values(), key=lambda h: h[2])
    lines = tuple(f"coordinator log [#{granted}]: a lease of {scope!r} held" for scope, _, granted in holders)
    return Violation("P10", f"{len(held)} holders of a semaphore of {slots} slots at once (coordinator time), "
                            f"on {', '.join(sorted({repr(h[0]) for h in holders}))}",
                     lines, tuple(h[2] for h in holders) + (index,))
