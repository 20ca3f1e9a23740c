"""P11, the read/write lock: one writer or readers, never both; stale readers are told; writer tokens rise.

A read/write lock (`stockade.ReadWriteLock`, docs/rwlock.md) is a gate scope that every reader and writer
takes first, N read slots, and two check-in keys of the gate scope in a fenced store. The simulator's clients
of such a lock (`stockade.testing._sim_rwlock`) write a ``process: "rwlock"`` record when an acquisition
returned (``f: "hold"``: ``mode``, ``token``, ``lease``, the hold's lease id, ``leases``, every lease
granted on the way, and a writer's ``check_in``, the idempotency key of its check-in) and when a
reader's validation answered (``f: "validate"``: ``token``, ``seen``, the writer token it read,
``verdict``, ``invoke_ns``). P11 judges them against the coordinator's lease log and
the store's accepted check-ins:

- **exclusion**, on the coordinator's lease log in coordinator time (the axis of
  `stockade.testing.lock_delay.coordinator_log`): a writer holds from the last grant of its acquisition (the
  gate's, or the last read slot it drained) until its gate lease's release or deadline; a reader holds its
  read slot's lease from its grant until its release or deadline. No writer's hold overlaps another
  writer's or any reader's. A restart can only lengthen a lease (C3), which the log does not record, and
  after a clock the axis cannot place, holds are compared only with holds granted on the same clock: both
  can hide an overlap, never invent one.
- **readers told**: no reader's validation returns ``ok`` (it saw no newer writer) when it was invoked
  after a writer with a greater token was in (its check-in acknowledged, or its acquisition returned), in
  the history's real-time order (a writer whose check-in a restore rolled back, and listed, excepted); and
  in the store's commit order (the audit trail), no reader's check-in is accepted after a newer writer's.
- **writer tokens rise**: in the order of their holds, each writer's token is above the one before.

The exclusion rests on K2, as every lease does: a reader gives its slot back when its gate's local deadline
passed. The simulator's world of the lock keeps the clocks within the drift margin and does not jump the
coordinator's clock (docs/simulation.md); outside that, the readers-told part still holds.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stockade.client._async.rwlock import READER_KEY, WRITER_KEY
from stockade.testing._verdict import Violation
from stockade.testing.history import Op, normalize_audit, pair
from stockade.testing.lock_delay import coordinator_log

__all__ = ["check_rwlock"]


_WHO = {"read": "reader", "write": "writer"}


@dataclass(frozen=True, slots=True)
class _Hold:
    mode: str
    token: int
    client: Any
    start: int
    end: int
    epoch: int
    index: int


@dataclass(slots=True)
class _LeaseSpan:
    grant: int
    epoch: int
    end: int
    index: int
    scope: Any = None
    token: Any = None
    closed: bool = False


def _spans(records: list[dict[str, Any]]) -> dict[Any, list[_LeaseSpan]]:
    """Every grant of the coordinator's log, by lease id: its axis reading and its end (release, else last
    deadline). A lease id is granted again when a late copy of its acquire comes after it ended: each grant
    is a span of its own, and renewals and releases belong to the latest."""
    spans: dict[Any, list[_LeaseSpan]] = {}
    epoch = 0
    last_axis = 0
    for entry in coordinator_log(records):
        if entry.fresh:
            for each in spans.values():  # a clock the axis cannot place: what was open ends where it was seen
                if not each[-1].closed and each[-1].epoch == epoch:
                    each[-1].end, each[-1].closed = min(each[-1].end, last_axis), True
            epoch += 1
        last_axis = entry.axis
        lease, value = entry.value.get("lease"), entry.value
        deadline = entry.offset + int(value.get("expires_ns", value.get("at_ns", 0)))
        if entry.f == "grant":
            spans.setdefault(lease, []).append(_LeaseSpan(entry.axis, epoch, deadline, entry.index, entry.scope,
                                                          value.get("token")))
            continue
        latest = spans[lease][-1] if lease in spans else None
        if latest is not None and not latest.closed and entry.f == "renew":
            latest.end = deadline
        elif latest is not None and not latest.closed and entry.f == "release":
            latest.end, latest.closed = min(latest.end, entry.axis), True
    return spans


def _granted_before(spans: dict[Any, list[_LeaseSpan]], lease: Any, index: int,
                    answered: set[tuple[Any, Any]] | None) -> _LeaseSpan | None:
    """The grant of ``lease`` its holder was answered with: the last one logged before history index ``index``
    whose scope and token the holder's acquires were answered with (``answered``). A late copy of an acquire
    can grant the same lease id again after the lease ended (a new token, an answer nobody waits for): that
    grant is not the holder's, though it may be logged before the holder's hold record (seed 9205257). None: the
    history has no acquires of the holder (a log written by hand), the last grant logged before ``index``."""
    found: _LeaseSpan | None = None
    for span in spans.get(lease, ()):
        if span.index < index and (answered is None or (span.scope, span.token) in answered):
            found = span
    return found


def _answered(ops: list[Op]) -> dict[Any, set[tuple[Any, Any]]]:
    """Each client's answered acquires: the (scope, token value) pairs its ``ok`` acquires returned."""
    found: dict[Any, set[tuple[Any, Any]]] = {}
    for op in ops:
        if op.f == "acquire" and op.type == "ok":
            found.setdefault(op.process, set()).add((op.scope, op.token))
    return found


