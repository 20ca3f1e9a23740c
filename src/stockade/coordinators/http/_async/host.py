"""``sqlite:///coord.db`` (``process=host``, the default): the file's leases through the host's one coordinator process.

The client is the HTTP client of a `stockade serve`, over the Unix socket
``coord.db.sock`` instead of TCP (`stockade.coordinators.sqlite._host` names the
paths, starts the process and says why). A connect that finds no live socket
(none yet, the process exited when idle, or it was killed) starts the process
and connects again: every client of the url can start it, and one is started.
"""

from __future__ import annotations

from pathlib import Path

from stockade.client._shared import CONNECT_TIMEOUT_MS_DEFAULT, TIMEOUT_MS_DEFAULT, TIMEOUT_MS_MAX, HTTPEndpoint
from stockade.coordinators.http._async.port import AsyncHTTPCoordinatorPort, fetch_cluster_id
from stockade.coordinators.registry import PortOptions
from stockade.coordinators.sqlite._file import inspect_coordinator_path
from stockade.coordinators.sqlite._host import socket_path, start_host_process
from stockade.core.errors import BackendUnavailable, InvalidArgument
from stockade.core.limits import validate_int
from stockade.keys import KeyFile, keyring_path
from stockade.transport._async.http_client import AsyncHTTPClient, AsyncHTTPConnection
from stockade.transport.io import AsyncIO
from stockade.transport.sqlite_url import sqlite_path

__all__ = ["AsyncHostClient", "AsyncHostCoordinatorPort", "open_host_port"]

#: What ``Host:`` says on the socket (one host, one file: no name to give).
AUTHORITY = "localhost"


class AsyncHostClient(AsyncHTTPClient):
    """The HTTP client of the host process of ``file``, which it starts when its socket does not answer."""

    #: Whether a connect that finds no live socket starts the process; a seam for the controls of the test
    #: suite (a client that only connects: after a kill -9 it fails), never off in production.
    starts_process = True

    def __init__(self, endpoint: HTTPEndpoint, file: Path) -> None:
        super().__init__(endpoint)
        self.file = file
        self.starts = 0  # host processes this client started (or found started under the start lock)

    async def _connect(self) -> AsyncHTTPConnection:
        timeout_s = self.endpoint.connect_timeout_ms / 1000
        stream = await AsyncIO.open_unix(str(socket_path(self.file)), timeout_s=timeout_s)
        return AsyncHTTPConnection(stream)

    async def _open(self) -> AsyncHTTPConnection:
        try:
            try:
                return await self._connect()
            except (FileNotFoundError, ConnectionRefusedError):  # none yet, exited when idle, or killed
                if not self.starts_process:
                    raise
                await AsyncIO.run_blocking(start_host_process, self.file)
                self.starts += 1
                return await self._connect()
        except TimeoutError as exc:
            raise BackendUnavailable(
                f"connect to the host process of {self.file} timed out after {self.endpoint.connect_timeout_ms} ms",
                certain_no_effect=True,
            ) from exc
        except OSError as exc:
            raise BackendUnavailable(f"cannot connect to the host process of {self.file}: {exc.strerror or exc}",
                                     certain_no_effect=True) from exc


class AsyncHostCoordinatorPort(AsyncHTTPCoordinatorPort):
    """The HTTP coordinator port of the host process of ``client.file``, whose verify keys are the file's own.

    ``coord.verify_keys()`` is the keyring beside the file (``coord.keys``, which the host process signs with),
    followed as an embedded process follows it: the client is on the file's host and its owner (the socket is
    mode 0600), where the server's administrators' route would want a bearer token the host process has none of.
    """

    def __init__(self, client: AsyncHostClient, *, cluster_id: str | None) -> None:
        super().__init__(client, cluster_id=cluster_id)
        self.file = client.file

    @property
    def keys(self) -> KeyFile:  # type: ignore[override]  # the port protocol's is `object`; a server's: FixedKeys
        """The file's keyring (`stockade.keys.KeyFile`), checked against the cluster id when it is known.

        Raises:
            BackendUnavailable: no keyring yet (the host process was never reached), or it cannot be read.
        """
        return KeyFile(keyring_path(self.file), self.cluster_id)


def open_host_port(options: PortOptions) -> AsyncHostCoordinatorPort:
    """The ``process=host`` value (the default) of the ``sqlite`` entry of `stockade.coordinators.registry`.

    The file is checked as the embedded coordinator checks it (`WrongFileKind` for
    anything but a coordinator file, nothing created); outside a running event loop
    (and in the sync client) the process is reached, and started if need be, here.

    Raises:
        InvalidArgument: a bad path, or an option the host process does not take from a client
            (``lock_delay_ms``: the process has its own; ``auth_token``, ``tls_ca``: the socket is the owner's).
        BackendUnavailable: the process cannot be started or reached.
    """
    for name in ("auth_token", "tls_ca"):
        if getattr(options, name) is not None:
            raise InvalidArgument(name, "does not apply to sqlite:// urls (the socket is its owner's, mode 0600)")
    if options.lock_delay_ms:
        raise InvalidArgument("lock_delay_ms", "not with process=host, the default of sqlite:// urls: the host "
                                               "process grants with its own (0); add ?process=embedded to set it")
    file = sqlite_path(options.location).absolute()
    inspect_coordinator_path(file)
    timeout_ms = TIMEOUT_MS_DEFAULT if options.timeout_ms is None else options.timeout_ms
    connect_ms = CONNECT_TIMEOUT_MS_DEFAULT if options.connect_timeout_ms is None else options.connect_timeout_ms
    endpoint = HTTPEndpoint(host=AUTHORITY, port=0, base_path="", tls=None, authority=AUTHORITY, auth_token=None,
                            timeout_ms=validate_int("timeout_ms", timeout_ms, 1, TIMEOUT_MS_MAX),
                            connect_timeout_ms=validate_int("connect_timeout_ms", connect_ms, 1, TIMEOUT_MS_MAX),
                            unix_path=str(socket_path(file)))
    cluster_id = None if AsyncIO.loop_running() else AsyncIO.run_now(lambda: _cluster_id(endpoint, file))
    return AsyncHostCoordinatorPort(AsyncHostClient(endpoint, file), cluster_id=cluster_id)


async def _cluster_id(endpoint: HTTPEndpoint, file: Path) -> str:
    """The file's cluster id from its host process (started if need be), on a client of its own."""
    client = AsyncHostClient(endpoint, file)
    try:
        return await fetch_cluster_id(client)
    finally:
        await client.aclose()
