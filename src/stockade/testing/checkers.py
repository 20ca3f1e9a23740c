"""The checkers for P1–P7 and P9: linear-time judgements over a history and the audit trail.

Shared by the simulator and the real-process fault tests, so they read only
plain data: history records (dicts, see `stockade.testing.history`), the
resource's audit trail ``(scope, token, idempotency_key, commit_seq)``, and,
when the coordinator can provide it, its issue log ``(scope, token)`` in issue
order (a white-box oracle that also sees grants whose reply was lost).

Every checker returns `Violation` objects naming the property, what is wrong,
and the offending operations; `check` runs them all and returns a
`CheckResult`. None of them returns a bare bool.

Fault records the checkers read (``process: "nemesis"``, ``value`` a dict):

- ``f: "restore"``: ``floor`` and ``high_water`` (scope -> int) after the
  restore, ``rolled_back`` (idempotency keys of the writes it removed) and
  ``rolled_back_commit_seqs``.
- ``f: "restart-resource"``: ``high_water`` (scope -> int) after restart and
  ``commit_seq``, the audit position at the crash.

Everything else in a history is passed over. Scopes are independent: every
comparison of tokens is within one scope.

Property by property (defined in docs/rules.md):

- **P1** ok acquires of a scope never share a token, and an acquire that
  completed before another was invoked has the smaller token; the issue log,
  when given, strictly increases per scope.
- **P2** once a write with token ``y`` was accepted, no write with ``x < y``
  is accepted later: in the audit's commit order, and in real time over
  ``ok`` writes. A stale rejection must report a high-water mark above the
  token (else it is a false rejection, reported under **P8**, must be 0).
- **P3** every accepted token was issued for that scope (and cluster).
- **P4** every ``ok`` write is durable (in the audit) and is in the final read
  of its key, or was superseded by a write that could have come after it, or
  is listed by a restore as rolled back. (A rolled-back write may reappear
  later: the restore also forgot its idempotency key, so a late copy of the
  request applies again.)
- **P5** after a restore the HWM is at least the fence floor; after a restart
  at least every token committed or acknowledged before the crash.
- **P6** an idempotency key takes effect at most once (rolled back commits
  excepted).
- **P7** per scope, no accepted pattern ``A … B … A`` of tokens.
- **P9** lock-delay (C5), judged on the coordinator's own lease log:
  `stockade.testing.lock_delay`.
- **P10** a semaphore never has more holders at once than slots, and each
  slot's tokens rise, judged on the same log: `stockade.testing.semaphore_slots`.
- **P11** a read/write lock: no writer's hold overlaps another writer's or a
  reader's (on the same log), no reader's validation passes after a newer
  writer checked in, writer tokens rise: `stockade.testing.rwlock_holds`.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from stockade.testing._verdict import CheckResult, Violation
from stockade.testing._verdict import violation as _violation
from stockade.testing.history import AuditEntry, Op, normalize_audit, pair
from stockade.testing.lock_delay import check_lock_delay
from stockade.testing.rwlock_holds import check_rwlock
from stockade.testing.semaphore_slots import check_semaphore

__all__ = [
    "Violation",
    "CheckResult",
    "check",
    "check_token_order",
    "check_fencing",
    "check_provenance",
    "check_no_lost_writes",
    "check_hwm_durability",
    "check_at_most_once",
    "check_contiguity",
    "check_lock_delay",
    "check_semaphore",
    "figures",
]

STALE_ERRORS = ("stale-token", "stale")


def _nemesis(records: list[dict[str, Any]], f: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("process") == "nemesis" and r.get("f") == f]


def _rolled_back(records: list[dict[str, Any]]) -> tuple[set[Any], set[int]]:
    keys: set[Any] = set()
    seqs: set[int] = set()
    for record in _nemesis(records, "restore"):
        value = record.get("value") or {}
        keys.update(value.get("rolled_back", ()))
        seqs.update(value.get("rolled_back_commit_seqs", ()))
    return keys, seqs


# --- P1 ------------------------------------------------------------------------------------------


def check_token_order(ops: list[Op], issued: Iterable[Any] | None = None) -> list[Violation]:
    """P1: distinct tokens; real-time order of acquires; the issue log strictly increases."""
    found: list[Violation] = []
    by_scope: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        if op.f == "acquire" and op.type == "ok" and op.token is not None:
            by_scope[op.scope].append(op)  # type: ignore[index]
    for scope, acquires in by_scope.items():
        seen: dict[int, Op] = {}
        for op in acquires:
            other = seen.get(op.token)  # type: ignore[arg-type]
            if other is not None:
                found.append(_violation("P1", f"scope {scope!r}: token {op.token} granted twice", [other, op]))
            else:
                seen[op.token] = op  # type: ignore[index]
        by_complete = sorted(acquires, key=lambda o: o.complete_ns)
        best: Op | None = None
        i = 0
        for op in sorted(acquires, key=lambda o: o.invoke_ns):
            while i < len(by_complete) and by_complete[i].complete_ns < op.invoke_ns:
                candidate = by_complete[i]
                if best is None or candidate.token > best.token:  # type: ignore[operator]
                    best = candidate
                i += 1
            if best is not None and op.token < best.token:  # type: ignore[operator]
                found.append(
                    _violation(
                        "P1",
                        f"scope {scope!r}: token {op.token} granted after token {best.token} was already granted",
                        [best, op],
                    )
                )
    if issued is not None:
        last: dict[str, int] = {}
        for position, item in enumerate(issued):
            scope, token = item[0], item[1]
            if scope in last and token <= last[scope]:
                found.append(
                    Violation(
                        "P1",
                        f"scope {scope!r}: coordinator issued token {token} after {last[scope]} "
                        f"(issue #{position}; a lost or pre-crash grant counts as issued)",
                    )
                )
            last[scope] = max(token, last.get(scope, token))
    return found


# --- P2 ------------------------------------------------------------------------------------------


def _writer_index(ops: list[Op]) -> dict[Any, Op]:
    return {op.idempotency_key: op for op in ops if op.f == "write" and op.idempotency_key is not None}


def check_fencing(ops: list[Op], audit: list[AuditEntry] | None = None) -> list[Violation]:
    """P2 (no stale write accepted) and P8's false rejections (must be 0)."""
    found: list[Violation] = []
    writers = _writer_index(ops)
    if audit is not None:
        high: dict[str, AuditEntry] = {}
        for entry in audit:
            top = high.get(entry.scope)
            if top is not None and entry.token < top.token:
                found.append(
                    _violation(
                        "P2",
                        f"scope {entry.scope!r}: write with token {entry.token} committed (seq {entry.commit_seq}) "
                        f"after token {top.token} (seq {top.commit_seq})",
                        [writers.get(top.idempotency_key), writers.get(entry.idempotency_key)],
                    )
                )
            elif top is None or entry.token > top.token:
                high[entry.scope] = entry
    by_scope: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        if op.f != "write":
            continue
        if op.type == "ok" and op.token is not None:
            by_scope[op.scope].append(op)  # type: ignore[index]
        elif op.type == "fail" and op.error in STALE_ERRORS and op.high_water is not None and op.token is not None:
            if op.high_water <= op.token:
                found.append(
                    _violation(
                        "P8",
                        f"false rejection: token {op.token} rejected as stale with high-water {op.high_water}",
                        [op],
                    )
                )
    for scope, writes in by_scope.items():
        by_complete = sorted(writes, key=lambda o: o.complete_ns)
        best: Op | None = None
        i = 0
        for op in sorted(writes, key=lambda o: o.invoke_ns):
            while i < len(by_complete) and by_complete[i].complete_ns < op.invoke_ns:
                if best is None or by_complete[i].token > best.token:  # type: ignore[operator]
                    best = by_complete[i]
                i += 1
            if best is not None and op.token < best.token:  # type: ignore[operator]
                found.append(
                    _violation(
                        "P2",
                        f"scope {scope!r}: stale write accepted: token {op.token} after token {best.token} "
                        "had been acknowledged",
                        [best, op],
                    )
                )
    return found


