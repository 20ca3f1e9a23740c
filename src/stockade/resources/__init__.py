"""Resources: what enforces tokens.

- `store`: stockade's own fenced key-value store on SQLite (the public entry
  point; the rooms behind it are `sqlite_store`, `_tx`, `backup`,
  `_sqlite_files`, `_inputs` and `_observe`).
- `memory`: the same store, in memory.
- `port`: the fenced-store port every resource offers.
- `registry`: url schemes to resources.
"""
