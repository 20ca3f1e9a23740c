"""Coordinator backends: where leases and tokens come from. One folder per backend, found by its scheme.

- `memory`: records in memory; the server's table, the simulator's, and ``memory://NAME``.
- `sqlite`: the embedded default, one SQLite file (several processes of one host may share it).
- `postgres`: tables in a PostgreSQL server, waiters woken by LISTEN/NOTIFY.
- `etcd`, `zookeeper`: a cluster's own leases, spoken to by the backend's port.
- `http`: a `stockade serve`, spoken to over HTTP/1.1.

`registry` maps url schemes to backends, their capabilities and what opens each (``"module:function"``,
imported on use). A backend's client port is its folder's ``_async/port.py``, the sync twin generated.
"""
