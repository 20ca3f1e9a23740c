"""A full disk under the Redis fence: redis-server 7 with AOF and ``appendfsync always`` on a filled tmpfs.

Redis cannot append the fenced write to its AOF, and with ``appendfsync
always`` it exits rather than answer ("Can't recover from AOF write error").
The writer gets `BackendUnavailable` with the outcome unknown (no reply came).
Started again with room, Redis holds what it had acknowledged: the mark and
the data of the last acknowledged write, never a part of the failed one, and
the next token writes.
"""

from __future__ import annotations

import os

import pytest
from helpers import full_disk

from stockade.core.errors import BackendUnavailable
from stockade.resources.redis import RedisFence
from stockade.testing.conformance.fence import KEYS, tok
from stockade.testing.servers.redis import RedisServer, require_redis

pytestmark = pytest.mark.skipif(not full_disk.can_mount(), reason="needs root to mount a tmpfs")

#: Fenced writes of 4 KB tried on the full disk before the test gives up.
WRITES_MAX = 300


def test_a_full_disk_stops_redis_and_it_comes_back_with_what_it_acknowledged() -> None:
    require_redis()
    with full_disk.small_tmpfs("8m") as mount:
        server = RedisServer(mount / "redis")
        try:
            fence = RedisFence.from_url(server.url, keys=KEYS, socket_timeout=5)
            fence.set(tok(5), "{a}:k", b"acknowledged")
            full_disk.fill(mount / "filler")

            acknowledged, refused = 5, None
            for value in range(6, 6 + WRITES_MAX):
                try:
                    fence.set(tok(value), "{a}:k", os.urandom(4096))
                except BackendUnavailable as exc:
                    refused = exc
                    break
                acknowledged = value
            assert refused is not None and not refused.certain_no_effect
            assert "Can't recover from AOF write error" in server.log_tail()

            (mount / "filler").unlink()
            server.start()
            assert fence.high_water("a") == acknowledged  # not lower, and not the failed write's
            if acknowledged == 5:
                assert fence.client.get("{a}:k") == b"acknowledged"
            assert fence.set(tok(acknowledged + 1), "{a}:k", b"next") is True
            fence.close()
        finally:
            server.kill()
