"""The Redis fence and Redis's eviction, on a real redis-server 7 with a 4 MB ``maxmemory``.

Under an ``allkeys-*`` policy Redis evicts any key when memory runs short,
the fence's marks among them. An evicted mark reads as none, so a zombie's
stale token would write again (R1 broken): the control shows it happen. The
fence therefore reads ``INFO memory`` before its first write, and again at
most every `EVICTION_CHECK_NS`, and refuses to write under such a policy
(`BackendUnavailable`, nothing sent). ``noeviction`` and the ``volatile-*``
policies never evict a mark (marks have no expiry): under ``volatile-lru``,
with the memory filled by keys that expire, a stale token stays refused.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from stockade.core.errors import BackendUnavailable, StaleToken
from stockade.resources.redis import AsyncRedisFence, RedisFence
from stockade.resources.redis import _batch as _redis_batch
from stockade.testing.conformance.fence import KEYS, tok
from stockade.testing.servers.redis import RedisServer, require_redis

MAXMEMORY = "4mb"
#: Filler keys of 512 bytes: about 10 MB, well past the 4 MB.
FILLER_KEYS = 20_000
#: Fills of the control before it gives up on the mark being evicted.
FILL_ROUNDS_MAX = 20


def _server(tmp_path: Path, policy: str) -> RedisServer:
    require_redis()
    return RedisServer(tmp_path / "redis", extra=("--maxmemory", MAXMEMORY, "--maxmemory-policy", policy))


@pytest.fixture
def lru(tmp_path: Path) -> Iterator[RedisServer]:
    started = _server(tmp_path, "allkeys-lru")
    yield started
    started.stop()


def _fill(client: redis.Redis, *, px_ms: int | None = None, round_: int = 0) -> None:
    pipe = client.pipeline(transaction=False)
    for i in range(FILLER_KEYS):
        pipe.set(f"cache:{round_}:{i}", os.urandom(512), px=px_ms)
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()


def test_an_evicting_policy_is_refused_before_anything_is_written(lru: RedisServer) -> None:
    with RedisFence.from_url(lru.url, keys=KEYS) as fence:
        for write in (lambda: fence.set(tok(5), "{a}:42", b"new"),
                      lambda: fence.raise_high_waters({"a": 5})):
            with pytest.raises(BackendUnavailable, match="maxmemory-policy is allkeys-lru") as refused:
                write()
            assert refused.value.certain_no_effect
        assert fence.client.dbsize() == 0


def test_the_async_fence_refuses_it_too(lru: RedisServer) -> None:
    async def write() -> None:
        async with AsyncRedisFence.from_url(lru.url, keys=KEYS) as fence:
            await fence.set(tok(5), "{a}:42", b"new")

    with pytest.raises(BackendUnavailable, match="allkeys-lru"):
        asyncio.run(write())


def test_a_policy_changed_later_is_seen_at_the_next_check(tmp_path: Path) -> None:
    server = _server(tmp_path, "noeviction")
    try:
        with RedisFence.from_url(server.url, keys=KEYS) as fence:
            fence.set(tok(5), "{a}:42", b"new")
            fence.client.config_set("maxmemory-policy", "allkeys-lfu")
            fence.set(tok(6), "{a}:42", b"newer")  # read less than EVICTION_CHECK_NS ago: not yet
            fence._policy_read_ns -= _redis_batch.EVICTION_CHECK_NS  # the check is due (no waiting)
            with pytest.raises(BackendUnavailable, match="allkeys-lfu"):
                fence.set(tok(7), "{a}:42", b"newest")
            assert fence.client.get("{a}:42") == b"newer"
    finally:
        server.stop()


def test_control_without_the_check_an_evicted_mark_lets_a_stale_token_write(lru: RedisServer,
                                                                              monkeypatch) -> None:
    monkeypatch.setattr(_redis_batch, "EVICTING_POLICIES", frozenset())
    with RedisFence.from_url(lru.url, keys=KEYS) as fence:
        fence.set(tok(5), "{a}:42", b"new")
        with pytest.raises(StaleToken):
            fence.set(tok(3), "{a}:42", b"zombie")
        # Redis's LRU is sampled, and keys written in the same second tie: a fill evicts the mark
        # with a chance of about two in three. Fill again until it is gone (a bounded count).
        for round_ in range(FILL_ROUNDS_MAX):
            _fill(fence.client, round_=round_)
            if fence.high_water("a") == 0:
                break
        assert fence.high_water("a") == 0, f"the mark outlived {FILL_ROUNDS_MAX} fills"
        assert fence.set(tok(3), "{a}:42", b"zombie") is True  # R1 broken


def test_under_volatile_lru_the_marks_stay_and_a_stale_token_stays_refused(tmp_path: Path) -> None:
    server = _server(tmp_path, "volatile-lru")
    try:
        with RedisFence.from_url(server.url, keys=KEYS) as fence:
            fence.set(tok(5), "{a}:42", b"new")
            _fill(fence.client, px_ms=600_000)  # keys that expire: the ones Redis may evict
            assert fence.client.dbsize() < FILLER_KEYS  # it did evict
            assert fence.high_water("a") == 5
            with pytest.raises(StaleToken):
                fence.set(tok(3), "{a}:42", b"zombie")
            assert fence.client.get("{a}:42") == b"new"
    finally:
        server.stop()


def test_a_user_that_may_not_read_info_is_told_to_get_it(tmp_path: Path) -> None:
    server = _server(tmp_path, "noeviction")
    try:
        admin = redis.Redis.from_url(server.url)
        admin.acl_setuser("app", enabled=True, passwords=["+app-secret"], keys=["*"],
                          commands=["+@all", "-info"])
        with RedisFence.from_url(server.url, keys=KEYS, username="app", password="app-secret") as fence:
            with pytest.raises(BackendUnavailable, match=r"grant it \+info") as refused:
                fence.set(tok(5), "{a}:42", b"new")
            assert refused.value.certain_no_effect and admin.dbsize() == 0
        admin.acl_setuser("app", enabled=True, commands=["+info"])
        with RedisFence.from_url(server.url, keys=KEYS, username="app", password="app-secret") as fence:
            assert fence.set(tok(5), "{a}:42", b"new") is True
        admin.close()
    finally:
        server.stop()
