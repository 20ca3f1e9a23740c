"""The fence harnesses of the project's own adapters, shipped with the conformance kit.

Each module drives one adapter through `stockade.testing.conformance.fence.FenceHarness` (its controls
too: ``fencing-off``, ``strict-greater``, ``check-then-write``), and `targets` gathers them into one
`stockade.testing.conformance.fence_target.FenceTarget` per adapter, as named by
`stockade.resources.registry.FENCE_TARGETS`. A third party's adapter is written the same way (the toy one,
`stockade.testing.toy_fence`, is the smallest example); the servers the PostgreSQL and Redis harnesses
start are `stockade.testing.servers`.

- `store`: stockade's own store (`MemoryStore`, `SQLiteStore`), the suite's reference targets.
- `sqlite_db`: a user's SQLite file (stdlib ``sqlite3`` and SQLAlchemy).
- `files`: a fenced directory.
- `postgres`: a user's PostgreSQL (psycopg 3 sync and async, SQLAlchemy, a SQL_ASCII database).
- `redis`: a user's Redis (redis-py sync and asyncio).
- `keyed`, `partial`, `paused`: each target's L2 opener, partial failures and paused-writer bound.
- `targets`: the descriptors.
"""
