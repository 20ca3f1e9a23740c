"""The router of the sharded key-value example: which shard a key lives in, and who writes it now.

A key's shard is ``crc32(key) mod shards``; a shard's name is the election its
writer candidates stand in (`writer.py`) and the scope its log is fenced under.
The current writer of a shard is the election's leader, as the coordinator
shows it: `leaders` asks ``coord.leader`` for each shard, `next_leader`
waits with ``coord.watch_leader`` until a shard has a leader of a later term.

``router.py leaders --url URL --shards 8`` prints one line per shard:
``SHARD WRITER TERM REMAINING_MS`` (``SHARD - - -`` when nobody leads).
"""

from __future__ import annotations

import argparse
import time
import zlib

import stockade
from stockade.client import LeaderInfo

KEYS_PER_SHARD_TARGET = 8
WATCH_SLICE_MS = 5_000  # one watch_leader call waits at most this long; `next_leader` calls it again


def shard_name(index: int) -> str:
    """The scope (the election, and the log) of shard ``index``."""
    return f"kv.shard-{index}"


def shard_of(key: str, shards: int) -> str:
    """The shard that owns ``key``."""
    return shard_name(zlib.crc32(key.encode()) % shards)


def keys_of(shard: str, shards: int, universe: int | None = None) -> list[str]:
    """The keys of the example's key space that ``shard`` owns."""
    universe = universe or shards * KEYS_PER_SHARD_TARGET
    return [key for key in (f"key-{i}" for i in range(universe)) if shard_of(key, shards) == shard]


def leaders(coord: stockade.Coordinator, shards: int) -> dict[str, LeaderInfo | None]:
    """Each shard's current writer (its name is the leader's ``holder``), or None while nobody leads."""
    return {shard: coord.leader(shard) for shard in (shard_name(i) for i in range(shards))}


def next_leader(coord: stockade.Coordinator, shard: str, *, after_term: int, timeout_ms: int) -> LeaderInfo | None:
    """Wait until ``shard`` is led in a term after ``after_term``; that leader, or None after ``timeout_ms``.

    ``watch_leader`` returns on any change, including "nobody leads" between
    two terms, so this watches again from what it saw until a later term leads.
    """
    end_ns = time.monotonic_ns() + timeout_ms * 1_000_000
    seen = coord.leader(shard)
    while seen is None or seen.term <= after_term:
        left_ms = (end_ns - time.monotonic_ns()) // 1_000_000
        if left_ms <= 0:
            return None
        seen = coord.watch_leader(shard, since=seen, timeout_ms=min(left_ms, WATCH_SLICE_MS), poll_ms=20)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description="who writes each shard now")
    parser.add_argument("command", choices=["leaders"])
    parser.add_argument("--url", required=True, help="the coordinator the writers stand with")
    parser.add_argument("--shards", type=int, required=True)
    args = parser.parse_args()
    with stockade.connect(args.url) as coord:
        for shard, leader in leaders(coord, args.shards).items():
            print(shard, *(("-", "-", "-") if leader is None else (leader.holder, leader.term, leader.remaining_ms)))


if __name__ == "__main__":
    main()
