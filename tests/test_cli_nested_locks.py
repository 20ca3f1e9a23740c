"""Nested ``lock()`` blocks (the API that ``stockade lock`` is built on): each write carries
the lease of its own scope's block, not the innermost block's (K1), sync and async."""

from __future__ import annotations

import asyncio

import pytest

import stockade
from stockade import InvalidArgument


@pytest.fixture
def urls(tmp_path):
    return f"sqlite:///{tmp_path / 'coord.db'}", f"sqlite:///{tmp_path / 'store.db'}"


def test_nested_lock_blocks_write_with_their_own_scope_lease_sync(urls):
    coord_url, store_url = urls
    with stockade.connect(coord_url) as coord, stockade.open_store(store_url, cluster_id=coord.cluster_id) as store:
        for _ in range(3):  # give "b" a higher token than "a" will get, so a mix-up shows
            coord.acquire("b", ttl_ms=1000, keepalive=False).release()
        with coord.lock("a", ttl_ms=5000) as outer:
            with coord.lock("b", ttl_ms=5000) as inner:
                assert store.put("a", "k", b"outer").token_value == outer.token.value  # not inner's
                assert store.put("b", "k", b"inner").token_value == inner.token.value
                with coord.lock("c", ttl_ms=5000):
                    store.delete("a", "gone")  # two blocks out
            assert store.put("a", "k2", b"after inner").token_value == outer.token.value
            with pytest.raises(InvalidArgument):
                store.put("b", "k", b"inner closed")  # b's block is over: no lease on b here
        assert (store.high_water("a"), store.high_water("b")) == (outer.token.value, inner.token.value)
        with pytest.raises(InvalidArgument):
            store.put("a", "k", b"no block")


def test_nested_lock_blocks_write_with_their_own_scope_lease_async(urls):
    coord_url, store_url = urls

    async def body():
        async with stockade.connect_async(coord_url) as coord:
            async with stockade.open_store_async(store_url, cluster_id=coord.cluster_id) as store:
                for _ in range(3):
                    await (await coord.acquire("b", ttl_ms=1000, keepalive=False)).release()
                async with coord.lock("a", ttl_ms=5000) as outer:
                    async with coord.lock("b", ttl_ms=5000) as inner:
                        assert (await store.put("a", "k", b"outer")).token_value == outer.token.value
                        assert (await store.put("b", "k", b"inner")).token_value == inner.token.value

                        async def in_task():  # a task started inside sees the same stack
                            return (await store.put("a", "t", b"task")).token_value

                        assert await asyncio.create_task(in_task()) == outer.token.value
                    assert (await store.put("a", "k2", b"after inner")).token_value == outer.token.value
                    with pytest.raises(InvalidArgument):
                        await store.put("b", "k", b"inner closed")
                return await store.high_water("a"), await store.high_water("b"), outer, inner

    high_a, high_b, outer, inner = asyncio.run(body())
    assert (high_a, high_b) == (outer.token.value, inner.token.value)


def test_concurrent_tasks_keep_separate_stacks(urls):
    coord_url, store_url = urls

    async def body():
        async with stockade.connect_async(coord_url) as coord:
            async with stockade.open_store_async(store_url, cluster_id=coord.cluster_id) as store:
                inside = asyncio.Event()
                release = asyncio.Event()

                async def holder():
                    async with coord.lock("x", ttl_ms=5000) as lease:
                        inside.set()
                        await release.wait()
                        return (await store.put("x", "k", b"v")).token_value, lease.token.value

                task = asyncio.create_task(holder())
                await inside.wait()
                with pytest.raises(InvalidArgument):  # the other task's block is not ours
                    await store.put("x", "k", b"not mine")
                release.set()
                written, held = await task
                assert written == held

    asyncio.run(body())
