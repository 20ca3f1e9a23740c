"""The coordinator conformance suite: what every coordinator backend must do, through the client.

Every test runs through the public Python API, sync and async from one source,
so it checks the coordinator port (acquire with waiting, renew, release,
inspect, scopes, last issued), the rules C1-C5 as a user meets them, and the
client's lease objects and keepalive on top.

Run it by importing its tests into a test module (``from
stockade.testing.conformance.coordinator import *``) and providing five
fixtures:

- ``client``: a runner with ``mode`` (``"sync"`` or ``"async"``),
  ``connect(url, **options)`` and ``open_store(url)`` (the client's own
  functions), ``run(x)``, which awaits ``x`` in async mode and returns it in
  sync mode, and in async mode ``loop``, the event loop ``run`` drives;
- ``coord_url``: a url of the backend under test, fresh for each test;
- ``store_url``: a fenced store that trusts that backend's tokens;
- ``delayed_backend``: ``delayed_backend(lock_delay_ms, restart=False)`` opens
  the backend under test with that lock-delay (C5), as a `DelayedBackend`;
  with ``restart``, one whose restart is slow (a new server process) may take
  a longer delay, so that the restart lands while the delay is pending;
- ``capped_wait``: the backend as a wait until granted meets it (`CappedWait`):
  its url with a small per-request wait cap where it has one.

C4 and C5 are judged by order and by lower bounds on time, which a busy host
cannot break: a grant after a lapse must come at least the lock-delay after
the last look that still saw the lapsed lease held; a grant after a release,
before the lock-delay (a second) could have passed.

The project's own run (tests/test_coordinator_conformance.py, fixtures in
tests/conftest.py) takes every scheme of
`stockade.coordinators.registry.COORDINATORS`: the SQLite file, the in-memory
engine, and a real `stockade serve` subprocess over HTTP. It runs each case on
each backend in one mode by default, sync and async alternating by case and by
backend, and in both modes with ``STOCKADE_LONG=1``: the sync client is
generated from the async source, and the run checks that they are equal.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import pytest

import stockade
from stockade import InvalidArgument, LeaseLost, LockTimeout, StaleToken
from stockade.coordinators.registry import Capability
from stockade.core.limits import CONTENDERS_MAX

#: The C5 tests' lock-delay: far longer than a release takes to hand a scope over, short enough to wait out
#: on every backend, sync and async.
LOCK_DELAY_MS = 1_000
#: The restart test's: a restarted served coordinator (a new `stockade serve` on the same data) fits in it.
RESTART_LOCK_DELAY_MS = 2_000
#: The TTL of a holder left to lapse (etcd rounds it up to whole seconds).
LAPSE_TTL_MS = 1_000
#: The C4 test's waiters, queued one after another.
FIFO_WAITERS = 4
#: The contention case's handles, opened at once, and the lock cycles each runs (every other one on the scope
#: they share): a stale read under contention failed about one call in ten, so ~50 shared tries find one.
CONTENDING_HANDLES = 4
CONTENDED_CYCLES = 24
_MS = 1_000_000
_WAIT_S = 30


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


def _close(client, coord) -> None:
    client.run(coord.aclose() if client.mode == "async" else coord.close())


def _acquiring(client, coord, scope: str, **options: Any) -> Callable[[], Any]:
    """A call that acquires ``scope`` and returns ``(lease, monotonic ns once it returned)``."""

    async def acquire_async() -> tuple[Any, int]:
        lease = await coord.acquire(scope, **options)
        return lease, time.monotonic_ns()

    def acquire_sync() -> tuple[Any, int]:
        lease = coord.acquire(scope, **options)
        return lease, time.monotonic_ns()

    return acquire_async if client.mode == "async" else acquire_sync


def _in_background(client, call: Callable[[], Any]) -> Callable[[], Any]:
    """Start ``call()`` beside the test (a thread; in async mode a task on the runner's loop, which
    runs whenever the test awaits through ``client.run``). Returns ``join()``: its result, or its error."""
    if client.mode == "async":
        task = client.loop.create_task(call())

        async def join_async() -> Any:
            return await task

        return lambda: client.run(join_async())
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to join()
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> Any:
        thread.join(2 * _WAIT_S)
        assert not thread.is_alive(), f"a waiter did not return in {2 * _WAIT_S} s"
        if "error" in box:
            raise box["error"]
        return box["value"]

    return join


def _await_waiters(client, coord, scope: str, count: int) -> None:
    deadline = time.monotonic() + _WAIT_S
    while client.run(coord.inspect(scope)).waiters < count:
        assert time.monotonic() < deadline, f"{count} waiter(s) not queued on {scope!r} in {_WAIT_S} s"
        if client.mode == "sync":
            time.sleep(0.005)


def _await_lapse(client, coord, scope: str, lapsed, start_ns: int) -> int:
    """Look at ``scope`` until ``lapsed`` holds it no more; a time before the lapse, as late as known:
    when the last look that still saw it held began (``start_ns``, sent before its grant, at first)."""
    before_ns = start_ns
    deadline = time.monotonic() + _WAIT_S
    while True:
        look_ns = time.monotonic_ns()
        token = client.run(coord.inspect(scope)).token
        if token is None or token.value != lapsed.token.value:
            return before_ns
        before_ns = look_ns
        assert time.monotonic() < deadline, f"the lease on {scope!r} did not lapse in {_WAIT_S} s"


def _follows(coord, value: int, previous: int) -> bool:
    """Is ``value`` the scope's next token after ``previous``?

    ``previous + 1`` where the backend counts per scope (`Capability.DENSE_TOKENS`);
    otherwise only greater (etcd: a create revision, which other keys advance too).
    """
    return value == previous + 1 if Capability.DENSE_TOKENS in coord.capabilities else value > previous


def test_acquire_release_tokens_increase(client, coord_url):
    coord = client.connect(coord_url)
    tokens = []
    for _ in range(5):
        lease = client.run(coord.acquire("jobs", ttl_ms=1000))
        tokens.append(lease.token.value)
        client.run(lease.release())
        client.run(lease.release())  # idempotent
    # Dense: each the previous + 1 (the first: its epoch's).
    assert all(_follows(coord, b, a) for a, b in zip(tokens, tokens[1:], strict=False))
    info = client.run(coord.inspect("jobs"))
    assert info.state is stockade.ScopeState.FREE and info.last_token == tokens[-1]
    client.run(coord.aclose() if client.mode == "async" else coord.close())


def test_lock_block_and_context_token(client, coord_url, store_url):
    coord = client.connect(coord_url)
    store = client.open_store(store_url, cluster_id=coord.cluster_id)

    async def body_async():
        async with coord.lock("reports", ttl_ms=10_000) as lease:  # a loaded host's late renewal cannot lose it
            await store.put("reports", "k", b"v1")  # token from the context (K1)
            assert (await store.high_water("reports")) == lease.token.value
        with pytest.raises(InvalidArgument):
            await store.put("reports", "k", b"v2")  # no lease in context any more

    def body_sync():
        with coord.lock("reports", ttl_ms=10_000) as lease:
            store.put("reports", "k", b"v1")
            assert store.high_water("reports") == lease.token.value
        with pytest.raises(InvalidArgument):
            store.put("reports", "k", b"v2")

    client.run(body_async() if client.mode == "async" else body_sync())
    item = client.run(store.get("reports", "k"))
    assert item.value == b"v1"


def test_stale_token_rejected_after_newer_grant(client, coord_url, store_url):
    coord = client.connect(coord_url)
    store = client.open_store(store_url, cluster_id=coord.cluster_id)
    old = client.run(coord.acquire("s", ttl_ms=1000, keepalive=False))
    client.run(old.release())
    new = client.run(coord.acquire("s", ttl_ms=1000))
    client.run(store.put("s", "k", "new", token=new.token))
    with pytest.raises(StaleToken) as info:
        client.run(store.put("s", "k", "old", token=old.token))
    assert info.value.high_water == new.token.value and info.value.token == old.token
    assert client.run(store.get("s", "k")).value == b"new"
    client.run(new.release())


def test_wait_times_out_then_fifo_grant(client, coord_url):
    coord = client.connect(coord_url)
    held = client.run(coord.acquire("q", ttl_ms=10_000))  # held until released, however late its renewals
    first = held.token.value
    t0 = time.monotonic()
    with pytest.raises(LockTimeout):
        client.run(coord.acquire("q", ttl_ms=1000, wait_ms=150))
    assert time.monotonic() - t0 >= 0.14
    client.run(held.release())
    lease = client.run(coord.acquire("q", ttl_ms=1000, wait_ms=0))
    assert _follows(coord, lease.token.value, first)  # dense: the timed-out waiter took no token
    client.run(lease.release())


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


def test_waiter_is_granted_when_holder_releases(client, coord_url):
    coord = client.connect(coord_url)
    held = client.run(coord.acquire("fifo", ttl_ms=5000))

    async def body_async():
        import asyncio

        waiter = asyncio.ensure_future(coord.acquire("fifo", ttl_ms=5000, wait_ms=5000))
        await asyncio.sleep(0.2)
        assert not waiter.done()
        t0 = time.monotonic()
        await held.release()
        lease = await waiter
        return lease, time.monotonic() - t0

    def body_sync():
        import threading

        got = {}
        def wait() -> None:
            got["lease"] = coord.acquire("fifo", ttl_ms=5000, wait_ms=5000)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.2)
        assert thread.is_alive()
        t0 = time.monotonic()
        held.release()
        thread.join(10)
        return got["lease"], time.monotonic() - t0

    lease, handoff_s = client.run(body_async() if client.mode == "async" else body_sync())
    assert _follows(coord, lease.token.value, held.token.value)
    assert handoff_s < 1.0  # granted on release, not by TTL
    client.run(lease.release())


def test_c4_waiters_are_served_in_arrival_order(client, coord_url):
    coord = client.connect(coord_url)
    held = client.run(coord.acquire("fifo-n", ttl_ms=5_000))
    order: list[int] = []

    def waiter(index: int) -> Callable[[], Any]:
        async def wait_async() -> int:
            lease = await coord.acquire("fifo-n", ttl_ms=5_000, wait_ms=_WAIT_S * 1000)
            order.append(index)
            await lease.release()
            return int(lease.token.value)

        def wait_sync() -> int:
            lease = coord.acquire("fifo-n", ttl_ms=5_000, wait_ms=_WAIT_S * 1000)
            order.append(index)
            lease.release()
            return int(lease.token.value)

        return wait_async if client.mode == "async" else wait_sync

    joins = []
    for index in range(FIFO_WAITERS):
        joins.append(_in_background(client, waiter(index)))
        _await_waiters(client, coord, "fifo-n", index + 1)  # queued, in this order, before the next one starts
    client.run(held.release())
    tokens = [join() for join in joins]
    assert order == list(range(FIFO_WAITERS)), order
    assert [held.token.value, *tokens] == sorted({held.token.value, *tokens})  # the tokens in the same order
    _close(client, coord)


def test_handles_opened_at_once_contending_for_a_scope_all_answer(client, coord_url):
    """`CONTENDING_HANDLES` handles opened at once on a fresh backend, each running `CONTENDED_CYCLES` lock
    cycles: a try (``wait_ms=0``) on a scope they share, then on one of its own, each grant released at once.
    Every call answers: a grant, or `LockTimeout` on the shared scope only. The shared scope's tokens, in the
    order held, increase (C1). A backend that read a snapshot of before its own locks (PostgreSQL at a default
    isolation of REPEATABLE READ) fails here: its opens set its tables up twice, its units fail with 40001."""
    shared_tokens: list[int] = []  # appended while held: the holds do not overlap, so in grant order

    def cycles(index: int) -> Callable[[], Any]:
        scopes = ["contended" if n % 2 == 0 else f"own-{index}" for n in range(CONTENDED_CYCLES)]

        async def cycles_async() -> int:
            coord = client.connect(coord_url)
            try:
                for scope in scopes:
                    try:
                        lease = await coord.acquire(scope, ttl_ms=5_000, wait_ms=0)
                    except LockTimeout:
                        assert scope == "contended", f"handle {index}'s own scope was not free"
                        continue
                    shared_tokens.extend([lease.token.value] if scope == "contended" else [])
                    await lease.release()
            finally:
                await coord.aclose()
            return index

        def cycles_sync() -> int:
            coord = client.connect(coord_url)
            try:
                for scope in scopes:
                    try:
                        lease = coord.acquire(scope, ttl_ms=5_000, wait_ms=0)
                    except LockTimeout:
                        assert scope == "contended", f"handle {index}'s own scope was not free"
                        continue
                    shared_tokens.extend([lease.token.value] if scope == "contended" else [])
                    lease.release()
            finally:
                coord.close()
            return index

        return cycles_async if client.mode == "async" else cycles_sync

    joins = [_in_background(client, cycles(index)) for index in range(CONTENDING_HANDLES)]
    answers: list[Any] = []
    for join in joins:  # every handle ends before a failure is raised: none is left running on the backend
        try:
            answers.append(join())
        except Exception as exc:  # noqa: BLE001 - raised below, the first
            answers.append(exc)
    for failed in (answer for answer in answers if isinstance(answer, Exception)):
        raise failed
    assert answers == list(range(CONTENDING_HANDLES))
    assert shared_tokens and shared_tokens == sorted(set(shared_tokens)), shared_tokens


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


def test_inspect_and_scopes_while_held(client, coord_url):
    coord = client.connect(coord_url)
    lease = client.run(coord.acquire("seen", ttl_ms=5000, holder="worker-1"))
    info = client.run(coord.inspect("seen"))
    assert info.state is stockade.ScopeState.HELD and info.holder == "worker-1"
    assert info.token == lease.token and info.last_token == lease.token.value
    assert 0 < info.remaining_ms <= 5000 and info.waiters == 0
    free = client.run(coord.inspect("never-used"))
    assert free.state is stockade.ScopeState.FREE and free.token is None and free.last_token == 0
    names = [i.scope for i in client.run(coord.scopes())]
    assert "seen" in names
    client.run(lease.release())
    assert client.run(coord.inspect("seen")).state is stockade.ScopeState.FREE


def test_renew_after_release_is_lease_lost(client, coord_url):
    coord = client.connect(coord_url)
    lease = client.run(coord.acquire("r", ttl_ms=1000, keepalive=False))
    client.run(lease.renew())
    client.run(lease.release())
    with pytest.raises(LeaseLost):
        client.run(lease.renew())


def test_token_of_another_scope_is_mismatch(client, coord_url, store_url):
    coord = client.connect(coord_url)
    store = client.open_store(store_url, cluster_id=coord.cluster_id)
    assert store.cluster_id == coord.cluster_id
    lease = client.run(coord.acquire("a", ttl_ms=1000))
    assert lease.token.cluster == coord.cluster_id
    with pytest.raises(stockade.TokenMismatch):
        client.run(store.put("b", "k", b"v", token=lease.token))
    assert client.run(store.high_water("b")) == 0 and client.run(store.get("b", "k")) is None
    client.run(lease.release())


def test_idempotent_write_replays_after_token_went_stale(client, coord_url, store_url):
    coord = client.connect(coord_url)
    store = client.open_store(store_url, cluster_id=coord.cluster_id)
    # Released, not lapsed: a TTL that outlives a loaded host's put (1 s did not, once, on ZooKeeper).
    old = client.run(coord.acquire("i", ttl_ms=10_000, keepalive=False))
    first = client.run(store.put("i", "k", b"one", token=old.token, idempotency_key="op-1"))
    client.run(old.release())
    new = client.run(coord.acquire("i", ttl_ms=10_000, keepalive=False))
    client.run(store.put("i", "k", b"two", token=new.token))
    again = client.run(store.put("i", "k", b"one", token=old.token, idempotency_key="op-1"))
    assert again.replayed is True and again.commit_seq == first.commit_seq and first.replayed is False
    assert client.run(store.get("i", "k")).value == b"two"
    client.run(new.release())


def test_store_get_list_delete(client, coord_url, store_url):
    coord = client.connect(coord_url)
    store = client.open_store(store_url, cluster_id=coord.cluster_id)
    lease = client.run(coord.acquire("kv", ttl_ms=1000))
    assert client.run(store.get("kv", "missing")) is None
    for key in ["b", "a/1", "c d", "é"]:
        result = client.run(store.put("kv", key, key.encode() * 2, token=lease.token))
        assert result.key == key and result.token_value == lease.token.value == result.high_water
    items = client.run(store.list("kv"))
    assert [i.key for i in items] == sorted(["b", "a/1", "c d", "é"], key=lambda k: k.encode())
    assert all(i.value == i.key.encode() * 2 and i.token_value == lease.token.value for i in items)
    assert [i.key for i in client.run(store.list("kv", after="b", limit=1))] == ["c d"]
    deleted = client.run(store.delete("kv", "b", token=lease.token))
    assert deleted.high_water == lease.token.value
    assert client.run(store.get("kv", "b")) is None
    item = client.run(store.get("kv", "a/1"))
    assert item.value == b"a/1a/1" and item.scope == "kv" and item.commit_seq >= 1
    client.run(lease.release())


def test_lease_repr_does_not_leak_lease_id(coord_url):
    coord = stockade.connect(coord_url)
    lease = coord.acquire("k", ttl_ms=1000)
    assert lease.lease_id not in repr(lease)
    lease.release()


def test_last_issued_is_the_fence_floor(client, coord_url):
    coord = client.connect(coord_url)
    assert client.run(coord.last_issued("floors")) == 0
    values = []
    for _ in range(3):
        lease = client.run(coord.acquire("floors", ttl_ms=1000))
        values.append(lease.token.value)
        client.run(lease.release())
    assert client.run(coord.last_issued("floors")) == values[-1]
    assert _follows(coord, values[1], values[0]) and _follows(coord, values[2], values[1])
    client.run(coord.aclose() if client.mode == "async" else coord.close())




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
    assert lease._background == []  # the keepalive and the deadline watcher have ended
    assert not [t for t in threading.enumerate() if t.name.startswith("stockade-keepalive-closing")]




# -- waiting until granted (wait_ms=None) ---------------------------------------------------------


class CappedWait(Protocol):
    """The backend under test as a wait until granted meets it (``capped_wait`` fixture).

    Attributes:
        url: a coordinator url of the backend; where the backend answers one request's wait at
            a per-request cap, one whose cap is small (a served coordinator: ``--wait-ms-cap``).
        cap_ms: that cap, or None.
        uncapped: None, or in words why the backend has no per-request cap to wait across (its
            client port waits in one call); the rounds are not counted there, FIFO order still is.
    """

    url: str
    cap_ms: int | None
    uncapped: str | None


#: Caps a wait until granted must outlast, keeping its place (the acceptance's "at least 3").
FOREVER_CAPS = 3
#: Waits until granted cancelled by the cancel test, per backend and client (``STOCKADE_LONG=1``: 50).
FOREVER_CANCELS = 50 if os.environ.get("STOCKADE_LONG") == "1" else 3
#: How long a cancelled wait's waiter may stay queued, in seconds: a served coordinator holds the place of a
#: wait cancelled between two of its requests for `stockade.server._tickets.TICKET_HOLD_MS` (5 s).
FOREVER_GONE_S = 10
#: How long a SIGINT has to end a wait until granted in the sync client's thread, and how often it is sent.
SIGINT_GRACE_S = 15
SIGINT_SENDS = 3


def _fresh_scope(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:12]}"  # the capped server may be shared by several tests


def test_c4_a_wait_until_granted_keeps_its_place_across_caps(client, capped_wait):
    """Two waits until granted, queued one after the other behind a holder, each outlast `FOREVER_CAPS` of the
    server's per-request caps; the first queued is granted first, the second after it, and never was a
    third waiter in the queue (a renewed wait that queued again would be one, at the back)."""
    scope = _fresh_scope("forever-fifo")
    holder, first, second = (client.connect(capped_wait.url) for _ in range(3))
    held = client.run(holder.acquire(scope, ttl_ms=5_000))
    order: list[str] = []

    def waiter(coord: Any, name: str) -> Callable[[], Any]:
        async def wait_async() -> int:
            lease = await coord.acquire(scope, ttl_ms=5_000, wait_ms=None)
            order.append(name)
            await lease.release()
            return int(lease.token.value)

        def wait_sync() -> int:
            lease = coord.acquire(scope, ttl_ms=5_000, wait_ms=None)
            order.append(name)
            lease.release()
            return int(lease.token.value)

        return wait_async if client.mode == "async" else wait_sync

    join_first = _in_background(client, waiter(first, "first"))
    _await_waiters(client, holder, scope, 1)
    join_second = _in_background(client, waiter(second, "second"))
    _await_waiters(client, holder, scope, 2)
    most = least = 2
    if capped_wait.uncapped is None:
        deadline = time.monotonic() + _WAIT_S
        while min(first._port.wait_rounds, second._port.wait_rounds) < FOREVER_CAPS:
            waiters = client.run(holder.inspect(scope)).waiters
            most, least = max(most, waiters), min(least, waiters)
            assert time.monotonic() < deadline, f"{FOREVER_CAPS} caps of {capped_wait.cap_ms} ms not seen"
            if client.mode == "sync":
                time.sleep(0.005)
        # Release just after the first waiter's next cap: a wait that queued again would now be behind the second.
        seen = first._port.wait_rounds
        while first._port.wait_rounds == seen:
            waiters = client.run(holder.inspect(scope)).waiters
            most, least = max(most, waiters), min(least, waiters)
            assert time.monotonic() < deadline, f"no cap of {capped_wait.cap_ms} ms seen in {_WAIT_S} s"
            if client.mode == "sync":
                time.sleep(0.001)
    rounds = (first._port.wait_rounds, second._port.wait_rounds)
    assert most == 2, f"a renewed wait queued again: {most} waiters"
    assert least == 2, f"a renewed wait left the queue between two requests: {least} waiter(s) seen"
    client.run(held.release())
    tokens = [join_first(), join_second()]
    assert order == ["first", "second"], f"served out of arrival order: {order} after {rounds} caps"
    assert held.token.value < tokens[0] < tokens[1]
    print(f"waits until granted served in arrival order after {rounds} caps of {capped_wait.cap_ms} ms"
          if capped_wait.uncapped is None else f"waits until granted served in arrival order ({capped_wait.uncapped})")
    for coord in (holder, first, second):
        _close(client, coord)


def test_cancelling_a_wait_until_granted_leaves_no_waiter(client, capped_wait):
    """`FOREVER_CANCELS` waits until granted, each cancelled once queued (async: its task cancelled; sync: a
    KeyboardInterrupt, SIGINT from a timer thread, in the thread that waits); after each, the scope's queue is
    empty again, as the coordinator reports it (a served one: the client's disconnect ended the wait)."""
    scope = _fresh_scope("forever-cancel")
    holder, waiting = client.connect(capped_wait.url), client.connect(capped_wait.url)
    held = client.run(holder.acquire(scope, ttl_ms=10_000))
    left_behind = cancels = 0
    for _ in range(FOREVER_CANCELS):
        if client.mode == "async":
            task = client.loop.create_task(waiting.acquire(scope, ttl_ms=5_000, wait_ms=None))
            _await_waiters(client, holder, scope, 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                client.run(asyncio.wait_for(task, _WAIT_S))
        else:
            with pytest.raises(KeyboardInterrupt):
                _interrupted_when_queued(lambda: waiting.acquire(scope, ttl_ms=5_000, wait_ms=None),
                                         lambda: holder.inspect(scope).waiters >= 1)
        deadline = time.monotonic() + FOREVER_GONE_S
        while (waiters := client.run(holder.inspect(scope)).waiters) > 0 and time.monotonic() < deadline:
            if client.mode == "sync":
                time.sleep(0.005)
        left_behind += waiters > 0
        cancels += 1
        assert left_behind == 0, f"{left_behind} of {cancels} cancelled waits left a waiter behind"
    print(f"cancelled waits that left a waiter behind: {left_behind} of {FOREVER_CANCELS} ({client.mode})")
    client.run(held.release())
    _close(client, waiting)
    _close(client, holder)


def _interrupted_when_queued(call: Callable[[], Any], queued: Callable[[], bool]) -> Any:
    """Run ``call()`` in this (main) thread; once ``queued()`` says so, SIGINT it from another thread.

    Bounded on every path (a CI run once hung here for 30 minutes with no way to tell why): ``queued()`` is
    polled from a thread of its own, so a read that hangs cannot hold the signal back past `_WAIT_S`; a SIGINT
    that has not ended ``call()`` within `SIGINT_GRACE_S` is sent again, at most `SIGINT_SENDS` times. Either
    is a failure, raised here with what was seen, in place of the call's own outcome."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("a KeyboardInterrupt is delivered to the main thread only")
    main_id = threading.main_thread().ident or 0
    ready, returned, armed = threading.Event(), threading.Event(), threading.Event()
    seen: list[str] = []
    started = time.monotonic()

    def poll() -> None:
        last: BaseException | None = None
        while not ready.is_set() and not returned.is_set() and time.monotonic() - started < _WAIT_S:
            try:
                if queued():
                    ready.set()
                    return
            except Exception as exc:  # noqa: BLE001 - retried until the deadline, then reported
                last = exc
            time.sleep(0.005)
        if last is not None:
            seen.append(f"queued() last failed with {last!r}")

    def interrupt() -> None:
        armed.wait()  # not before the call is about to start: the signal must land in it
        while not ready.is_set() and not returned.is_set() and time.monotonic() - started < _WAIT_S:
            ready.wait(0.05)
        if returned.is_set():
            return
        if not ready.is_set():
            seen.append(f"queued() did not confirm the wait within {_WAIT_S} s")
        for sent in range(1, SIGINT_SENDS + 1):
            signal.pthread_kill(main_id, signal.SIGINT)
            if returned.wait(SIGINT_GRACE_S):
                return
            seen.append(f"SIGINT {sent} of {SIGINT_SENDS} had not ended the call {SIGINT_GRACE_S} s later")

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    poller = threading.Thread(target=poll, name="stockade-test-queued", daemon=True)
    timer = threading.Thread(target=interrupt, name="stockade-test-sigint", daemon=True)
    poller.start()
    timer.start()
    try:
        armed.set()
        return call()
    finally:
        returned.set()
        timer.join()
        poller.join(1.0)  # a read that hangs is left to its daemon thread (and reported below)
        if poller.is_alive():
            seen.append(f"queued() still running {time.monotonic() - started:.1f} s after it was first called")
        signal.signal(signal.SIGINT, previous)
        if seen:
            raise AssertionError("interrupting a wait until granted: " + "; ".join(seen))


#: The contenders test's waiters, in the order they queue: not the order of their names (so that a line
#: sorted by name, or reversed, is not the line in arrival order). The second gives up while queued.
CONTENDER_NAMES = ("w-delta", "w-alpha", "w-charlie", "w-bravo")
_QUITTER = 1


def _contenders_line(client, coord, scope: str) -> list[tuple[str, bool]]:
    return [(c.holder, c.holding) for c in client.run(coord.contenders(scope))]


def _await_line(client, coord, scope: str, expected: list[tuple[str, bool]], seen: list[bool],
                settle_s: float = 0.0) -> None:
    """Read the scope's contenders until the line is ``expected``, at most ``settle_s`` (a served coordinator
    learns of a cancelled wait when its client's connection closes; else one read); note whether it was."""
    deadline = time.monotonic() + settle_s
    while (line := _contenders_line(client, coord, scope)) != expected and time.monotonic() < deadline:
        if client.mode == "sync":
            time.sleep(0.005)
    seen.append(line == expected)
    assert line == expected, f"contenders of {scope!r}: {line}, expected {expected}"


def _give_up_in_line(client, coord, scope: str, wait: Callable[[], Any], place: int,
                     queue_rest: Callable[[], None]) -> None:
    """Start ``wait`` (a wait until granted), let it take queue place ``place`` (1 = first waiter), queue the
    rest behind it (``queue_rest``), then cancel it: async, its task; sync, a KeyboardInterrupt in this thread."""
    if client.mode == "async":
        task = client.loop.create_task(wait())
        _await_waiters(client, coord, scope, place)  # queued before the rest start
        queue_rest()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            client.run(asyncio.wait_for(task, _WAIT_S))
        return
    failed: list[BaseException] = []

    def queued() -> bool:  # in the interrupting thread: the rest queue behind the quitter, then SIGINT
        if client.run(coord.inspect(scope)).waiters < place:
            return False
        try:
            queue_rest()
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread below
            failed.append(exc)
        return True

    with pytest.raises(KeyboardInterrupt):
        _interrupted_when_queued(wait, queued)
    if failed:
        raise failed[0]


def check_contenders(client, connect: Callable[[], Any]) -> int:
    """The contenders line through ``connect()``'s handles: a holder and `CONTENDER_NAMES` queued one after
    another read holder first, then the waiters in arrival order; the waiter that gives up (async: its task
    cancelled; sync: a KeyboardInterrupt in the thread that waits) leaves the line; each release moves the
    next waiter to the front, holding. Returns how many lines were read in order (all, or it raised)."""
    scope = _fresh_scope("contenders")
    coord = connect()
    held = client.run(coord.acquire(scope, ttl_ms=10_000, holder="w-holder"))
    seen: list[bool] = []
    line = [("w-holder", True)]
    _await_line(client, coord, scope, line, seen)

    def waiter(name: str, wait_ms: int | None = _WAIT_S * 1000, handle: Any = coord) -> Callable[[], Any]:
        return _acquiring(client, handle, scope, ttl_ms=10_000, wait_ms=wait_ms, holder=name)

    joins: dict[str, Callable[[], Any]] = {}

    def queue(names: tuple[str, ...]) -> None:
        for name in names:
            joins[name] = _in_background(client, waiter(name))
            line.append((name, False))
            _await_waiters(client, coord, scope, len(line) - 1)  # queued before the next one starts
        _await_line(client, coord, scope, line, seen)

    queue(CONTENDER_NAMES[:_QUITTER])
    quitter = CONTENDER_NAMES[_QUITTER]
    rest = CONTENDER_NAMES[_QUITTER + 1:]
    # The quitter waits on a handle of its own: an interrupt may land anywhere in that handle's code.
    quitting = connect()
    line.append((quitter, False))
    _give_up_in_line(client, coord, scope, waiter(quitter, None, quitting), len(line) - 1, lambda: queue(rest))
    if client.mode == "sync":
        # An interrupt that lands inside an embedded SQLite handle's write may leave its connection in the
        # transaction (the file's write lock kept): the process would be ended by it; here the handle is closed.
        closing = threading.Thread(target=quitting.close, daemon=True)
        closing.start()
        closing.join(_WAIT_S)
    line.remove((quitter, False))
    _await_line(client, coord, scope, line, seen, FOREVER_GONE_S)
    lease = held
    while len(line) > 1:
        client.run(lease.release())
        name = line[1][0]
        lease, _ = joins[name]()
        line = [(name, True), *line[2:]]
        _await_line(client, coord, scope, line, seen)
    client.run(lease.release())
    _await_line(client, coord, scope, [], seen)
    _close(client, coord)
    if client.mode == "async":
        _close(client, quitting)
    return sum(seen)


def test_contenders_holder_first_then_waiters_in_arrival_order(client, coord_url):
    """`check_contenders` on the backend under test: every line read is the expected one."""
    in_order = check_contenders(client, lambda: client.connect(coord_url))
    print(f"contenders lines in serving order: {in_order} of {in_order} ({client.mode})")


def test_contenders_limit_is_bounded_and_validated(client, coord_url):
    coord = client.connect(coord_url)
    scope = _fresh_scope("contenders-limit")
    held = client.run(coord.acquire(scope, ttl_ms=10_000, holder="first"))
    join = _in_background(client, _acquiring(client, coord, scope, ttl_ms=10_000, wait_ms=_WAIT_S * 1000,
                                             holder="second"))
    _await_waiters(client, coord, scope, 1)
    assert [(c.holder, c.holding) for c in client.run(coord.contenders(scope, limit=1))] == [("first", True)]
    assert len(client.run(coord.contenders(scope, limit=2))) == 2
    for bad in (0, -1, CONTENDERS_MAX + 1, "2", True):
        with pytest.raises(InvalidArgument):
            client.run(coord.contenders(scope, limit=bad))
    with pytest.raises(InvalidArgument):
        client.run(coord.contenders("bad scope"))
    assert client.run(coord.contenders(_fresh_scope("never-used"))) == []
    client.run(held.release())
    lease, _ = join()
    client.run(lease.release())
    _close(client, coord)


__all__ = [name for name in dir() if name.startswith("test_")]
