"""An HTTP/1.1 client over keep-alive connections: the I/O half of `stockade.transport.http11`.

Written once as async code; the sync client in ``transport/_sync/`` is
generated from it (scripts/unasync.py). It moves the bytes that ``http11``
frames, for the two backends that speak HTTP: the remote `stockade serve`
(``coordinators/http/``) and etcd's JSON gateway (``coordinators/etcd/``).

Connections are kept open and reused (one per concurrent request, up to
`IDLE_CONNECTIONS_MAX` kept idle). An idle connection the server has closed is
noticed before use; a reused one that fails before any byte of the answer
arrived is retried once on a fresh connection (the server closed it between
our check and our send, so it saw nothing). Every request has a deadline.
"""

from __future__ import annotations

import time
from typing import Any

from stockade.core import leases as core_leases
from stockade.core.errors import BackendUnavailable
from stockade.transport.http11 import (
    RESPONSE_HEAD_BYTES_MAX,
    Head,
    HTTPEndpoint,
    HTTPResponse,
    ProtocolError,
    build_request,
    chunk_size,
    error_for,
    fixed_fields,
    json_body,
    parse_head,
)
from stockade.transport.io import AsyncIO

__all__ = ["AsyncHTTPClient", "AsyncHTTPConnection", "IDLE_CONNECTIONS_MAX"]

IDLE_CONNECTIONS_MAX = 8
RECEIVE_BYTES = 65536
_HEAD_END = b"\r\n\r\n"


#: Response heads parsed lately, by their bytes and the request's method: a server sends the same few heads
#: again and again (a release's ``204``, an acquire's ``200`` with a body of the same length), and
#: `parse_head` depends on nothing else. Bounded: emptied when full.
_HEADS: dict[tuple[bytes, str], Head] = {}
HEADS_KEPT_MAX = 64
HEAD_KEPT_BYTES_MAX = 512


def _parsed(raw: bytes, method: str) -> Head:
    """`parse_head`, its result kept in `_HEADS` for the next time the same head comes."""
    head = parse_head(raw, method=method)
    if len(raw) <= HEAD_KEPT_BYTES_MAX:
        if len(_HEADS) >= HEADS_KEPT_MAX:
            _HEADS.clear()
        _HEADS[(raw, method)] = head
    return head


class _PeerClosed(ConnectionError):
    """The server closed the connection before the answer was complete."""


