"""The fence targets of the project's own adapters, one `FenceTarget` each, named by the resource registry.

`stockade.resources.registry.FENCE_TARGETS` names each of these as ``"stockade.testing.fences.targets:NAME"``;
tests/test_fence_conformance.py runs every fence suite over what the registry names
(`stockade.testing.conformance.fence_target.fence_targets`). Each descriptor gathers what used to be
one hand list per capability: the harness opener (`stockade.testing.fences.<adapter>`), the L2 opener
(`stockade.testing.fences.keyed`), the partial failures (`stockade.testing.fences.partial`), the
paused-writer bound (`stockade.testing.fences.paused`), and whether it offers operation ids, isolation and
the outsider class, or why not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stockade.keys import FixedKeys
from stockade.testing.conformance.fence_target import FenceTarget
from stockade.testing.fences import keyed as fence_keyed
from stockade.testing.fences import partial as fence_partial
from stockade.testing.fences import paused as fence_paused
from stockade.testing.fences.files import make_files_harness
from stockade.testing.fences.postgres import make_postgres_harness
from stockade.testing.fences.redis import make_async_redis_harness, make_redis_harness
from stockade.testing.fences.sqlite_db import make_sqlite_db_harness, make_sqlite_db_sqlalchemy_harness
from stockade.testing.fences.store import make_memory_harness, make_sqlite_store_harness


def _memory(tmp_path: Path, cluster_id: str, keys: FixedKeys, mutant: str | None) -> Any:
    return make_memory_harness(cluster_id, keys, mutant)


_SQLITE_FLOORS = "stockade.resources.store._floor_sqlite:open_floor_target"  # the store's and a user's file
_STORE_IDS = "the store's own idempotency keys (R3, Idempotency-Key), held by the store suite"
_STORE_ISOLATION = "no transaction of the user's: the unit is the store's own, checked when it applies"
_SQLITE_ROLES = "no roles: whoever may open the file may lock it (the file's permissions are the boundary)"
_REDIS_ISOLATION = "no snapshot: the check runs in the script that applies the batch (MULTI/EXEC reads nothing)"
_REDIS_ROLES = "the fence takes no lock (one script); a client that may call the script may call any"

STORE_MEMORY = FenceTarget(
    name="store-memory", open=_memory, keyed=fence_keyed.store_memory,
    partial_failures=fence_partial.STORE, paused=fence_paused.STORE_MEMORY,
    operation_ids=_STORE_IDS, isolation=_STORE_ISOLATION, outsiders="no roles: one process's memory",
)
STORE_SQLITE = FenceTarget(
    name="store-sqlite", open=make_sqlite_store_harness, keyed=fence_keyed.store_sqlite,
    partial_failures=fence_partial.STORE, paused=fence_paused.STORE_SQLITE,
    operation_ids=_STORE_IDS, isolation=_STORE_ISOLATION,
    outsiders="no roles: a file of stockade's own; who may open it is the file's permissions",
    floors=_SQLITE_FLOORS, shared_core=True,
)
SQLITE_DB = FenceTarget(
    name="sqlite-db", open=make_sqlite_db_harness, keyed=fence_keyed.sqlite_db(False),
    partial_failures=fence_partial.SQLITE, paused=fence_paused.SQLITE_DB,
    operation_ids=True, isolation=True, outsiders=_SQLITE_ROLES, floors=_SQLITE_FLOORS,
)
SQLITE_DB_SQLALCHEMY = FenceTarget(
    name="sqlite-db-sqlalchemy", open=make_sqlite_db_sqlalchemy_harness, keyed=fence_keyed.sqlite_db(True),
    partial_failures=fence_partial.SQLITE, paused=fence_paused.SQLITE_DB,
    operation_ids=True, isolation=True, outsiders=_SQLITE_ROLES, shared_core=True,
)
FILES = FenceTarget(
    name="files", open=make_files_harness, keyed=fence_keyed.files,
    partial_failures=fence_partial.FILES, paused=fence_paused.FILES,
    operation_ids="no operation ids: a file write replaces the whole file, so its retry lands the same bytes "
                  "(docs/fence-files.md)",
    isolation="no snapshot: the check and the rename happen under the scope's file lock, at the unit's end",
    outsiders="no roles but the file system's: whoever may open the lock file may lock it",
    floors="stockade.resources.files:open_floor_target",
)
POSTGRES = FenceTarget(
    name="postgres", open=make_postgres_harness("postgres"), keyed=fence_keyed.postgres("postgres"),
    partial_failures=fence_partial.POSTGRES, paused=fence_paused.POSTGRES,
    operation_ids=True, isolation=True, outsiders=True, floors="stockade.resources.postgres:open_floor_target",
    refused_none_before_l2=True,
)
POSTGRES_ASYNC = FenceTarget(
    name="postgres-async", open=make_postgres_harness("postgres-async"), keyed=fence_keyed.postgres("postgres-async"),
    partial_failures=fence_partial.POSTGRES, paused=fence_paused.POSTGRES, operation_ids=True,
    isolation="the same SQL function as 'postgres' (its front end adds no check); run there",
    outsiders="the same SQL function and locks as 'postgres'; run there",
    shared_core=True, refused_none_before_l2=True,
)
POSTGRES_SQLALCHEMY = FenceTarget(
    name="postgres-sqlalchemy", open=make_postgres_harness("postgres-sqlalchemy"),
    keyed=fence_keyed.postgres("postgres-sqlalchemy"),
    partial_failures=fence_partial.POSTGRES, paused=fence_paused.POSTGRES, operation_ids=True,
    isolation="the same SQL function as 'postgres' (its front end adds no check); run there",
    outsiders="the same SQL function and locks as 'postgres'; run there",
    shared_core=True, refused_none_before_l2=True,
)
POSTGRES_SQL_ASCII = FenceTarget(
    name="postgres-sql_ascii", open=make_postgres_harness("postgres-sql_ascii"),
    keyed=fence_keyed.postgres("postgres-sql_ascii"),
    partial_failures=fence_partial.POSTGRES, paused=fence_paused.POSTGRES, operation_ids=True,
    isolation="the same SQL function as 'postgres', on a SQL_ASCII database; run there",
    outsiders="the same SQL function and locks as 'postgres', on a SQL_ASCII database; run there",
    shared_core=True, refused_none_before_l2=True,
)
REDIS = FenceTarget(
    name="redis", open=make_redis_harness, keyed=fence_keyed.redis_fence("redis"),
    partial_failures=fence_partial.REDIS, paused=fence_paused.REDIS,
    operation_ids="no operation ids: a retried batch is safe for SET, DEL and HSET, which land the same twice, "
                  "and not for INCRBY or XADD (docs/fence-redis.md, Retries)",
    isolation=_REDIS_ISOLATION, outsiders=_REDIS_ROLES, floors="stockade.resources.redis:open_floor_target",
)
REDIS_ASYNC = FenceTarget(
    name="redis-async", open=make_async_redis_harness, keyed=fence_keyed.redis_fence("redis-async"),
    partial_failures=fence_partial.REDIS, paused=fence_paused.REDIS_ASYNC, operation_ids="as redis",
    isolation=_REDIS_ISOLATION, outsiders=_REDIS_ROLES, shared_core=True,
)
