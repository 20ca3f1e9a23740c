"""``stockade serve``: the coordinator and the fenced store behind one HTTP API.

The wire contract is docs/http-api.md, as data in `stockade.wire` (routes,
problem types, documents), shared with the remote client. OpenAPI at
``/openapi.json``. Layout:

- `app`: handlers for the routes of `stockade.wire.routes`, errors to problem documents, lifecycle.
- `_inputs`: strict input parsing (JSON bodies, query, headers, path segments).
- `openapi`: the OpenAPI 3.1 document, rendered from the route table and `stockade.core.limits`.
- `_http`: a lean HTTP/1.1 server on asyncio + httptools, with its bounds.
- `_leases`: the lease table in memory, FIFO long-poll waits, durable writes.
- `_groupcommit`: one writer thread per file; one transaction and fsync per batch.
- `_auth`, `_metrics`, `_logging`: bearer tokens, Prometheus, JSON logs.

Needs the ``server`` extra (``pip install 'stockade[server]'``).
"""

from __future__ import annotations

from stockade.server.app import DEFAULT_PORT, PROBLEMS, Server, ServerConfig, run

__all__ = ["Server", "ServerConfig", "run", "PROBLEMS", "DEFAULT_PORT"]
