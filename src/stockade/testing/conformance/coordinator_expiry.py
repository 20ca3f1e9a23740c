"""The coordinator suite's expiry: how a lease ends, C3 and C5, and the client's loss of it (K2).

The keepalive holds a lease past its TTL, one granted after a long wait too; a lease is lost by
its local deadline without keepalive, by a renewal the coordinator refuses, by a renewal after its
release, and when its handle closes (its keepalive ends with it). After a lapse the scope is not
granted again before the lock-delay has passed, and after a release it is at once (C5), also
across a coordinator restart. Part of `stockade.testing.conformance.coordinator`, which runs it;
its ``delayed_backend`` fixture makes a `DelayedBackend`.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import pytest

import stockade
from stockade import LeaseLost
from stockade.testing.conformance.coordinator_helpers import (
    _MS,
    _WAIT_S,
    _acquiring,
    _await_lapse,
    _await_waiters,
    _close,
    _follows,
    _in_background,
)

#: The C5 tests' lock-delay: far longer than a release takes to hand a scope over, short enough to wait out
#: on every backend, sync and async.
LOCK_DELAY_MS = 1_000
#: The restart test's: a restarted served coordinator (a new `stockade serve` on the same data) fits in it.
RESTART_LOCK_DELAY_MS = 2_000
#: The TTL of a holder left to lapse (etcd rounds it up to whole seconds).
LAPSE_TTL_MS = 1_000


class DelayedBackend(Protocol):
    """The backend under test with a lock-delay (``delayed_backend(lock_delay_ms)``).

    Attributes:
        lock_delay_ms: its lock-delay (what the test asked, or more for a slow restart).
        not_restartable: None, or in words why nothing of this backend can be restarted
            (an in-process coordinator); the restart test is skipped with that reason.
    """

    lock_delay_ms: int
    not_restartable: str | None

    def connect(self, client: Any) -> Any:
        """A client handle (``client.connect``) on the coordinator, with the lock-delay."""
        ...

    def restart(self) -> None:
        """Restart the coordinator, every handle closed: what decides C5 comes back from its records
        (a served coordinator: its process; otherwise the handles opened after are the restarted ones)."""
        ...


def test_keepalive_holds_lease_past_ttl(client, coord_url):
    # A TTL of 2 s, held for 2.2 TTLs: with 200 ms, a loaded host (3 test workers) once
    # stalled a PostgreSQL renewal past the local deadline, and with 1 s (load 12-14) a
    # ZooKeeper one.
    coord = client.connect(coord_url)
    lease = client.run(coord.acquire("k", ttl_ms=2000))
    time.sleep(4.4) if client.mode == "sync" else client.run(__import__("asyncio").sleep(4.4))
    assert not lease.lost
    assert client.run(coord.inspect("k")).token == lease.token
    client.run(lease.release())


def test_lease_granted_after_a_long_wait_is_kept_alive(client, coord_url):
    # The grant comes long after the request was sent (more than the TTL): the
    # lease must not count as lost at once, and the keepalive must hold it.
    # TTLs of 3 s and 2 s: with 0.3 s (and once with 0.6 s), a loaded host (3 test workers)
    # stalled the renewals past the local deadline; with 1 s, once at a load of 13 (6 workers), the
    # grant's first renewal came more than 1 s after its commit.
    coord = client.connect(coord_url)
    first = client.run(coord.acquire("k", ttl_ms=3_000, keepalive=False))
    lease = client.run(coord.acquire("k", ttl_ms=2_000, wait_ms=15_000))
    assert _follows(coord, lease.token.value, first.token.value)
    assert not lease.lost
    time.sleep(2.5) if client.mode == "sync" else client.run(__import__("asyncio").sleep(2.5))
    assert not lease.lost
    assert client.run(coord.inspect("k")).token == lease.token
    client.run(lease.release())


def test_lease_lost_without_keepalive_by_local_deadline(client, coord_url):
    coord = client.connect(coord_url)
    # 2 s: under a load average of 15, a ZooKeeper grant once came back after a 400 ms TTL had lapsed.
    lease = client.run(coord.acquire("k", ttl_ms=2000, keepalive=False))
    assert not lease.lost
    assert client.run(lease.wait_lost(timeout_ms=5000)) is True
    with pytest.raises(LeaseLost):
        lease.raise_if_lost()
    with pytest.raises(LeaseLost):
        client.run(lease.renew())


def test_lease_lost_when_coordinator_refuses_renewal(client, coord_url):
    coord = client.connect(coord_url)
    # Renewed every 1 s, refused at the first: with 1 s (renewed every 333 ms) a renewal late at load could let
    # the local deadline end it first.
    lease = client.run(coord.acquire("k", ttl_ms=3000))
    # Somebody with the lease id (an operator) releases it: the next renewal is refused.
    other = stockade.connect(coord_url)
    other._port.release(lease.lease_id)
    other.close()
    assert client.run(lease.wait_lost(timeout_ms=5000)) is True
    assert "refused" in lease.lost_cause


def test_c5_lock_delay_after_a_lapse_not_after_a_release(client, delayed_backend):
    backend = delayed_backend(LOCK_DELAY_MS)
    coord = backend.connect(client)
    delay_ns = LOCK_DELAY_MS * _MS
    # After a release: at once, for the next acquire and for a waiter the release wakes.
    client.run(client.run(coord.acquire("c5", ttl_ms=2_000)).release())
    sent_ns = time.monotonic_ns()
    again = client.run(coord.acquire("c5", ttl_ms=2_000))
    assert time.monotonic_ns() - sent_ns < delay_ns, "held back after a release"
    join = _in_background(client, _acquiring(client, coord, "c5", ttl_ms=2_000, wait_ms=_WAIT_S * 1000))
    _await_waiters(client, coord, "c5", 1)
    released_ns = time.monotonic_ns()
    client.run(again.release())
    woken, woken_ns = join()
    assert woken_ns - released_ns < delay_ns, "a waiter was held back after a release"
    client.run(woken.release())
    # After a lapse (never renewed, never released): not before the delay has passed since.
    start_ns = time.monotonic_ns()
    lapsed = client.run(coord.acquire("c5", ttl_ms=LAPSE_TTL_MS, keepalive=False))
    join = _in_background(client, _acquiring(client, coord, "c5", ttl_ms=2_000, wait_ms=_WAIT_S * 1000))
    before_ns = _await_lapse(client, coord, "c5", lapsed, start_ns)
    lease, granted_ns = join()
    assert lease.token.value > lapsed.token.value
    early_ms = (before_ns + delay_ns - granted_ns) / _MS
    assert granted_ns >= before_ns + delay_ns, f"granted {early_ms:.0f} ms before the lock-delay had passed"
    client.run(lease.release())
    _close(client, coord)


def test_c5_a_pending_lock_delay_outlives_a_restart(client, delayed_backend):
    backend = delayed_backend(RESTART_LOCK_DELAY_MS, restart=True)
    if backend.not_restartable:
        pytest.skip(backend.not_restartable)
    delay_ns = backend.lock_delay_ms * _MS
    coord = backend.connect(client)
    start_ns = time.monotonic_ns()
    lapsed = client.run(coord.acquire("c5-restart", ttl_ms=LAPSE_TTL_MS, keepalive=False))
    before_ns = _await_lapse(client, coord, "c5-restart", lapsed, start_ns)
    _close(client, coord)
    backend.restart()
    coord = backend.connect(client)
    restarted_ns = time.monotonic_ns()
    # Else this test proves nothing: the delay would be over whatever the restart kept.
    assert restarted_ns < before_ns + delay_ns, f"the restart took {(restarted_ns - before_ns) / _MS:.0f} ms"
    lease = client.run(coord.acquire("c5-restart", ttl_ms=2_000, wait_ms=_WAIT_S * 1000))
    granted_ns = time.monotonic_ns()
    assert lease.token.value > lapsed.token.value
    early_ms = (before_ns + delay_ns - granted_ns) / _MS
    assert granted_ns >= before_ns + delay_ns, f"granted {early_ms:.0f} ms before the lock-delay had passed"
    client.run(lease.release())
    _close(client, coord)


def test_renew_after_release_is_lease_lost(client, coord_url):
    coord = client.connect(coord_url)
    lease = client.run(coord.acquire("r", ttl_ms=1000, keepalive=False))
    client.run(lease.renew())
    client.run(lease.release())
    with pytest.raises(LeaseLost):
        client.run(lease.renew())


def test_closing_the_handle_stops_its_keepalives(client, coord_url):
    # A lease left held when its handle closed went on renewing against a closed
    # backend (a closed database, a closed session) until its deadline, logging each failure.
    coord = client.connect(coord_url)
    # 10 s: lost by the close, not by a renewal late at load.
    lease = client.run(coord.acquire("closing", ttl_ms=10_000))
    released = client.run(coord.acquire("closing-released", ttl_ms=10_000))
    client.run(released.release())
    client.run(coord.aclose() if client.mode == "async" else coord.close())
    assert lease.lost and "closed" in lease.lost_cause
    assert not released.lost  # released before the close: not lost
    assert lease._background == []  # no renewal queued or running
    assert lease._due is None and lease._deadline_due is None  # nothing of the lease's left on the timer


__all__ = [name for name in dir() if name.startswith("test_")]