# --- P3 ------------------------------------------------------------------------------------------


def check_provenance(
    ops: list[Op],
    audit: list[AuditEntry] | None = None,
    issued: Iterable[Any] | None = None,
    cluster: str | None = None,
) -> list[Violation]:
    """P3: every accepted token was issued for that scope (and cluster)."""
    found: list[Violation] = []
    known: dict[str, set[int]] = defaultdict(set)
    unknown_grants: set[str] = set()
    acquired: set[str] = set()
    clusters = {cluster} if cluster else set()
    if issued is not None:
        for item in issued:
            known[item[0]].add(item[1])
    for op in ops:
        if op.f != "acquire":
            continue
        acquired.add(op.scope)  # type: ignore[arg-type]
        if op.type == "ok" and op.token is not None:
            if issued is None:
                known[op.scope].add(op.token)  # type: ignore[index]
            if op.cluster and not cluster:
                clusters.add(op.cluster)
        elif op.type == "info":
            unknown_grants.add(op.scope)  # type: ignore[arg-type]
    strict = issued is not None

    def judged(scope: Any) -> bool:
        # Without an issue log, a scope whose grants are unknown (an info acquire, or none
        # recorded at all) cannot be judged from the history alone.
        return strict or (scope in acquired and scope not in unknown_grants)
    for op in ops:
        if op.f != "write" or op.type != "ok" or op.token is None:
            continue
        if op.token_scope is not None and op.token_scope != op.scope:
            found.append(_violation("P3", f"write to {op.scope!r} accepted with a token for {op.token_scope!r}", [op]))
        elif op.cluster is not None and clusters and op.cluster not in clusters:
            found.append(_violation("P3", f"write accepted with a token of foreign cluster {op.cluster}", [op]))
        elif judged(op.scope) and op.token not in known[op.scope]:  # type: ignore[index]
            found.append(_violation("P3", f"write accepted with token {op.token}, never issued for {op.scope!r}", [op]))
    if audit is not None:
        writers = _writer_index(ops)
        for entry in audit:
            if judged(entry.scope) and entry.token not in known[entry.scope]:
                found.append(
                    _violation(
                        "P3",
                        f"audit seq {entry.commit_seq}: token {entry.token} never issued for {entry.scope!r}",
                        [writers.get(entry.idempotency_key)],
                    )
                )
    return found


