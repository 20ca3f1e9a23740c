"""The Python API, sync and async from one source: the same tests run against both."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import stockade
from stockade import InvalidArgument, LeaseLost, LockTimeout, StaleToken

ROOT = Path(__file__).resolve().parent.parent


def test_public_api_is_pinned():
    assert sorted(stockade.__all__) == sorted(
        [
            "connect", "connect_async", "open_store", "open_store_async",
            "Coordinator", "AsyncCoordinator", "Lease", "AsyncLease", "FencedStore", "AsyncFencedStore",
            "FencingToken", "ScopeInfo", "ScopeState", "Item", "WriteResult",
            "StockadeError", "InvalidArgument", "LimitExceeded", "FenceRejected", "StaleToken", "TokenMismatch",
            "LeaseError", "NotHolder", "LeaseLost", "LockTimeout", "BackendUnavailable", "InvariantViolation",
        ]
    )
    for name in stockade.__all__:
        assert getattr(stockade, name) is not None


def test_sync_client_is_generated_from_async():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "unasync.py"), "--check"], capture_output=True)
    assert result.returncode == 0, result.stderr.decode()


def test_error_tree_is_one_tree():
    for name in ["InvalidArgument", "LimitExceeded", "StaleToken", "TokenMismatch", "NotHolder", "LeaseLost",
                 "LockTimeout", "BackendUnavailable", "InvariantViolation"]:
        assert issubclass(getattr(stockade, name), stockade.StockadeError)
    assert issubclass(stockade.StaleToken, stockade.FenceRejected)


def test_acquire_release_tokens_increase(client, coord_url):
    coord = client.connect(coord_url)
    tokens = []
    for _ in range(5):
        lease = client.run(coord.acquire("jobs", ttl_ms=1000))
        tokens.append(lease.token.value)
        client.run(lease.release())
        client.run(lease.release())  # idempotent
    assert tokens == [1, 2, 3, 4, 5]
    info = client.run(coord.inspect("jobs"))
    assert info.state is stockade.ScopeState.FREE and info.last_token == 5
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
    t0 = time.monotonic()
    with pytest.raises(LockTimeout):
        client.run(coord.acquire("q", ttl_ms=1000, wait_ms=150))
    assert time.monotonic() - t0 >= 0.14
    client.run(held.release())
    lease = client.run(coord.acquire("q", ttl_ms=1000, wait_ms=0))
    assert lease.token.value == 2  # the timed-out waiter took no token
    client.run(lease.release())


def test_keepalive_holds_lease_past_ttl(client, coord_url):
    coord = client.connect(coord_url)
    lease = client.run(coord.acquire("k", ttl_ms=200))
    time.sleep(0.7) if client.mode == "sync" else client.run(__import__("asyncio").sleep(0.7))
    assert not lease.lost
    assert client.run(coord.inspect("k")).token == lease.token
    client.run(lease.release())


def test_lease_lost_without_keepalive_by_local_deadline(client, coord_url):
    coord = client.connect(coord_url)
    lease = client.run(coord.acquire("k", ttl_ms=150, keepalive=False))
    assert not lease.lost
    assert client.run(lease.wait_lost(timeout_ms=2000)) is True
    with pytest.raises(LeaseLost):
        lease.raise_if_lost()
    with pytest.raises(LeaseLost):
        client.run(lease.renew())


def test_lease_lost_when_coordinator_refuses_renewal(client, coord_url):
    coord = client.connect(coord_url)
    lease = client.run(coord.acquire("k", ttl_ms=300))
    # Somebody with the lease id (an operator) releases it: the next renewal is refused.
    other = stockade.connect(coord_url)
    other._port.engine.release(lease.lease_id)
    assert client.run(lease.wait_lost(timeout_ms=2000)) is True
    assert "refused" in lease.lost_cause


def test_lease_repr_does_not_leak_lease_id(coord_url):
    coord = stockade.connect(coord_url)
    lease = coord.acquire("k", ttl_ms=1000)
    assert lease.lease_id not in repr(lease)
    lease.release()


@pytest.mark.parametrize(
    "url", ["", "coord.db", "mysql://x", "etcd://127.0.0.1:1", "http://", "http://h:1?q=1", "sqlite://", 5, None],
)
def test_bad_urls(url):
    with pytest.raises(InvalidArgument):
        stockade.connect(url)