def _holds(records: list[dict[str, Any]], spans: dict[Any, list[_LeaseSpan]], ops: list[Op]) -> list[_Hold]:
    holds: list[_Hold] = []
    answers = _answered(ops)
    for index, record in enumerate(records):
        if record.get("process") != "rwlock" or record.get("f") != "hold":
            continue
        value = record.get("value") or {}
        answered = answers.get(value.get("client"))
        held = _granted_before(spans, value.get("lease"), index, answered)
        granted = [_granted_before(spans, lease, index, answered) for lease in value.get("leases") or ()]
        if held is None or any(g is None or g.epoch != held.epoch for g in granted):
            continue  # a grant the log does not show (or on another clock): nothing to judge it by
        start = max([held.grant] + [g.grant for g in granted if g is not None])
        if start < held.end:
            holds.append(_Hold(str(value.get("mode")), int(value.get("token", 0)), value.get("client"), start,
                               held.end, held.epoch, index))
    return holds


def _describe(hold: _Hold) -> str:
    return (f"[#{hold.index}] {_WHO.get(hold.mode, hold.mode)} c{hold.client} token {hold.token}: "
            f"held {hold.start} .. {hold.end} (coordinator time, ns)")


def _exclusion(holds: list[_Hold]) -> list[Violation]:
    found: list[Violation] = []
    ordered = sorted(holds, key=lambda h: (h.epoch, h.start))
    for i, first in enumerate(ordered):
        for second in ordered[i + 1 :]:
            if second.epoch != first.epoch or second.start >= first.end:
                break
            if "write" in (first.mode, second.mode):
                found.append(Violation("P11", f"a {_WHO.get(second.mode)} (token {second.token}) held the lock while "
                                              f"a {_WHO.get(first.mode)} (token {first.token}) did (coordinator time)",
                                       (_describe(first), _describe(second)), (first.index, second.index)))
    writers = [h for h in ordered if h.mode == "write"]
    for before, after in zip(writers, writers[1:], strict=False):
        if after.token <= before.token:
            found.append(Violation("P11", f"writer token {after.token} held the lock after writer token {before.token}",
                                   (_describe(before), _describe(after)), (before.index, after.index)))
    return found


def _rolled_back(records: list[dict[str, Any]]) -> set[Any]:
    keys: set[Any] = set()
    for record in records:
        if record.get("process") == "nemesis" and record.get("f") == "restore":
            keys.update((record.get("value") or {}).get("rolled_back") or ())
    return keys


def _readers_told(records: list[dict[str, Any]], ops: list[Op], scope: str,
                  audit: Iterable[Any] | None) -> list[Violation]:
    found: list[Violation] = []
    gone = _rolled_back(records)
    # A writer is in from its check-in's acknowledgement, or its acquisition's return if that came first (a
    # writer that never checked in is in from its return): (time, token, what it was, history index).
    entered = [(op.complete_ns, op.token or 0, op.describe(), op.invoke_index) for op in ops
               if op.f == "write" and op.type == "ok" and op.scope == scope and op.key == WRITER_KEY
               and op.idempotency_key not in gone and op.token is not None]
    entered += [(record.get("t_ns", 0), int(value.get("token", 0)), f"[#{index}] writer c{value.get('client')} "
                 f"token {value.get('token')} returned", index)
                for index, record in enumerate(records) if record.get("process") == "rwlock"
                and record.get("f") == "hold" and (value := record.get("value") or {}).get("mode") == "write"
                and value.get("check_in") not in gone]
    entered.sort(key=lambda e: e[0])
    times = [e[0] for e in entered]
    best: list[tuple[Any, int, str, int]] = []
    for event in entered:  # the greatest writer token in so far, at each entry
        best.append(event if not best or event[1] > best[-1][1] else best[-1])
    for index, record in enumerate(records):
        value = record.get("value") or {}
        if record.get("process") != "rwlock" or record.get("f") != "validate" or value.get("verdict") != "ok":
            continue
        before = bisect_left(times, int(value.get("invoke_ns", 0)))
        newest = best[before - 1] if before else None
        if newest is not None and newest[1] > int(value.get("token", 0)):
            found.append(Violation("P11", f"a reader (token {value.get('token')}) validated its read after writer "
                                          f"token {newest[1]} was in", (newest[2],
                                          f"[#{index}] validate of reader c{value.get('client')}: ok"),
                                   (newest[3], index)))
    if audit is not None:
        found += _check_in_order(ops, scope, audit)
    return found


def _check_in_order(ops: list[Op], scope: str, audit: Iterable[Any]) -> list[Violation]:
    keys = {op.idempotency_key: op for op in ops if op.f == "write" and op.scope == scope
            and op.key in (READER_KEY, WRITER_KEY)}
    found: list[Violation] = []
    newest: Op | None = None
    for entry in normalize_audit(audit):
        op = keys.get(entry.idempotency_key)
        if op is None or entry.scope != scope:
            continue
        if op.key == WRITER_KEY and (newest is None or entry.token > (newest.token or 0)):
            newest = op
        elif op.key == READER_KEY and newest is not None and entry.token < (newest.token or 0):
            found.append(Violation("P11", f"a reader's check-in (token {entry.token}) was accepted after writer "
                                          f"token {newest.token}'s", (newest.describe(), op.describe()),
                                   (newest.invoke_index, op.invoke_index)))
    return found


def check_rwlock(records: list[dict[str, Any]], scope: str, *, audit: Iterable[Any] | None = None,
                 ops: list[Op] | None = None) -> list[Violation]:
    """P11 over ``records``: the ``rwlock`` records of the lock whose gate scope is ``scope``, judged on the
    coordinator's lease log, the history's check-ins and (given) the store's audit trail.

    Returns:
        One violation per pair of overlapping holds with a writer in it, per writer token that did not rise,
        per reader's validation that returned ok after a newer writer's check-in, and per reader's check-in
        accepted after a newer writer's.
    """
    paired = ops if ops is not None else pair(records)
    holds = _holds(records, _spans(records), paired)
    return _exclusion(holds) + _readers_told(records, paired, scope, audit)
