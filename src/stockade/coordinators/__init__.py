"""Coordinator backends: where leases and tokens come from.

- `sqlite`: the embedded default, one SQLite file (several processes may share it).
"""
