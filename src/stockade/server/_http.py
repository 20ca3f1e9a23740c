"""A lean HTTP/1.1 server over asyncio, parsing with ``httptools`` (the parser uvicorn uses) when it is
installed and with `stockade.server._h1` (pure Python, the base install's) when not.

Why not a framework: measured on this machine with one keep-alive client, a
JSON POST round trip costs ~125 µs here and ~240 µs through uvicorn+Starlette
(7.5k vs 3.0k req/s; 14.2k vs 6.8k req/s with 8 client processes). The wire
contract (docs/http-api.md) is the product; the framework is not.

Both parsers take and refuse the same requests (`stockade.server._h1` says which), and
this layer gives every refusal its problem document, so what a client sees does not
depend on the parser; ``--http-parser`` (default ``$STOCKADE_HTTP_PARSER``, else
httptools when installed) picks one.

What this layer enforces before an application sees a request (each bound named):
URL length, header count and bytes, body size by route (checked against
``Content-Length`` before the body is read, and while reading a chunked one),
pipelined requests per connection, and, through `stockade.server._guard`,
connections per server, request bytes in memory across connections, idle /
slow request timeouts, and each source address's and bearer token's fair share
of connections and of waiting acquires (`within_share` counts the latter). A
request that breaks one is answered with a problem document (a share's with
``Retry-After``) and the connection is closed; only an acquire past its share of
waiting acquires gets its 429 on a connection that stays open.

Authentication comes before the body: once a request's headers are complete,
the guard's ``authorize`` hook may refuse it (401 without a valid bearer token,
403 for a scope the token does not cover). A refused request with a body is
answered at once and its body is never buffered: the connection drains it
briefly, without keeping it, and closes.

A handler may answer with a `Stream` (the dashboard's server-sent events): its
head goes out at once, its body is written by the stream's coroutine while it
runs, and the connection closes when it ends or is cancelled when the peer
leaves; it is the last answer of its connection.

Handlers run one at a time per connection, in order. While one runs, bytes of a
next (pipelined) request are kept unparsed, up to `RAW_BYTES_MAX`, and then the
connection stops reading until the handler ends: a connection buffers at most
one request body at a time. When the peer disconnects, the running handler is
cancelled (a long-polling acquire drops its place in the queue).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

try:
    import httptools
except ImportError:  # the base install: the pure-Python parser of _h1
    httptools = None  # type: ignore[assignment]

from stockade.server._guard import (
    BODY_GRACE_S,
    DISCARD_SECONDS,
    RETRY_AFTER_S,
    SMALL_BODY_BYTES,
    ConnectionLimits,
    Refusal,
    TransportSettings,
)
from stockade.server._h1 import (
    HEADER_BYTES_MAX,
    HEADERS_DETAIL,
    HEADERS_MAX,
    MALFORMED,
    URL_BYTES_MAX,
    URL_DETAIL,
    ParseError,
    make_parser,
    split_target,
)
from stockade.server._host import peer_of
from stockade.wire.codecs import JSON, PROBLEM_JSON, dumps
from stockade.wire.problems import PROBLEM_TYPE_PREFIX, problem_document

__all__ = [
    "Deferred",
    "Request",
    "Response",
    "Stream",
    "StreamSink",
    "HttpError",
    "HttpProtocol",
    "ConnectionLimits",
    "json_response",
    "problem",
    "problem_response",
    "refusal_response",
    "within_share",
]

PIPELINED_MAX = 16
DISCARD_BYTES_MAX = 4 * 1024 * 1024  # after an early 413, drain this much so the client reads the answer
_LINGER_RESET = struct.pack("ii", 1, 0)  # close with a reset, dropping unsent bytes
RAW_BYTES_MAX = 64 * 1024  # unparsed bytes kept while a handler runs; then reading pauses

_log = logging.getLogger("stockade.server")
_OWS = (b" ", b"\t")
_VERSIONS = ("1.1", "1.0")
# httptools' refusals (none without it): a malformed request, and a protocol upgrade it parsed to its end.
_HTTPTOOLS_ERRORS: tuple[type[Exception], ...] = () if httptools is None else (httptools.HttpParserError,)
_HTTPTOOLS_UPGRADE: tuple[type[Exception], ...] = () if httptools is None else (httptools.HttpParserUpgrade,)

# The lowercase names of the headers clients send, by their bytes as sent: found, not decoded, per request.
_HEADER_NAMES = {spelling.encode("latin-1"): spelling.lower() for name in (
    "Host", "User-Agent", "Accept", "Accept-Encoding", "Connection", "Content-Type", "Content-Length",
    "Authorization", "Transfer-Encoding", "Cookie", "Origin", "Idempotency-Key",
) for spelling in (name, name.lower())}
# Headers that decide who is asking: a request that repeats one is refused before anything reads it.
_ONCE = {"authorization": "Authorization", "cookie": "Cookie"}
# The methods' names by their bytes as parsed: found, not decoded, per request (another one is decoded).
_METHOD_NAMES = {name.encode("latin-1"): name for name in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")}

_REASONS = {
    200: "OK", 204: "No Content", 303: "See Other", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict", 410: "Gone", 413: "Content Too Large",
    414: "URI Too Long",
    415: "Unsupported Media Type", 422: "Unprocessable Content", 429: "Too Many Requests",
    431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable",
}


class Request:
    """One parsed request. ``headers`` keys are lowercase; a repeated header keeps its last value
    and is noted in ``repeated`` (the application rejects repeats of the headers it reads)."""

    __slots__ = ("method", "raw_path", "query", "headers", "repeated", "body", "started", "refusal", "peer",
                 "credential")

    def __init__(self, method: str, raw_path: str, query: str, headers: dict[str, str], repeated: set[str],
                 body: bytes, started: float, refusal: Response | None = None, peer: str = "",
                 credential: bytes | None = None) -> None:
        self.method = method
        self.raw_path = raw_path
        self.query = query
        self.headers = headers
        self.repeated = repeated
        self.body = body
        self.started = started
        self.refusal = refusal  # answered without the application (a bodyless request refused by scope)
        self.peer = peer  # the source address: whose shares the request counts in
        self.credential = credential  # its bearer token's digest (auth on), or None


class Response:
    __slots__ = ("status", "body", "content_type", "headers", "route")

    def __init__(self, status: int, body: bytes = b"", content_type: str | None = None,
                 headers: list[tuple[str, str]] | None = None) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers
        self.route = "unmatched"

    def encode(self, keep_alive: bool) -> bytes:
        if keep_alive and self.headers is None:  # the usual answer: its head's bytes made once (`_head`)
            status = self.status
            if status == 204:
                return _NO_CONTENT
            start = _HEADS.get((status, self.content_type)) or _head(status, self.content_type)
            return b"%s%d\r\n\r\n%s" % (start, len(self.body), self.body)
        head = [f"HTTP/1.1 {self.status} {_REASONS.get(self.status, 'Status')}"]
        if self.content_type is not None:
            head.append(f"Content-Type: {self.content_type}")
        if self.status != 204:
            head.append(f"Content-Length: {len(self.body)}")
        if self.headers:
            head.extend(f"{k}: {v}" for k, v in self.headers)
        if not keep_alive:
            head.append("Connection: close")
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (b"" if self.status == 204 else self.body)


_NO_CONTENT = b"HTTP/1.1 204 No Content\r\n\r\n"  # what `Response.encode` writes for a 204 kept alive
#: (status, content type) -> the bytes of a kept-alive answer's head up to its Content-Length's value.
_HEADS: dict[tuple[int, str | None], bytes] = {}


def _head(status: int, content_type: str | None) -> bytes:
    """The start of the head `Response.encode` writes for ``status`` and ``content_type``, kept for the next."""
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    head = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")
    if len(_HEADS) < 256:  # statuses and types are the server's own few
        _HEADS[(status, content_type)] = head
    return head


class StreamSink(Protocol):
    """Where a `Stream` writes: its connection, while it is open."""

    def sink_write(self, data: bytes) -> bool:
        """Queue ``data`` for the peer; False once the connection is closing (nothing queued)."""
        ...

    def sink_buffered(self) -> int:
        """The bytes queued and not yet taken by the peer (a slow reader's backlog)."""
        ...


class Stream(Response):
    """A 200 answer whose body is written over time (server-sent events), then the connection closes.

    ``run(sink)`` writes the body and returns when it ends; it is cancelled when
    the peer disconnects. It is the only answer that does not say its length, so
    it is the last one on its connection (``Connection: close``).
    """

    __slots__ = ("run",)

    def __init__(self, run: Callable[[StreamSink], Awaitable[None]], content_type: str,
                 headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(200, b"", content_type, headers)
        self.run = run

    def encode(self, keep_alive: bool) -> bytes:
        head = ["HTTP/1.1 200 OK", f"Content-Type: {self.content_type}", "Connection: close"]
        head.extend(f"{k}: {v}" for k, v in self.headers or ())
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")


class _Gone:
    """What a `Deferred`'s finish is given for its future when the peer went away first: a cancelled one."""

    __slots__ = ()

    @staticmethod
    def cancelled() -> bool:
        return True

    @staticmethod
    def result() -> Any:
        raise asyncio.CancelledError


GONE: Any = _Gone()


class Deferred:
    """A handler's answer that waits on one future (its change's durability), answered without a task.

    ``finish(future, *args)`` runs once ``future`` is done, or cancelled (the peer went
    away: it undoes what it must and returns None), and builds the `Response`; the
    connection writes it. A ``future`` of None is done already. Awaitable too (a
    coroutine that awaits it gets the `Response`, or `asyncio.CancelledError`).
    """

    __slots__ = ("future", "finish", "args", "route", "listen")

    def __init__(self, future: asyncio.Future[Any] | None, finish: Callable[..., Response | None],
                 *args: Any, listen: Callable[[asyncio.Future[Any], Callable[[Any], None]], None] | None = None
                 ) -> None:
        self.future = future
        self.finish = finish
        self.args = args
        self.route: str | None = None  # the dispatcher's route template, given to the response
        # How to be called back once ``future`` is done (`GroupCommitter.listen`: in the step that resolves
        # it); None: ``future.add_done_callback``. The future is never cancelled here: it may be shared.
        self.listen = listen

    def answer(self, gone: bool = False) -> Response | None:
        """The response, once the future is done; None when it was cancelled, or the peer is ``gone``."""
        response = self.finish(GONE if gone else self.future, *self.args)
        if response is not None and self.route is not None:
            response.route = self.route
        return response

    def __await__(self) -> Any:
        gone = False
        if self.future is not None:
            try:
                yield from asyncio.shield(self.future)  # the future may be shared: never cancelled here
            except asyncio.CancelledError:
                gone = True  # the awaiting task was cancelled
            except Exception:  # noqa: BLE001, S110 - the future's error: `finish` reads it from the future
                pass
        response = self.answer(gone)
        if response is None:
            raise asyncio.CancelledError
        return response


def json_response(status: int, document: Any, headers: list[tuple[str, str]] | None = None) -> Response:
    return Response(status, dumps(document), JSON, headers)


def problem(code: str, detail: str | None = None, *, status: int | None = None,
            extra: dict[str, Any] | None = None, headers: list[tuple[str, str]] | None = None) -> Response:
    """An RFC 9457 problem document of type ``code``: title and usual status from `stockade.wire.problems`.

    ``detail`` never carries a traceback or a secret.
    """
    status, document = problem_document(code, status=status, detail=detail, extra=extra)
    return Response(status, dumps(document), PROBLEM_JSON, headers)


def problem_response(status: int, code: str, title: str, detail: str | None = None,
                     extra: dict[str, Any] | None = None, headers: list[tuple[str, str]] | None = None) -> Response:
    """A problem document with an explicit title (the test controls build theirs so); prefer `problem`."""
    document: dict[str, Any] = {"type": PROBLEM_TYPE_PREFIX + code, "title": title, "status": status}
    if detail:
        document["detail"] = detail
    if extra:
        document.update(extra)
    return Response(status, dumps(document), PROBLEM_JSON, headers)


def refusal_response(refusal: Refusal) -> Response:
    """The problem document for a refusal by the connection cap or a fair share, with Retry-After."""
    extra = {"limit": refusal.limit, "value": refusal.value} if refusal.limit is not None else None
    return problem(refusal.code, refusal.detail, extra=extra, headers=[("Retry-After", str(RETRY_AFTER_S))])


async def within_share(limits: ConnectionLimits | None, request: Request, wait_ms: int,
                       acquire: Callable[[], Awaitable[Any]]) -> Any:
    """``await acquire()``, counted in the waiting acquires of the request's address and token when
    ``wait_ms`` > 0; the 429 `Response` instead when one of those shares is full."""
    if limits is None or not wait_ms:
        return await acquire()
    refusal = limits.wait_begin(request.peer, request.credential)
    if refusal is not None:
        return refusal_response(refusal)
    try:
        return await acquire()
    finally:
        limits.wait_end(request.peer, request.credential)


class HttpError(Exception):
    """Raised by the transport layer itself (size, framing); carries the problem to send."""

    def __init__(self, status: int, code: str, detail: str, headers: list[tuple[str, str]] | None = None,
                 response: Response | None = None) -> None:
        super().__init__(detail)
        self.response = response or problem(code, detail, status=status, headers=headers)


Dispatch = Callable[[Request], "Response | Awaitable[Response]"]
_DEFAULT_PARSER = make_parser(None)


class HttpProtocol(asyncio.Protocol):
    """One connection. ``body_limit(path)`` gives the body bound for a request path; ``parser`` is
    the request parser's class (`stockade.server._h1.make_parser`)."""

    __slots__ = (
        "_dispatch", "_observe", "_body_limit", "_limits", "_loop", "_transport", "_parser", "_url", "_headers",
        "_repeated", "_header_bytes", "_header_count", "_body", "_body_size", "_body_max", "_pending", "_current",
        "_closing",
        "_write_paused", "_discarding", "_discarded", "_request_started", "_header_name", "_held", "_raw",
        "_raw_size", "_feeding", "_reading_paused", "_body_started", "_refusal", "_small", "peer", "credential",
        "_path", "_query", "_deferred", "_fed_s",
    )

    def __init__(self, dispatch: Dispatch, observe: Callable[[Request, Response, float], None],
                 body_limit: Callable[[str], int], limits: ConnectionLimits, parser: Any = None) -> None:
        self._dispatch = dispatch
        self._observe = observe
        self._body_limit = body_limit
        self._limits = limits
        self._loop = asyncio.get_event_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = (parser or _DEFAULT_PARSER)(self)
        self._pending: deque[tuple[Request, bool]] = deque()
        self._current: asyncio.Future[Any] | None = None  # a handler's task, or a `Deferred`'s future
        self._deferred: tuple[Request, Deferred, bool] | None = None
        self._closing = False
        self._write_paused = False  # the peer is not reading its answers: stop taking requests
        self._discarding = False
        self._discarded = 0
        self._request_started = 0.0
        self._fed_s = 0.0  # when the bytes being parsed came (or were taken from `_raw`): the callbacks' time
        self._held = 0  # request bytes of this connection counted in the server's budget
        self._raw: list[bytes] = []  # received while a handler runs; parsed once it ends
        self._raw_size = 0
        self._feeding = False
        self._reading_paused = False
        self.peer = ""  # the source address (the guard's peer shares)
        self.credential: bytes | None = None  # the digest of its latest request's bearer token (auth on)
        self._reset()

    def _reset(self) -> None:
        self._url = b""
        self._path = "/"  # the request target's, once the headers are complete
        self._query = ""
        self._headers: dict[str, str] = {}
        self._repeated: set[str] = set()
        self._header_bytes = 0
        self._header_count = 0  # ``len(self._headers)``, kept (``len`` is a call, on every header)
        self._header_name = b""
        self._body: list[bytes] = []
        self._body_size = 0
        self._body_max = 0
        self._body_started = 0.0  # when the headers were complete (0: not yet)
        self._refusal: Response | None = None
        self._small = False  # the body's Content-Length is at most SMALL_BODY_BYTES

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        # Over a Unix socket (the host process of a file) the peer is the client's process.
        self.peer = peer[0] if isinstance(peer, tuple) else peer_of(transport.get_extra_info("socket"))
        refusal = self._limits.admit(self)
        if refusal is not None:
            self._fail(refusal_response(refusal))

    def pause_writing(self) -> None:
        # The send buffer passed its high-water mark: stop reading and stop answering
        # queued requests until the peer drains it, so memory stays bounded.
        self._write_paused = True
        self._limits.stall(self)
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if not self._closing:
            self._limits.unstall(self)
        if self._transport is not None and not self._closing and not self._reading_paused:
            self._transport.resume_reading()
        if self._current is None and self._pending and not self._closing:
            next_request, next_keep_alive = self._pending.popleft()
            self._start(next_request, next_keep_alive)
        self._drain_raw()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._limits.forget(self)
        self._pending.clear()
        self._release_all()
        if self._current is not None and not self._current.done() and self._deferred is None:
            self._current.cancel()  # the peer is gone: a waiting acquire leaves the queue
        # (A `Deferred`'s future is not cancelled: its answer, when it comes, sees the connection closing.)

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            self._discarded += len(data)
            if self._discarded > DISCARD_BYTES_MAX:
                self._close()
            return
        if self._closing:
            return
        if self._current is not None or self._pending or self._write_paused:  # `_busy`, written out (per read)
            # A request is being answered: keep the next one unparsed (its body is not read
            # into memory), and stop reading once RAW_BYTES_MAX are kept.
            self._raw.append(data)
            self._raw_size += len(data)
            self._hold(len(data))
            if self._raw_size >= RAW_BYTES_MAX and self._transport is not None:
                self._reading_paused = True
                self._transport.pause_reading()
            return
        self._feed(data)

    @property
    def answering(self) -> asyncio.Future[Any] | None:
        """What the answer of the request being handled waits on: its handler's task, or its `Deferred`'s
        future (None: none is)."""
        return self._current

    def _busy(self) -> bool:
        return self._current is not None or bool(self._pending) or self._write_paused

    def _drain_raw(self) -> None:
        """Parse what came while a handler ran, now that none runs."""
        while self._raw and not self._busy() and not self._closing and not self._feeding:
            data = b"".join(self._raw)
            self._raw.clear()
            self._raw_size = 0
            self._release(len(data))
            self._feed(data)
        if not self._raw and self._reading_paused and not self._closing and self._transport is not None:
            self._reading_paused = False
            if not self._write_paused:
                self._transport.resume_reading()

    def _hold(self, size: int) -> None:
        self._held += size
        self._limits.buffered += size

    def _release(self, size: int) -> None:
        size = min(size, self._held)
        self._held -= size
        self._limits.release(size)

    def _release_all(self) -> None:
        self._body = []
        self._raw = []
        self._raw_size = 0
        self._release(self._held)

    def holds_bytes(self) -> int:
        """The request bytes this connection holds in memory (the guard's eviction reads it)."""
        return self._held

    def abort(self) -> None:
        """Close at once, giving back every byte held (evicted to make room for others)."""
        self._closing = True
        self._release_all()
        if self._transport is not None:
            # Drop unsent answers too: once close() has begun, abort() alone may still flush them.
            sock = self._transport.get_extra_info("socket")
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
                with socket.socket(fileno=os.dup(sock.fileno())) as dup:  # uvloop's own socket has no shutdown()
                    dup.shutdown(socket.SHUT_RDWR)  # pending writes now fail: the transport closes
            except (OSError, AttributeError, TypeError, ValueError):
                pass
            self._transport.abort()

    def close_idle(self) -> None:
        """Close an idle connection: gracefully, unless answers are still unsent (then reset)."""
        if self._transport is not None and self._transport.get_write_buffer_size():
            self.abort()
        else:
            self._close()

    def _feed(self, data: bytes) -> None:
        self._feeding = True
        self._fed_s = time.monotonic()  # read once for the request begun and the headers completed by these bytes
        try:
            self._parser.feed_data(data)
        except HttpError as exc:
            self._fail(exc.response)
        except ParseError as exc:
            self._fail(problem(exc.code, str(exc), status=exc.status))
        except _HTTPTOOLS_UPGRADE:  # checked at the headers already (on_headers_complete): a backstop
            self._fail(problem("invalid-argument", "protocol upgrade is not supported"))
        except _HTTPTOOLS_ERRORS as exc:
            # httptools wraps an exception raised in a callback: answer with the one we raised.
            cause = exc.__context__ or exc.__cause__
            if isinstance(cause, HttpError):
                self._fail(cause.response)
            else:
                self._fail(problem("invalid-argument", MALFORMED))
        finally:
            self._feeding = False

    def eof_received(self) -> bool | None:
        return False  # close: a half-closed peer cannot read a long-poll's answer anyway

    # -- the parser's callbacks (httptools' interface) ---------------------------------------

    def on_message_begin(self) -> None:
        self._reset()
        self._request_started = self._fed_s
        self._limits.to_reading(self, self._request_started)

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > URL_BYTES_MAX:
            raise HttpError(414, "limit-exceeded", URL_DETAIL)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > HEADER_BYTES_MAX or self._header_count >= HEADERS_MAX:
            raise HttpError(431, "limit-exceeded", HEADERS_DETAIL)
        if value[-1:] in _OWS:
            value = value.rstrip(b" \t")  # httptools keeps the spaces after a value; _h1 drops them
        key = _HEADER_NAMES[name] if name in _HEADER_NAMES else name.decode("latin-1").lower()
        if key in self._headers:
            if key in _ONCE:  # which one counts is ambiguous (a proxy may have read the other): refused
                raise HttpError(400, "invalid-argument", f"{_ONCE[key]} must be given once")
            self._repeated.add(key)
        else:
            self._header_count += 1
        self._headers[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self._parser.should_upgrade():  # both parsers: refused before the request runs
            raise HttpError(400, "invalid-argument", "protocol upgrade is not supported")
        if self._parser.get_http_version() not in _VERSIONS:  # httptools takes 0.9 and 2.0 too
            raise HttpError(400, "invalid-argument", MALFORMED)
        try:
            path, self._query = split_target(self._url)
        except ParseError as exc:
            raise HttpError(400, "invalid-argument", str(exc)) from None
        self._path = path
        self._body_max = self._body_limit(path)
        length = self._headers.get("content-length")
        size = int(length) if length is not None and length.isdigit() else None  # None: no length to bound
        if size is not None and size > self._body_max:
            # Answer before reading the body (the bound is enforced, not merely checked afterwards).
            raise HttpError(413, "limit-exceeded",
                            f"request body larger than {self._body_max} bytes")
        has_body = (length is not None and length != "0") or "transfer-encoding" in self._headers
        self._small = size is not None and size <= SMALL_BODY_BYTES
        authorize = self._limits.authorize
        if authorize is not None:
            refusal = authorize(self._parser.get_method().decode("latin-1"), path, self._headers, has_body)
            if refusal is not None:
                if has_body:
                    raise HttpError(refusal.status, "unauthorized", "", response=refusal)  # the body is not read
                self._refusal = refusal
            credential = self._headers.get("authorization")
            if credential is not None:
                over = self._limits.tag(self, credential)
                if over is not None:
                    raise HttpError(429, over.code, over.detail, response=refusal_response(over))
        if has_body and not self._limits.room(self, 0):
            raise HttpError(503, "backend-unavailable", "request bodies in memory are at their bound; retry",
                            headers=[("Retry-After", str(RETRY_AFTER_S))])
        self._body_started = self._fed_s

    def on_body(self, body: bytes) -> None:
        size = len(body)
        self._body_size += size
        if self._body_size > self._body_max:
            raise HttpError(413, "limit-exceeded", f"request body larger than {self._body_max} bytes")
        if not self._limits.reserve(self, size, self._small):
            raise HttpError(503, "backend-unavailable", "request bodies in memory are at their bound; retry",
                            headers=[("Retry-After", str(RETRY_AFTER_S))])
        self._held += size
        self._body.append(body)

    def on_message_complete(self) -> None:
        body = self._body
        method = self._parser.get_method()
        request = Request(  # positional: method, raw path (parsed once the headers were complete), query, ...
            _METHOD_NAMES[method] if method in _METHOD_NAMES else method.decode("latin-1"), self._path, self._query,
            self._headers, self._repeated,
            (body[0] if len(body) == 1 else b"".join(body)) if body else b"", self._request_started, self._refusal,
            self.peer, self.credential,
        )
        self._body = []
        keep_alive = self._parser.should_keep_alive()
        self._request_started = 0.0
        self._limits.to_serving(self)
        if self._current is None and not self._pending and not self._write_paused:
            self._start(request, keep_alive)
            return
        if len(self._pending) >= PIPELINED_MAX:
            raise HttpError(429, "limit-exceeded", f"more than {PIPELINED_MAX} pipelined requests")
        self._pending.append((request, keep_alive))

    # -- running handlers ------------------------------------------------------------------

    def _start(self, request: Request, keep_alive: bool) -> None:
        if request.refusal is not None:
            self._send(request, request.refusal, keep_alive)
            return
        result = self._dispatch(request)
        if type(result) is not Deferred and isinstance(result, Response):  # (a grant's and a release's: Deferred)
            self._send(request, result, keep_alive)
            return
        if type(result) is Deferred:
            future = result.future
            if future is None:
                self._send_answer(request, result, keep_alive)
                return
            self._current = future
            self._deferred = (request, result, keep_alive)
            if result.listen is not None:
                result.listen(future, self._answer_deferred)
            else:
                future.add_done_callback(self._answer_deferred)
            return
        self._current = self._loop.create_task(self._await(request, result, keep_alive))

    def _answer_deferred(self, future: asyncio.Future[Any]) -> None:
        """The future of a `Deferred` is done: answer it (or undo it, when the connection is closing)."""
        request, deferred, keep_alive = self._deferred  # type: ignore[misc]
        self._deferred = None
        self._current = None
        self._send_answer(request, deferred, keep_alive)

    def _send_answer(self, request: Request, deferred: Deferred, keep_alive: bool) -> None:
        # Closing (the peer left, or the server stops): what the answer would have given is undone,
        # as a handler's task is cancelled then.
        response = deferred.answer(self._closing)
        if response is not None:
            self._send(request, response, keep_alive)

    async def _await(self, request: Request, pending: Awaitable[Response], keep_alive: bool) -> None:
        response = await pending
        self._current = None
        self._send(request, response, keep_alive)

    def _send(self, request: Request, response: Response, keep_alive: bool) -> None:
        if self._closing or self._transport is None:
            return
        if type(response) is not Response and isinstance(response, Stream):
            self._transport.write(response.encode(False))
            self._release(len(request.body))
            self._observe(request, response, time.monotonic())
            self._current = self._loop.create_task(self._stream(response))
            return
        self._transport.write(response.encode(keep_alive))
        if request.body:  # a bodiless request held no bytes
            self._release(len(request.body))
        now = time.monotonic()  # read once: the request's time observed and the connection's idle start
        self._observe(request, response, now)
        if not keep_alive:
            self._close()
            return
        if self._pending and not self._write_paused:
            next_request, next_keep_alive = self._pending.popleft()
            self._start(next_request, next_keep_alive)
            return
        if self._current is None and not self._pending and not self._request_started:
            self._limits.to_idle(self, now)
        if self._raw or self._reading_paused:  # else `_drain_raw` has nothing to do
            self._drain_raw()

    async def _stream(self, response: Stream) -> None:
        try:
            await response.run(self)
        finally:
            self._close()

    def sink_write(self, data: bytes) -> bool:
        if self._closing or self._transport is None:
            return False
        self._transport.write(data)
        return True

    def sink_buffered(self) -> int:
        return 0 if self._transport is None else self._transport.get_write_buffer_size()

    def _fail(self, response: Response) -> None:
        """Answer a request (or a connection) the transport refused, then drain briefly and close.

        The connection leaves the server's count and its shares at once; if too many
        refused ones linger already, it is reset instead.
        """
        if self._transport is None or self._closing:
            return
        self._limits.forget(self)  # it closes shortly: counted in no share, never evicted
        if self._current is not None or self._pending:
            self._close()  # an earlier request is still being answered; do not interleave
            return
        if not self._limits.linger(self):
            self.abort()
            return
        self._transport.write(response.encode(False))
        self._closing = True
        self._discarding = True
        self._release_all()
        self._loop.call_later(DISCARD_SECONDS, self._close)

    def _close(self) -> None:
        self._closing = True
        if self._transport is not None:
            if self._transport.get_write_buffer_size():
                self._limits.stall(self)  # still sending: cut off if the peer never reads it
            self._transport.close()

    def check_timeouts(self, now: float, settings: TransportSettings) -> None:
        """Close a request whose headers or body are too slow (the guard calls it for reading ones)."""
        if self._current is not None or self._closing or not self._request_started:
            return  # a handler (maybe a long poll, bounded by its own deadline) is running
        if not self._body_started:
            if now - self._request_started > settings.header_timeout_s:
                self._timed_out("header_timeout_s", f"headers not complete within {settings.header_timeout_s:g} s")
            return
        elapsed = now - self._body_started
        if elapsed > settings.body_timeout_s:
            self._timed_out("body_timeout_s", f"body not complete within {settings.body_timeout_s:g} s")
        elif elapsed > BODY_GRACE_S and self._body_size < settings.body_rate_min * (elapsed - BODY_GRACE_S):
            self._timed_out("body_rate_min", f"body slower than {settings.body_rate_min} bytes/s")

    def _timed_out(self, limit: str, detail: str) -> None:
        self._fail(problem("limit-exceeded", detail, status=408, extra={"limit": limit}))
