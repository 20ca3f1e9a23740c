"""A bug is not an operating error: nothing catches an `InvariantViolation` and carries on.

`InvariantViolation` sits outside the `StockadeError` tree, so the places that
handle operating errors (a batch's per-write slots, the keepalive's retries)
let it through. Each test has a control with an ordinary operating error,
which those places do handle, to show the test can tell the two apart.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import stockade
from stockade.coordinators.sqlite import SQLiteCoordinator, new_lease_id
from stockade.core.errors import BackendUnavailable, InvariantViolation
from stockade.core.fence import Accept, decide
from stockade.core.leases import AcquireRequest, LeasePolicy, ScopeRecord, acquire
from stockade.core.tokens import FencingToken
from stockade.resources.store import BatchWrite, SQLiteStore

CLUSTER = "00000000000000c1"


def _lowering_rule(token, *, cluster, scope, high_water):
    """A broken fence rule: accepts, but would move the high-water mark down (R4)."""
    return Accept(token.value - 1) if scope == "broken" else decide(token, cluster=cluster, scope=scope,
                                                                    high_water=high_water)


def _batch(store: SQLiteStore, broken_scope_token: int) -> list:
    return store.apply_batch([
        BatchWrite("put", "good", "k", b"v", FencingToken(CLUSTER, "good", 1)),
        BatchWrite("put", "broken", "k", b"v", FencingToken(CLUSTER, "broken", broken_scope_token)),
    ])


def test_store_batch_does_not_commit_around_an_invariant_violation(tmp_path):
    store = SQLiteStore(tmp_path / "store.db", cluster_id=CLUSTER, keys="unsigned")
    store.put("broken", "k", b"old", token=FencingToken(CLUSTER, "broken", 5))
    store.fence_rule = _lowering_rule
    with pytest.raises(InvariantViolation, match="would go down"):
        _batch(store, broken_scope_token=5)
    assert store.get("good", "k") is None  # the good write was rolled back with the batch
    assert store.high_water("good") == 0 and store.high_water("broken") == 5
    store.close()


def test_store_batch_commits_around_an_operating_error(tmp_path):
    """Control: a stale token is an operating error; it takes its slot and the others commit."""
    store = SQLiteStore(tmp_path / "store.db", cluster_id=CLUSTER, keys="unsigned")
    store.put("broken", "k", b"old", token=FencingToken(CLUSTER, "broken", 5))
    results = _batch(store, broken_scope_token=4)
    assert isinstance(results[1], stockade.StaleToken)
    assert store.get("good", "k").value == b"v"
    store.close()


def test_coordinator_batch_does_not_commit_around_an_invariant_violation(tmp_path):
    engine = SQLiteCoordinator(tmp_path / "coord.db")
    engine.try_acquire("s", lease_id=new_lease_id(), holder="other", ttl_ms=100, wait_deadline_ns=0)
    issued = engine.last_issued("s")

    def change(scope: str, old: ScopeRecord):
        request = AcquireRequest(cluster=engine.cluster_id, scope=scope, lease_id=new_lease_id(), holder="me",
                                 ttl_ms=100, wait_deadline_ns=0)
        return old, acquire(old, request, 0, LeasePolicy())[0]

    fresh = change("t", ScopeRecord("t"))  # a good change: first grant of "t"
    stale = change("s", ScopeRecord("s"))  # computed from an outdated record of "s": a bug
    with pytest.raises(InvariantViolation):
        engine.records.commit_records([fresh, stale])
    assert engine.last_issued("t") == 0  # not committed around the bug
    assert engine.last_issued("s") == issued
    assert engine.records.commit_records([fresh]) == [None]  # control: alone, the good change commits
    assert engine.last_issued("t") == fresh[1].last_token > 0
    engine.close()


def _pause(client, seconds: float) -> None:
    if client.mode == "async":
        client.run(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)


def _lease_with_failing_renew(client, tmp_path, error: BaseException):
    coord = client.connect(f"sqlite:///{tmp_path / 'coord.db'}?process=embedded")
    calls = []

    def renew(lease_id):
        calls.append(lease_id)
        raise error

    coord._port.engine.renew = renew
    # A TTL long enough for several retries (every RENEW_RETRY_MS) even when a busy host
    # delays the keepalive task: the retries are counted, not timed.
    lease = client.run(coord.acquire("jobs", ttl_ms=2_000))
    assert client.run(lease.wait_lost(timeout_ms=15_000))
    _pause(client, 0.3)  # room for any retry to happen
    return coord, lease, calls


def _close(client, coord) -> None:
    client.run(coord.aclose() if client.mode == "async" else coord.close())


def test_keepalive_does_not_retry_an_invariant_violation(client, tmp_path):
    coord, lease, calls = _lease_with_failing_renew(client, tmp_path, InvariantViolation("renew: table broken"))
    assert len(calls) == 1  # tried once, never retried
    assert lease.lost_cause.startswith("bug while renewing")
    with pytest.raises(InvariantViolation, match="table broken"):
        client.run(lease.release())  # the bug surfaces in the caller, not only in a log
    client.run(lease.release())  # reported once; release stays idempotent
    _close(client, coord)


def test_keepalive_retries_an_operating_error(client, tmp_path):
    """Control: backend trouble is retried until the local deadline, then the lease is lost."""
    coord, lease, calls = _lease_with_failing_renew(client, tmp_path, BackendUnavailable("disk away"))
    assert len(calls) > 1
    assert lease.lost_cause.startswith("local deadline")
    client.run(lease.release())
    _close(client, coord)


@pytest.mark.parametrize("failing", [None, "b"], ids=["all-good", "one-fails"])
def test_coordinator_batch_uses_savepoints_only_when_a_change_fails(tmp_path, monkeypatch, failing):
    """A batch is written without savepoints; when a change fails (an operating error: its slot), that attempt is
    rolled back and the batch written again with a SAVEPOINT per change, so the others still commit (the control)."""
    from stockade.coordinators.sqlite import _rows

    engine = SQLiteCoordinator(tmp_path / "coord.db")
    changes = []
    for scope in ("a", "b", "c"):
        request = AcquireRequest(cluster=engine.cluster_id, scope=scope, lease_id=new_lease_id(), holder="me",
                                 ttl_ms=100, wait_deadline_ns=0)
        changes.append((ScopeRecord(scope), acquire(ScopeRecord(scope), request, 0, LeasePolicy())[0]))
    store_record = _rows.store_record

    def failing_store(conn, old, new):  # type: ignore[no-untyped-def]
        store_record(conn, old, new)
        if old.scope == failing:
            raise BackendUnavailable("disk trouble")

    monkeypatch.setattr("stockade.coordinators.sqlite.store_record", failing_store)
    statements: list[str] = []
    engine.records._conn.set_trace_callback(statements.append)
    results = engine.records.commit_records(changes)
    engine.records._conn.set_trace_callback(None)
    savepoints = sum(s.startswith("SAVEPOINT") for s in statements)
    if failing is None:
        assert results == [None, None, None] and savepoints == 0
        assert [engine.last_issued(s) > 0 for s in "abc"] == [True, True, True]
    else:
        assert results[0] is None and isinstance(results[1], BackendUnavailable) and results[2] is None
        assert savepoints == 3 and statements.count("ROLLBACK") == 1  # the first attempt, undone
        assert [engine.last_issued(s) > 0 for s in "abc"] == [True, False, True]
    engine.close()