# --- P4 ------------------------------------------------------------------------------------------


def check_no_lost_writes(
    ops: list[Op], records: list[dict[str, Any]], audit: list[AuditEntry] | None = None
) -> list[Violation]:
    """P4: acknowledged writes are durable and visible in the final read unless superseded or listed."""
    found: list[Violation] = []
    rolled_back, _ = _rolled_back(records)
    if audit is not None:
        committed = {entry.idempotency_key for entry in audit}
        for op in ops:
            if op.f == "write" and op.type == "ok" and op.idempotency_key is not None:
                if op.idempotency_key not in committed:
                    found.append(_violation("P4", "acknowledged write is not in the resource's audit trail", [op]))
    final: dict[tuple[str, Any], Op] = {}
    for op in ops:
        if op.final and op.f == "read" and op.type == "ok":
            final[(op.scope, op.key)] = op  # type: ignore[index]
    if not final:
        return found
    writes: dict[tuple[str, Any], list[Op]] = defaultdict(list)
    for op in ops:
        if op.f == "write" and op.type in ("ok", "info", "fail") and not op.final:
            writes[(op.scope, op.key)].append(op)  # type: ignore[index]
    for where, read in final.items():
        candidates = writes.get(where, [])
        writers = [w for w in candidates if w.value == read.value and w.type != "fail"]
        failed = [w for w in candidates if w.value == read.value and w.type == "fail"]
        writer = max(writers, key=lambda w: w.complete_ns) if writers else None
        if read.value is not None and writer is None:
            if failed and not all(w.idempotency_key in rolled_back for w in failed):
                found.append(_violation("P4", f"final value of {where[0]}/{where[1]} was written by a failed write",
                                        [failed[0], read]))
            elif not failed:
                found.append(_violation("P4", f"final value {read.value!r} of {where[0]}/{where[1]} was never written",
                                        [read]))
            continue
        # A write a restore rolled back lost its idempotency record too: a late copy of its
        # request may apply it again after the restore, so it may come after anything.
        writer_done = writer.complete_ns if writer is not None and writer.idempotency_key not in rolled_back else None
        for w in candidates:
            if w.type != "ok" or w is writer or w.idempotency_key in rolled_back:
                continue
            if writer is None or (writer_done is not None and w.invoke_ns > writer_done):
                found.append(
                    _violation(
                        "P4",
                        f"acknowledged write lost: {where[0]}/{where[1]} ends as {read.value!r}",
                        [w, writer, read],
                    )
                )
    return found