class AsyncHTTPConnection:
    """One keep-alive HTTP/1.1 connection; one request at a time."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._buffer = b""
        self.received_any = False
        self.reusable = False

    def is_stale(self) -> bool:
        return bool(self._buffer) or self._stream.is_stale()

    def close(self) -> None:
        self.reusable = False
        self._stream.close()

    async def _receive(self, deadline: float) -> None:
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise TimeoutError("deadline passed")
        data = await self._stream.receive(RECEIVE_BYTES, remaining_s)
        if not data:
            raise _PeerClosed("server closed the connection")
        self.received_any = True
        self._buffer += data

    async def _receive_until(self, marker: bytes, deadline: float, bytes_max: int) -> bytes:
        while True:
            end = self._buffer.find(marker)
            if end >= 0:
                found, self._buffer = self._buffer[:end], self._buffer[end + len(marker):]
                return found
            if len(self._buffer) > bytes_max:
                raise ProtocolError(f"no {marker!r} within {bytes_max} bytes")
            await self._receive(deadline)

    async def _receive_exactly(self, size: int, deadline: float) -> bytes:
        while len(self._buffer) < size:
            await self._receive(deadline)
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    async def roundtrip(self, method: str, request: bytes, deadline: float) -> HTTPResponse:
        """Send ``request`` and read its answer by ``deadline`` (``time.monotonic()``).

        Raises:
            OSError: the connection failed or the deadline passed (`TimeoutError`).
            ProtocolError: the answer was not HTTP/1.1 as expected.
        """
        self.reusable = False
        self.received_any = False
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise TimeoutError("deadline passed")
        await self._stream.send(request, remaining_s)
        while True:
            end = self._buffer.find(_HEAD_END)  # `_receive_until`, written out: this is every request's path
            while end < 0:
                if len(self._buffer) > RESPONSE_HEAD_BYTES_MAX:
                    raise ProtocolError(f"no {_HEAD_END!r} within {RESPONSE_HEAD_BYTES_MAX} bytes")
                await self._receive(deadline)
                end = self._buffer.find(_HEAD_END)
            raw, self._buffer = self._buffer[:end], self._buffer[end + 4:]
            head = _HEADS.get((raw, method)) or _parsed(raw, method)
            if head.status >= 200:
                break  # 1xx: interim answers are skipped
        if 0 <= head.body_length <= len(self._buffer):  # the usual: the body came with its head
            body, self._buffer = self._buffer[:head.body_length], self._buffer[head.body_length:]
        elif head.body_length >= 0:
            body = await self._receive_exactly(head.body_length, deadline)
        elif head.body_length == -1:
            body = await self._receive_chunked(deadline)
        else:
            body = await self._receive_until_close(deadline)
        self.reusable = head.keep_alive and not self._buffer
        return HTTPResponse(head.status, head.headers.copy(), body)  # its own headers: the head may be reused

    async def _receive_chunked(self, deadline: float) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            size = chunk_size(await self._receive_until(b"\r\n", deadline, 1024))
            total += size
            if total > RESPONSE_HEAD_BYTES_MAX * 64:
                raise ProtocolError("chunked body too large")
            if size == 0:
                while await self._receive_until(b"\r\n", deadline, RESPONSE_HEAD_BYTES_MAX):
                    pass  # trailer fields, unused
                return b"".join(chunks)
            chunks.append(await self._receive_exactly(size, deadline))
            if await self._receive_exactly(2, deadline) != b"\r\n":
                raise ProtocolError("bad chunk end")

    async def _receive_until_close(self, deadline: float) -> bytes:
        while True:
            try:
                await self._receive(deadline)
            except _PeerClosed:
                data, self._buffer = self._buffer, b""
                return data
            if len(self._buffer) > RESPONSE_HEAD_BYTES_MAX * 64:
                raise ProtocolError("response body too large")


class AsyncHTTPClient:
    """Requests to one server over a small pool of keep-alive connections.

    Safe to share between the caller and lease keepalives (tasks, or threads
    in the sync client): each request takes a connection of its own.
    """

    def __init__(self, endpoint: HTTPEndpoint) -> None:
        self.endpoint = endpoint
        self._fixed = fixed_fields(endpoint.authority, endpoint.auth_token)  # made once: the same on every request
        self._idle: list[AsyncHTTPConnection] = []
        self._closed = False

    async def _open(self) -> AsyncHTTPConnection:
        endpoint = self.endpoint
        try:
            stream = await AsyncIO.open_tcp(
                endpoint.host, endpoint.port, tls=endpoint.tls, timeout_s=endpoint.connect_timeout_ms / 1000
            )
        except TimeoutError as exc:
            raise BackendUnavailable(
                f"connect to {endpoint.authority} timed out after {endpoint.connect_timeout_ms} ms",
                certain_no_effect=True,
            ) from exc
        except OSError as exc:
            raise BackendUnavailable(
                f"cannot connect to {endpoint.authority}: {exc.strerror or exc}",
                certain_no_effect=True,
            ) from exc
        return AsyncHTTPConnection(stream)

    def _checkout(self) -> AsyncHTTPConnection | None:
        while True:
            try:
                connection = self._idle.pop()
            except IndexError:
                return None
            if not (connection._buffer or connection._stream.is_stale()):  # `is_stale`, without its call
                return connection
            connection.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        timeout_ms: int,
        body: bytes = b"",
        content_type: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        idempotent: bool | None = None,
    ) -> HTTPResponse:
        """One request; any status is returned, the caller maps problems.

        A reused keep-alive connection that fails before any answer byte is
        retried once on a fresh one, but only for a request that may safely
        arrive twice (``idempotent``, default: GET). An acquire or a store
        write is never sent twice: the first may have been applied.

        Raises:
            BackendUnavailable: closed client, connect failure (``certain_no_effect``),
                timeout or broken connection (outcome unknown), or not HTTP.
        """
        if self._closed:
            raise BackendUnavailable("the client is closed", certain_no_effect=True)
        endpoint = self.endpoint
        request = build_request(
            method, endpoint.base_path + path, authority=endpoint.authority, auth_token=endpoint.auth_token,
            body=body, content_type=content_type, headers=headers, fixed=self._fixed,
        )
        deadline = time.monotonic() + timeout_ms / 1000
        retry_safe = method == "GET" if idempotent is None else idempotent
        connection = self._checkout() if self._idle else None
        reused = connection is not None
        for attempt in (1, 2):
            if connection is None:
                connection = await self._open()
            try:
                response = await connection.roundtrip(method, request, deadline)
            except TimeoutError as exc:
                connection.close()
                shown = core_leases.redact_lease_path(path)  # made only for the message
                raise BackendUnavailable(
                    f"{method} {shown}: no answer from {endpoint.authority} within {timeout_ms} ms"
                ) from exc
            except (OSError, ProtocolError) as exc:
                connection.close()
                fresh_start = reused and not connection.received_any and not isinstance(exc, ProtocolError)
                if attempt == 1 and fresh_start and retry_safe:
                    connection = None
                    continue
                shown = core_leases.redact_lease_path(path)
                raise BackendUnavailable(
                    f"{method} {shown}: connection to {endpoint.authority} failed: {exc}"
                ) from exc
            except BaseException:
                connection.close()  # cancelled mid-request: the stream's state is unknown
                raise
            if connection.reusable and not self._closed and len(self._idle) < IDLE_CONNECTIONS_MAX:  # kept for the next
                self._idle.append(connection)
            else:
                connection.close()
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    async def get_json(self, path: str, *, timeout_ms: int | None = None) -> tuple[HTTPResponse, Any]:
        response = await self.request("GET", path, timeout_ms=timeout_ms or self.endpoint.timeout_ms)
        if response.status != 200:
            error, problem = error_for(response)
            raise error from problem
        return response, json_body(response)

    async def aclose(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()
