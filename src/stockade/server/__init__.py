"""``stockade serve``: the coordinator and the fenced store behind one HTTP API.

The wire contract is docs/http-api.md (OpenAPI at ``/openapi.json``). Layout:

- `app`: routes, strict input parsing, the error-to-status table, lifecycle.
- `openapi`: the OpenAPI 3.1 document, built from `stockade.core.limits`.
- `_http`: a lean HTTP/1.1 server on asyncio + httptools, with its bounds.
- `_leases`: the lease table in memory, FIFO long-poll waits, durable writes.
- `_groupcommit`: one writer thread per file; one transaction and fsync per batch.
- `_auth`, `_metrics`, `_logging`: bearer tokens, Prometheus, JSON logs.

Needs the ``server`` extra (``pip install 'stockade[server]'``).
"""

from __future__ import annotations

from stockade.server.app import DEFAULT_PORT, PROBLEMS, Server, ServerConfig, run

__all__ = ["Server", "ServerConfig", "run", "PROBLEMS", "DEFAULT_PORT"]
