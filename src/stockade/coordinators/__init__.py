"""Coordinator backends: where leases and tokens come from.

Each is the one lease engine (`stockade.core.engine`) over a record store:

- `sqlite`: the embedded default, one SQLite file (several processes of one host may share it).
- `memory`: records in memory; the server's table, the simulator's, and ``memory://NAME``.

`registry` maps url schemes to backends and their capabilities.
"""
