"""``stockade serve``: the coordinator and the fenced store behind one HTTP API.

The wire contract is docs/http-api.md, as data in `stockade.wire` (routes,
problem types, documents), shared with the remote client. OpenAPI at
``/openapi.json``. Layout:

- `app`: handlers for the routes of `stockade.wire.routes`, errors to problem documents, lifecycle.
- `_lifetime`: the process: one event loop, the stop signals, the ready callback.
- `_inputs`: strict input parsing (JSON bodies, query, headers, path segments).
- `openapi`: the OpenAPI 3.1 document, rendered from the route table and `stockade.core.limits`.
- `_http`: a lean HTTP/1.1 server on asyncio, with its bounds.
- `_h1`: the pure-Python request parser (the base install's); httptools' when installed.
- `_guard`: bounds across connections: timeouts, the connection cap, request bytes in memory,
  fair shares per source address and per bearer token.
- `_leases`: the lease table in memory, FIFO long-poll waits, durable writes.
- `_port_leases`: the same routes over another backend's coordinator port (``--coordinator URL``).
- `_groupcommit`: one writer thread per file; one transaction and fsync per batch.
- `_auth`, `_metrics`, `_logging`: bearer tokens (limited to scopes), Prometheus, JSON logs.

`ServerConfig` and `Server` here are those of `app` with the transport's
numbers (`stockade.server._guard.TransportSettings`) added; `run` serves one.

Needs only the standard library; the ``server`` extra (``pip install 'stockade[server]'``: httptools,
uvloop) makes it faster and changes no answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, fields

from stockade.server import _lifetime
from stockade.server import app as _app
from stockade.server._auth import BearerAuth
from stockade.server._guard import (
    BODY_RATE_MIN,
    BODY_TIMEOUT_S,
    BUFFER_BYTES_MAX,
    CONNECTIONS_MAX,
    HEADER_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    PEER_CONNECTIONS_MAX,
    PEER_WAITERS_MAX,
    TOKEN_CONNECTIONS_MAX,
    TOKEN_WAITERS_MAX,
    ConnectionLimits,
    TransportSettings,
    raise_file_limit,
)
from stockade.server._port_leases import check_coordinator_url, open_port_leases
from stockade.server.app import DEFAULT_PORT, PROBLEMS

__all__ = ["Server", "ServerConfig", "run", "PROBLEMS", "DEFAULT_PORT"]


@dataclass
class ServerConfig(_app.ServerConfig):
    """Everything ``stockade serve`` is configured with (validated by `Server`).

    The transport's numbers (defaults in `stockade.server._guard`): ``idle_timeout_s``
    (a keep-alive connection with no request), ``header_timeout_s`` (a request's
    first byte to the end of its headers), ``body_timeout_s`` and ``body_rate_min``
    (bytes/s on average after 2 s) for its body, ``connections_max``, and
    ``buffer_bytes_max`` (request bytes in memory, all connections together), and the
    fair shares: ``peer_connections_max`` and ``peer_waiters_max`` per source address,
    ``token_connections_max`` and ``token_waiters_max`` per bearer token.
    ``coordinator``: serve the leases of this backend url (``postgresql://``,
    ``etcd://``...; `stockade.server._port_leases`) instead of ``data_dir/coord.db``;
    ``lock_delay_ms`` then applies to the grants made through the server (C5).
    """

    coordinator: str | None = None

    idle_timeout_s: float = IDLE_TIMEOUT_S
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    body_rate_min: int = BODY_RATE_MIN
    connections_max: int = CONNECTIONS_MAX
    buffer_bytes_max: int = BUFFER_BYTES_MAX
    peer_connections_max: int = PEER_CONNECTIONS_MAX
    peer_waiters_max: int = PEER_WAITERS_MAX
    token_connections_max: int = TOKEN_CONNECTIONS_MAX
    token_waiters_max: int = TOKEN_WAITERS_MAX

    def transport(self) -> TransportSettings:
        """The transport settings (raises InvalidArgument for a bad one)."""
        return TransportSettings(**{f.name: getattr(self, f.name) for f in fields(TransportSettings)})


class Server(_app.Server):
    """`stockade.server.app.Server`, its connections bounded by the config's transport settings,
    and bearer tokens (with their scopes) checked before a request's body is read."""

    def __init__(self, config: _app.ServerConfig) -> None:
        super().__init__(config)
        self.coordinator = getattr(config, "coordinator", None)
        if self.coordinator is not None:
            check_coordinator_url(self.coordinator)
        settings = config.transport() if isinstance(config, ServerConfig) else TransportSettings()
        self._limits = ConnectionLimits(settings=settings)
        if config.auth_tokens:
            self._limits.authorize = BearerAuth(config.auth_tokens).refusal
        raise_file_limit(settings.connections_max)

    async def start(self) -> None:
        await super().start()  # binds; no connection is served before this method returns
        if self.app is not None:
            self.app.shares = self._limits  # the waiting acquires' shares (the transport keeps the rest)

    async def open_leases(self, loop: asyncio.AbstractEventLoop) -> tuple[_app.Leases, object]:
        """``--coordinator``'s backend and its keyring, or (without it) the server's own coordinator file."""
        if self.coordinator is None:
            return await super().open_leases(loop)
        leases = await open_port_leases(self.coordinator, lock_delay_ms=self.config.lock_delay_ms)
        return leases, leases.keys

    async def close(self) -> None:
        self._limits.stop()
        await super().close()


def run(config: _app.ServerConfig, *, ready: Callable[[_app.Server], None] | None = None) -> int:
    """Run a `Server` (transport bounds included) until SIGTERM or SIGINT; see `stockade.server._lifetime.run`."""
    return _lifetime.run(config, ready=ready, server_class=Server)
