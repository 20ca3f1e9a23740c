"""The router of the sharded key-value example: which shard a key lives in.

A key's shard is ``crc32(key) mod shards``; a shard's name is the scope its
writer leases and its log is fenced under.
"""

from __future__ import annotations

import zlib

KEYS_PER_SHARD_TARGET = 8


def shard_name(index: int) -> str:
    """The scope (and log) of shard ``index``."""
    return f"kv.shard-{index}"


def shard_of(key: str, shards: int) -> str:
    """The shard that owns ``key``."""
    return shard_name(zlib.crc32(key.encode()) % shards)


def keys_of(shard: str, shards: int, universe: int | None = None) -> list[str]:
    """The keys of the example's key space that ``shard`` owns."""
    universe = universe or shards * KEYS_PER_SHARD_TARGET
    return [key for key in (f"key-{i}" for i in range(universe)) if shard_of(key, shards) == shard]
