"""The lease engine under injected record-store faults, on every record store (C1, P1).

`stockade.testing.faults.FaultyRecords` wraps the port, so the same storm runs
on the SQLite file and on memory. A unit that commits and then fails stands
for a reply lost after the token became durable: the client never learns the
token, but it was handed out, and no later grant may repeat it.
"""

from __future__ import annotations

import random
from contextlib import contextmanager

import pytest

from stockade.coordinators.memory import MemoryRecords
from stockade.coordinators.sqlite import SQLiteRecords, new_lease_id
from stockade.core.engine import LeaseEngine
from stockade.core.errors import BackendUnavailable
from stockade.core.leases import Granted
from stockade.testing.clock import ManualClock
from stockade.testing.faults import FaultPlan, FaultyRecords

ATTEMPTS = 600
SCOPES = ("a", "b", "c")


def _records(kind, tmp_path):
    if kind == "sqlite":
        return SQLiteRecords(tmp_path / "coord.db")
    return MemoryRecords()


class _AckedButLost:
    """Control: a store that discards a unit yet reports it committed (acknowledged before durable)."""

    def __init__(self, inner, rng):
        self.inner, self.rng = inner, rng

    @contextmanager
    def write(self):
        lose = self.rng.random() < 0.2
        try:
            with self.inner.write() as tx:
                yield tx
                if lose:
                    raise _Discard
        except _Discard:
            pass

    def read(self):
        return self.inner.read()

    def close(self):
        self.inner.close()


class _Discard(Exception):
    pass


def _cluster(records):
    inner = getattr(records, "inner", records)
    return getattr(inner, "cluster_id", "c0ffee00c0ffee00")


def _storm(records, seed):
    """Acquire and release at random; returns (acknowledged tokens, maybe-issued tokens) per scope."""
    rng = random.Random(seed)
    clock = ManualClock()
    engine = LeaseEngine(records, cluster_id=_cluster(records), clock=clock)
    acked: dict[str, list[int]] = {s: [] for s in SCOPES}
    unknown = 0
    for _ in range(ATTEMPTS):
        scope = rng.choice(SCOPES)
        clock.advance(rng.randrange(1, 400) * 1_000_000)  # leases of 100 ms lapse now and then
        lease_id = new_lease_id()
        try:
            outcome = engine.try_acquire(scope, lease_id=lease_id, holder="h", ttl_ms=100, wait_deadline_ns=0)
        except BackendUnavailable as exc:
            unknown += not exc.certain_no_effect
            continue
        if isinstance(outcome, Granted):
            acked[scope].append(outcome.lease.token.value)
            if rng.random() < 0.5:
                try:
                    engine.release(lease_id)
                except BackendUnavailable:
                    pass
    return acked, unknown


def _regressions(acked):
    """Grants that did not exceed every earlier acknowledged grant of their scope (P1)."""
    return sum(1 for tokens in acked.values() for i in range(1, len(tokens)) if tokens[i] <= max(tokens[:i]))


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_tokens_never_repeat_when_commits_fail(kind, tmp_path):
    rng = random.Random(7)
    records = FaultyRecords(_records(kind, tmp_path), FaultPlan(fail_before_commit=0.1, fail_after_commit=0.1), rng)
    acked, unknown = _storm(records, seed=7)
    grants = sum(len(t) for t in acked.values())
    regressions = _regressions(acked)
    print(f"\n{kind}: token regressions {regressions} of {grants} acknowledged grants; "
          f"units failed before commit {records.failed_before}, after commit {records.failed_after} "
          f"(outcome unknown to the caller: {unknown})")
    assert grants > 100 and records.failed_before > 10 and records.failed_after > 10
    assert regressions == 0
    records.close()


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_control_acknowledged_before_durable_is_caught(kind, tmp_path):
    records = _AckedButLost(_records(kind, tmp_path), random.Random(3))
    acked, _ = _storm(records, seed=3)
    regressions = _regressions(acked)
    print(f"\n{kind} control (acknowledged, then lost): token regressions {regressions}: caught")
    assert regressions > 0
    records.close()