# --- P5 ------------------------------------------------------------------------------------------


def check_hwm_durability(
    ops: list[Op], records: list[dict[str, Any]], audit: list[AuditEntry] | None = None
) -> list[Violation]:
    """P5: HWM after a restore ≥ the fence floor; after a restart ≥ all that was committed or acked."""
    found: list[Violation] = []
    for record in _nemesis(records, "restore"):
        value = record.get("value") or {}
        high = value.get("high_water", {})
        for scope, floor in value.get("floor", {}).items():
            if high.get(scope, 0) < floor:
                found.append(
                    Violation(
                        "P5",
                        f"restore at t={record['t_ns']} left scope {scope!r} with high-water {high.get(scope, 0)} "
                        f"below the fence floor {floor}",
                    )
                )
    restarts = _nemesis(records, "restart-resource")
    if not restarts:
        return found
    acked = sorted((op.complete_ns, op.scope, op.token, op) for op in ops
                   if op.f == "write" and op.type == "ok" and op.token is not None)
    acked_times = [a[0] for a in acked]
    for record in restarts:
        value = record.get("value") or {}
        high = value.get("high_water", {})
        need: dict[str, tuple[int, Op | None]] = {}
        if audit is not None and "commit_seq" in value:
            for entry in audit:
                if entry.commit_seq > value["commit_seq"]:
                    break
                if entry.token > need.get(entry.scope, (0, None))[0]:
                    need[entry.scope] = (entry.token, None)
        for _, acked_scope, acked_token, acked_op in acked[: bisect.bisect_left(acked_times, record["t_ns"])]:
            if acked_scope is not None and acked_token > need.get(acked_scope, (0, None))[0]:
                need[acked_scope] = (acked_token, acked_op)
        for scope, (token, op) in need.items():
            if high.get(scope, 0) < token:
                found.append(
                    _violation(
                        "P5",
                        f"resource restart at t={record['t_ns']} rolled scope {scope!r} back to high-water "
                        f"{high.get(scope, 0)} < {token}",
                        [op],
                    )
                )
    return found


# --- P6, P7 --------------------------------------------------------------------------------------


def check_at_most_once(
    ops: list[Op], records: list[dict[str, Any]], audit: list[AuditEntry] | None
) -> list[Violation]:
    """P6: an idempotency key is committed at most once (commits a restore removed excepted)."""
    if audit is None:
        return []
    _, undone = _rolled_back(records)
    counts = Counter(e.idempotency_key for e in audit if e.idempotency_key is not None and e.commit_seq not in undone)
    writers = _writer_index(ops)
    return [
        _violation("P6", f"idempotency key {key!r} took effect {n} times", [writers.get(key)])
        for key, n in counts.items()
        if n > 1
    ]


