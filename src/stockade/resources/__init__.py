"""Resources: what enforces tokens. One folder per adapter, found by its scheme.

- `store`: stockade's own fenced key-value store on SQLite (the public names; the rooms behind it are
  `store.sqlite_store`, `store.backup`, `store._sqlite_files`, and `_tx`, `_inputs`, `_observe` here).
- `memory`: the same store, in memory.
- `postgres`, `sqlite_db`, `redis`, `files`: the fences over the user's own data.
- `port`: the fenced-store port every resource offers; `floor`: raising marks to the coordinator's floors.
- `registry`: url schemes to stores and floor targets (``"module:function"``, imported on use).
"""
