"""The coordinator suite's grants and their tokens: C1 and C2, and the tokens at a fenced store.

Each grant of a scope gets the next token (C1; dense where the backend counts per scope), also
when handles opened at once contend for one scope, whose tries are refused while another handle
holds it (C2). The tokens are then taken by a fenced store: from the lease in context (K1), an
older one refused after a newer grant (R1), one of another scope refused (R2), a retry replayed by
its idempotency key (R3), and the store's reads and deletes under a lease. Part of
`stockade.testing.conformance.coordinator`, which runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import stockade
from stockade import InvalidArgument, LockTimeout, StaleToken
from stockade.testing.conformance.coordinator_helpers import _follows, _in_background

#: The contention case's handles, opened at once, and the lock cycles each runs (every other one on the scope
#: they share): a stale read under contention failed about one call in ten, so ~50 shared tries find one.
CONTENDING_HANDLES = 4
CONTENDED_CYCLES = 24


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


__all__ = [name for name in dir() if name.startswith("test_")]
