"""Opening a `stockade serve` by url: the ``http`` and ``https`` entries of `stockade.coordinators.registry`."""

from __future__ import annotations

from stockade.client._shared import http_endpoint
from stockade.coordinators.http._async.port import (
    AsyncHTTPCoordinatorPort,
    AsyncHTTPStorePort,
    check_store_cluster,
    fetch_cluster_id,
)
from stockade.coordinators.registry import PortOptions
from stockade.core.errors import InvalidArgument
from stockade.core.tokens import validate_cluster_id
from stockade.transport._async.http_client import AsyncHTTPClient
from stockade.transport.http11 import HTTPEndpoint
from stockade.transport.io import AsyncIO

__all__ = ["open_port", "open_store_port", "remote_cluster_id"]


def remote_cluster_id(endpoint: HTTPEndpoint) -> str:
    """The server's cluster id, by one blocking round trip when the handle is opened.

    Only where nothing can be blocked: in the sync client, or when the async
    client is opened outside a running event loop. Inside a loop the async
    handle fetches it on its first ``await`` instead (`AsyncHTTPCoordinatorPort.open`).
    """

    async def read() -> str:
        client = AsyncHTTPClient(endpoint)
        try:
            return await fetch_cluster_id(client)
        finally:
            await client.aclose()

    return AsyncIO.run_now(read)


def _endpoint(options: PortOptions) -> HTTPEndpoint:
    return http_endpoint(options.url, timeout_ms=options.timeout_ms, connect_timeout_ms=options.connect_timeout_ms,
                         auth_token=options.auth_token, tls_ca=options.tls_ca)


def open_port(options: PortOptions) -> AsyncHTTPCoordinatorPort:
    """The ``http://`` and ``https://`` entries of `stockade.coordinators.registry`: a `stockade serve`.

    Outside a running event loop (and in the sync client) its cluster id is fetched here.

    Raises:
        InvalidArgument: a bad url or option. BackendUnavailable: the server cannot be reached.
    """
    endpoint = _endpoint(options)
    cluster_id = None if AsyncIO.loop_running() else remote_cluster_id(endpoint)
    return AsyncHTTPCoordinatorPort(AsyncHTTPClient(endpoint), cluster_id=cluster_id)


def open_store_port(options: PortOptions, *, cluster_id: str | None, keys: object) -> AsyncHTTPStorePort:
    """The store of a `stockade serve`, which trusts that server's tokens (`stockade.open_store_async`).

    Raises:
        InvalidArgument: ``keys`` given (the server verifies with its own), a bad ``cluster_id``, or one that
            differs from the server's (checked on the first ``await`` inside a running loop).
        BackendUnavailable: the server cannot be reached.
    """
    if keys is not None:
        raise InvalidArgument("keys", "a stockade serve verifies with its own keys")
    if cluster_id is not None:
        validate_cluster_id(cluster_id, "cluster_id")
    endpoint = _endpoint(options)
    client = AsyncHTTPClient(endpoint)
    if AsyncIO.loop_running():  # checked on the first await or use, without blocking the loop
        return AsyncHTTPStorePort(client, cluster_id=None, expected_cluster_id=cluster_id)
    remote = remote_cluster_id(endpoint)
    check_store_cluster(cluster_id, remote)
    return AsyncHTTPStorePort(client, cluster_id=remote)
