"""Each fence target's bound on a writer paused inside its unit (`stockade.testing.conformance.fence_paused`).

One declaration per kind of adapter, named by each target's descriptor (`stockade.testing.fences.targets`):
the bound a newer token may wait for a paused lower one, or why there is none.
Each was found by running the class against the target (docs/fence-*.md say
the same in words).
"""

from __future__ import annotations

from typing import Any

from stockade.core import limits
from stockade.resources.store.sqlite_store import SQLiteStore
from stockade.testing.conformance.fence import CLUSTER, KEYS
from stockade.testing.conformance.fence_paused import NotBounded, PausedBound
from stockade.testing.fences.redis import AsyncRedisHarness
from stockade.testing.fences.store import StoreHarness


def _own_sqlite_store(harness: Any) -> StoreHarness:
    """The paused writer's own store object: an SQLite connection must not cross a fork (the harness's clone
    is the harness itself)."""
    return StoreHarness(SQLiteStore(harness.store.path, cluster_id=CLUSTER, keys=KEYS,
                                    value_bytes_max=StoreHarness.value_bytes_max))


POSTGRES = PausedBound(
    limits.SUPERSEDE_AFTER_MS,
    "install(supersede_after_ms=) (default 2000 ms): then the newer check ends the lower holder's session "
    "(the installing role needs pg_signal_backend), and the paused writer's commit raises Superseded")
SQLITE_DB = NotBounded(
    "the fenced transaction holds the database file's write lock from its check to its "
    "commit, and nothing in SQLite can take it from a paused process: a newer writer waits for it "
    "(busy_timeout, then BackendUnavailable) as long as the writer is paused")
_REDIS_WHY = "the batch is sent as one script when the block ends: a paused writer holds nothing"


def _own_async_redis(harness: Any) -> AsyncRedisHarness:
    """The paused writer's own event loop: the harness's clone shares its loop thread, which a fork does not copy."""
    return AsyncRedisHarness(harness.server, CLUSTER, KEYS, harness.mutant)


REDIS = PausedBound(0, _REDIS_WHY)
REDIS_ASYNC = PausedBound(0, _REDIS_WHY, _own_async_redis)
FILES = NotBounded(
    "a batch holds its scope's flock from its check to its last rename (R6: a higher token waits for an open "
    "lower batch), and only the holder's close or death releases a flock: a newer batch waits as long as "
    "the writer is paused, up to its lock_wait_ms (default 30 s), then BackendUnavailable")
STORE_SQLITE = PausedBound(0, "the steps are kept in memory and applied in one short write transaction "
                              "when the block ends: a paused writer holds nothing",
                           _own_sqlite_store)
STORE_MEMORY = NotBounded(
    "one process's memory: no other process shares the store, and a paused process pauses all its threads",
    staged=False)
