"""P9, lock-delay (C5): after a lease expires unreleased, no grant of its scope before the delay passed.

Judged on the coordinator's own lease log, because C5 is a rule about the
coordinator's clock (C3: no other clock decides expiry), and the history's
``t_ns`` is not that clock: the coordinator's clock drifts, jumps forward,
and a failover brings another host's clock. The coordinator (the simulator's
node, or a real-process test that can see one) records, for every unit it
committed and for its crashes and restarts, one record::

    {"process": "coordinator", "type": "info", "f": F, "scope": S,
     "value": {"clock": C, "at_ns": T, ...}}

- ``F = "grant"``: ``lease`` (its id), ``token``, ``expires_ns``, ``lock_delay_ms``
- ``F = "renew"``: ``lease``, ``expires_ns`` (the new deadline)
- ``F = "release"``: ``lease`` (only a release that ended a held lease)
- ``F = "crash"``, ``F = "restart"`` (no scope): the clock reading at that moment

``C`` names the clock that ``T`` (and ``expires_ns``) were read on; it changes
only when the coordinator comes back on another clock (a failover, a reboot).
All pairs ``(C, T)`` are put on one axis of *coordinator time*: a clock
continues its own readings (a same-clock restart counts its downtime, as the
clock does), and a new clock starts where the old one was at the crash (a
failover's downtime is measured by no clock the coordinator could read, so it
does not count: the restart rule waits in full on the new clock).

The check, per scope, in log order: a grant, when the previous lease of the
scope was not released, must come at least ``lock_delay_ms`` after that
lease's last deadline (grant or renew) on the axis. This is sound for every
correct coordinator: a restart only ever extends a lease (C3) and keeps or
restarts a pending delay (C5), so the real end of the delay is never earlier.
With a zero delay it still asks that a grant not come before the previous
lease's deadline (C2 on the coordinator's clock).

Records of other processes are passed over; a history without coordinator
records has nothing to judge.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from stockade.testing._verdict import Violation
from stockade.testing.history import Op

__all__ = ["check_lock_delay", "coordinator_log", "LogEntry"]

_MS = 1_000_000


@dataclass(slots=True)
class _Held:
    lease: Any
    token: Any
    expires: int  # on the axis
    lock_delay_ns: int
    index: int
    released: bool = False


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One grant, renew or release of the coordinator's lease log, placed on the axis of coordinator time.

    Attributes:
        index: its position in the records.
        f: ``"grant"``, ``"renew"`` or ``"release"``.
        scope: its scope.
        value: its ``value`` (``lease``, ``token``, ``expires_ns``, ...).
        axis: when it happened, on the axis.
        offset: what puts a reading of its clock on the axis (``expires_ns + offset``).
        fresh: a clock came in with no reading of the old one at its end: what came before cannot be
            compared with what comes after (forget it).
    """

    index: int
    f: str
    scope: Any
    value: dict[str, Any]
    axis: int
    offset: int
    fresh: bool


def coordinator_log(records: list[dict[str, Any]]) -> Iterator[LogEntry]:
    """The coordinator's lease log in ``records``, in order, on one axis of coordinator time (the module
    docstring says how): crashes and restarts place the clocks and are not yielded. P9 reads it, and P10
    (`stockade.testing.semaphore`)."""
    base: dict[Any, int] = {}
    crash_axis: int | None = None
    fresh = False
    for index, record in enumerate(records):
        if record.get("process") != "coordinator":
            continue
        f = record.get("f")
        value = record.get("value") or {}
        clock, at = value.get("clock", 0), value.get("at_ns")
        if not isinstance(at, int):
            continue
        if clock not in base:
            if crash_axis is None and base:
                fresh = True  # another clock, and no reading of the old one at its end: cannot compare
                base[clock] = 0
            else:
                base[clock] = (crash_axis or 0) - at
        axis = at + base[clock]
        if f == "crash":
            crash_axis = axis
            continue
        if f == "restart":
            crash_axis = None
            continue
        yield LogEntry(index, str(f), record.get("scope"), value, axis, base[clock], fresh)
        fresh = False


def check_lock_delay(records: list[dict[str, Any]], ops: list[Op] | None = None) -> list[Violation]:
    """P9 over the coordinator's lease log in ``records``; ``ops`` (paired) name the acquires involved."""
    found: list[Violation] = []
    current: dict[str, _Held] = {}
    acquirers: dict[tuple[Any, Any], Op] | None = None
    for entry in coordinator_log(records):
        if entry.fresh:
            current.clear()
        index, record, f, value, axis = entry.index, records[entry.index], entry.f, entry.value, entry.axis
        scope = entry.scope
        held = current.get(scope)
        if f == "grant":
            if held is not None and not held.released and axis < held.expires + held.lock_delay_ns:
                if acquirers is None:
                    acquirers = {(op.scope, op.token): op for op in ops or ()
                                 if op.f == "acquire" and op.type == "ok"}
                found.append(_too_early(scope, held, record, index, axis, acquirers))
            current[scope] = _Held(value.get("lease"), value.get("token"),
                                   entry.offset + int(value.get("expires_ns", value["at_ns"])),
                                   int(value.get("lock_delay_ms", 0)) * _MS, index)
        elif held is not None and value.get("lease") == held.lease:
            if f == "renew":
                held.expires = entry.offset + int(value.get("expires_ns", value["at_ns"]))
            elif f == "release":
                held.released = True
    return found


def _too_early(scope: Any, held: _Held, record: dict[str, Any], index: int, axis: int,
               acquirers: dict[tuple[Any, Any], Op]) -> Violation:
    token = (record.get("value") or {}).get("token")
    early_ms = (held.expires + held.lock_delay_ns - axis) / _MS
    if axis < held.expires:
        what = f"while token {held.token}'s lease was unexpired ({(held.expires - axis) / _MS:.3f} ms left)"
    else:
        what = (f"{(axis - held.expires) / _MS:.3f} ms after token {held.token}'s lease expired unreleased, "
                f"{early_ms:.3f} ms before its lock-delay of {held.lock_delay_ns // _MS} ms passed")
    ops = [op for op in (acquirers.get((scope, held.token)), acquirers.get((scope, token))) if op is not None]
    lines = tuple(op.describe() for op in ops) + (
        f"coordinator log [#{held.index}]: grant token {held.token}; [#{index}]: grant token {token}",)
    indices = tuple(op.invoke_index for op in ops) or (held.index, index)
    return Violation("P9", f"scope {scope!r}: token {token} granted {what} (coordinator time)", lines, indices)
