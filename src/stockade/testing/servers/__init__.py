"""Throwaway servers for tests, shipped with the conformance kit (`stockade.testing.conformance`).

An adapter's conformance run needs a real server to fence; these start one on a free loopback port in a
temporary directory, durable settings on, and stop it by its own pid:

- `stockade.testing.servers.postgres`: PostgreSQL 15 (``PostgresServer``; ``shared_server`` and
  ``fresh_database`` for one server per test process and a database per test).
- `stockade.testing.servers.redis`: ``redis-server`` 7 with AOF on (``RedisServer``).
- `stockade.testing.servers.ports`: free loopback ports, drawn below the kernel's ephemeral range (no
  outgoing connection can take one before the server binds it).
- `stockade.testing.servers.reaper`: a watcher process that ends every server a killed test process
  leaves behind.

Each is skipped where its binaries are not installed (``available``, ``require_redis``), and fails
instead under ``CI=true``.
"""