def check_contiguity(ops: list[Op], audit: list[AuditEntry] | None) -> list[Violation]:
    """P7: per scope, once the accepted token moved on from A, A never commits again."""
    if audit is None:
        return []
    found: list[Violation] = []
    writers = _writer_index(ops)
    current: dict[str, AuditEntry] = {}
    closed: dict[str, dict[int, AuditEntry]] = defaultdict(dict)
    for entry in audit:
        last = current.get(entry.scope)
        if last is not None and last.token != entry.token:
            closed[entry.scope].setdefault(last.token, last)
            earlier = closed[entry.scope].get(entry.token)
            if earlier is not None:
                found.append(
                    _violation(
                        "P7",
                        f"scope {entry.scope!r}: token {entry.token} committed again (seq {entry.commit_seq}) after "
                        f"token {last.token} (seq {last.commit_seq})",
                        [writers.get(earlier.idempotency_key), writers.get(last.idempotency_key),
                         writers.get(entry.idempotency_key)],
                    )
                )
        current[entry.scope] = entry
    return found


# --- P8 figures ----------------------------------------------------------------------------------


def figures(ops: list[Op]) -> dict[str, Any]:
    """P8 (reported, not pass/fail): outcome fractions per function, false rejections."""
    outcome: dict[str, Counter[str]] = defaultdict(Counter)
    false_rejections = 0
    for op in ops:
        outcome[op.f][op.type] += 1
        if op.f == "write" and op.type == "fail" and op.error in STALE_ERRORS:
            if op.high_water is not None and op.token is not None and op.high_water <= op.token:
                false_rejections += 1
    return {
        "operations": len(ops),
        "outcomes": {f: dict(c) for f, c in sorted(outcome.items())},
        "false_rejections": false_rejections,
    }


def check(
    records: list[dict[str, Any]],
    *,
    audit: Iterable[Any] | None = None,
    issued: Iterable[Any] | None = None,
    cluster: str | None = None,
    semaphore_slots: int | None = None,
    semaphore_scopes: Iterable[Any] | None = None,
    rwlock_scope: str | None = None,
) -> CheckResult:
    """Run P1–P7 and P9 over a history (and the audit trail and issue log when given), P10 when the
    history's leases are the holders of one semaphore, and P11 when they are a read/write lock's.

    Args:
        records: history records (dicts in the JSON-lines form).
        audit: the resource's accepted commits ``(scope, token, idempotency_key, commit_seq)``.
        issued: the coordinator's issue log ``(scope, token_value)`` in issue order.
        cluster: the coordinator cluster id the resource trusts (P3).
        semaphore_slots: every lease of the history is a holder of one semaphore of this many slots
            (P10, `stockade.testing.semaphore_slots`); None: no semaphore.
        semaphore_scopes: the semaphore's slots are the leases of these scopes only (None: of every scope).
        rwlock_scope: the gate scope of a read/write lock whose clients wrote ``rwlock`` records (P11,
            `stockade.testing.rwlock_holds`); None: no such lock.

    Returns:
        A `CheckResult`; linear (n log n) in the size of the inputs.
    """
    ops = pair(records)
    trail = normalize_audit(audit) if audit is not None else None
    issued_list = list(issued) if issued is not None else None
    violations: list[Violation] = []
    violations += check_token_order(ops, issued_list)
    violations += check_fencing(ops, trail)
    violations += check_provenance(ops, trail, issued_list, cluster)
    violations += check_no_lost_writes(ops, records, trail)
    violations += check_hwm_durability(ops, records, trail)
    violations += check_at_most_once(ops, records, trail)
    violations += check_contiguity(ops, trail)
    violations += check_lock_delay(records, ops)
    if semaphore_slots is not None:
        scopes = set(semaphore_scopes) if semaphore_scopes is not None else None
        violations += check_semaphore(records, semaphore_slots, scopes)
    if rwlock_scope is not None:
        violations += check_rwlock(records, rwlock_scope, audit=trail, ops=ops)
    return CheckResult(violations, figures(ops))

