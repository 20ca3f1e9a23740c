"""Fence a user's own Redis data: the HWM lives in Redis and moves in the same script as the writes.

    fence = RedisFence(redis.Redis(...), keys=coord.verify_keys())
    fence.set(lease.token, "{orders}:42", b"paid")
    with fence.batch(lease.token) as b:
        b.set("{orders}:42", b"shipped")
        b.hset("{orders}:42:meta", {"by": "w1"})
        b.xadd("{orders}:log", {"event": "shipped"})
    b.results  # [True, 1, "1700000000000-0"]

Every fenced write is one call of a Lua script (`_script.FENCED_WRITE`; a single
SET: `_script.FENCED_SET`, by EVALSHA; loaded again on NOSCRIPT) that reads the scope's mark,
refuses a stale token (R1) and otherwise raises the mark and runs the
commands, atomically: Redis runs a script alone. The token's MAC and its
cluster and scope (R2) are checked here, in Python, before the script runs:
the script holds no key. Reads are plain Redis reads, except `RedisBatch.get`,
which reads a key and the mark at one instant and refuses if the mark has
already passed the batch's token (a batch never sees a newer holder's data).

Keys must carry the scope as their hash tag (``{orders}:42``), so that a
scope's keys and its mark share one hash slot on Redis Cluster; a key outside
it is refused with `InvalidArgument`. docs/fence-redis.md says what
durability each ``appendfsync`` gives and what to do after a failover (R4).
`AsyncRedisFence` is the same over ``redis.asyncio`` (``_async/``; `RedisFence` is generated from it).
"""

from __future__ import annotations

from stockade.resources._verify import TOKENLESS
from stockade.resources.redis._async.fence import AsyncRedisBatch, AsyncRedisFence
from stockade.resources.redis._sync.fence import RedisBatch, RedisFence

__all__ = ["RedisFence", "AsyncRedisFence", "RedisBatch", "AsyncRedisBatch", "open_floor_target"]


def open_floor_target(url: str, *, cluster_id: str) -> RedisFence:
    """The Redis at ``url`` as ``stockade floor`` raises it (`stockade.resources.floor`).

    Raising floors writes no user data and carries no token, so no keys are
    needed: the fence it returns is only for `RedisFence.high_waters`,
    `RedisFence.raise_high_waters` and `RedisFence.close`.
    """
    return RedisFence.from_url(url, keys=TOKENLESS, cluster_id=cluster_id)
