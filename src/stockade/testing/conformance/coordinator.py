"""The coordinator conformance suite: what every coordinator backend must do, through the client.

Every test runs through the public Python API, sync and async from one source,
so it checks the coordinator port (acquire with waiting, renew, release,
inspect, scopes, last issued), the rules C1-C5 as a user meets them, and the
client's lease objects and keepalive on top.

Run it by importing its tests into a test module (``from
stockade.testing.conformance.coordinator import *``) and providing three
fixtures:

- ``client``: a runner with ``mode`` (``"sync"`` or ``"async"``),
  ``connect(url)`` and ``open_store(url)`` (the client's own functions), and
  ``run(x)``, which awaits ``x`` in async mode and returns it in sync mode;
- ``coord_url``: a url of the backend under test, fresh for each test;
- ``store_url``: a fenced store that trusts that backend's tokens.

The project's own run (tests/test_coordinator_conformance.py, fixtures in
tests/conftest.py) takes every scheme of
`stockade.coordinators.registry.COORDINATORS`: the SQLite file, the in-memory
engine, and a real `stockade serve` subprocess over HTTP.
"""

from __future__ import annotations

import threading
import time

import pytest

import stockade
from stockade import InvalidArgument, LeaseLost, LockTimeout, StaleToken
from stockade.coordinators.registry import Capability


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
        async with coord.lock("reports", ttl_ms=1000) as lease:
            await store.put("reports", "k", b"v1")  # token from the context (K1)
            assert (await store.high_water("reports")) == lease.token.value
        with pytest.raises(InvalidArgument):
            await store.put("reports", "k", b"v2")  # no lease in context any more

    def body_sync():
        with coord.lock("reports", ttl_ms=1000) as lease:
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
    held = client.run(coord.acquire("q", ttl_ms=1000))
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
    # TTLs of 2 s and 1 s: with 0.3 s (and once with 0.6 s), a loaded host (3 test workers)
    # stalled the renewals past the local deadline.
    coord = client.connect(coord_url)
    first = client.run(coord.acquire("k", ttl_ms=2_000, keepalive=False))
    lease = client.run(coord.acquire("k", ttl_ms=1_000, wait_ms=10_000))
    assert _follows(coord, lease.token.value, first.token.value)
    assert not lease.lost
    time.sleep(1.5) if client.mode == "sync" else client.run(__import__("asyncio").sleep(1.5))
    assert not lease.lost
    assert client.run(coord.inspect("k")).token == lease.token
    client.run(lease.release())


def test_lease_lost_without_keepalive_by_local_deadline(client, coord_url):
    coord = client.connect(coord_url)
    # 1 s: under a load average of 15, a ZooKeeper grant once came back after a 400 ms TTL had lapsed.
    lease = client.run(coord.acquire("k", ttl_ms=1000, keepalive=False))
    assert not lease.lost
    assert client.run(lease.wait_lost(timeout_ms=5000)) is True
    with pytest.raises(LeaseLost):
        lease.raise_if_lost()
    with pytest.raises(LeaseLost):
        client.run(lease.renew())


def test_lease_lost_when_coordinator_refuses_renewal(client, coord_url):
    coord = client.connect(coord_url)
    lease = client.run(coord.acquire("k", ttl_ms=1000))  # renewed every 333 ms, refused at the first
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
    old = client.run(coord.acquire("i", ttl_ms=1000, keepalive=False))
    first = client.run(store.put("i", "k", b"one", token=old.token, idempotency_key="op-1"))
    client.run(old.release())
    new = client.run(coord.acquire("i", ttl_ms=1000, keepalive=False))
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
    lease = client.run(coord.acquire("closing", ttl_ms=1000))
    released = client.run(coord.acquire("closing-released", ttl_ms=1000))
    client.run(released.release())
    client.run(coord.aclose() if client.mode == "async" else coord.close())
    assert lease.lost and "closed" in lease.lost_cause
    assert not released.lost  # released before the close: not lost
    assert lease._background == []  # the keepalive and the deadline watcher have ended
    assert not [t for t in threading.enumerate() if t.name.startswith("stockade-keepalive-closing")]


__all__ = [name for name in dir() if name.startswith("test_")]
