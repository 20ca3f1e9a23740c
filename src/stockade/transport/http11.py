"""The HTTP/1.1 wire of the remote client, without I/O (docs/http-api.md).

Shared by the async and the generated sync client (as h11 is by its users):
request bytes, response-head parsing and body framing. What the bytes mean
(routes, problem documents, JSON documents) is `stockade.wire`, shared with
the server; this module adapts it to `HTTPResponse`. The client that
moves the bytes is ``transport/_async/http_client.py`` (its sync twin generated).

Why not httpx or http.client: a lock cycle is two requests and the goal is a
p50 under 1 ms for both, so the client may spend ~100 µs per request. httpx
spends several times that; this module does the same job for one known
server in a few µs (measured figures in benchmarks/README.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stockade.core.errors import InvariantViolation, StockadeError
from stockade.core.tokens import FencingToken
from stockade.core.values import Item
from stockade.wire import codecs, problems
from stockade.wire.codecs import lease_from, scope_info_from, write_result_from
from stockade.wire.problems import RemoteProblem

if TYPE_CHECKING:
    import ssl  # an https:// url's context comes from `stockade.client._shared`, which imports ssl for it

__all__ = [
    "HTTPEndpoint",
    "HTTPResponse",
    "ProtocolError",
    "RemoteProblem",
    "RESPONSE_HEAD_BYTES_MAX",
    "RESPONSE_BODY_BYTES_MAX",
    "CHUNK_SIZE_LINE",
    "FIELD_LINE",
    "build_request",
    "fixed_fields",
    "chunk_size",
    "parse_head",
    "error_for",
    "json_body",
    "lease_from",
    "scope_info_from",
    "write_result_from",
    "item_from",
]

RESPONSE_HEAD_BYTES_MAX = 64 * 1024
# A value is at most 1 MiB; a list page of 1000 keys of 1 KiB is about as big.
RESPONSE_BODY_BYTES_MAX = 4 * 1024 * 1024
USER_AGENT = "stockade-client/1"

_NO_BODY_STATUSES = frozenset({204, 304})
_BODY_METHODS = frozenset({"POST", "PUT"})

# The framing both ends of this HTTP/1.1 read (RFC 9112), shared with the server's pure-Python
# request parser (`stockade.server._h1`):
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = rb'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
#: a chunk-size line: 1 to 16 hex digits, then extensions ``;name`` or ``;name=value`` (a token or a quoted
#: string; either may be empty, as llhttp takes them, but the line does not end with ``;``), which are
#: ignored; no spaces, no ``0x``;
CHUNK_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:;(?:" + _TOKEN + rb")?(?:=(?:" + _TOKEN + rb"|" + _QUOTED
                             + rb")?)?)*(?<!;)")
#: a field line ``name: value``: a token name, no space before the colon, a value of visible bytes
#: (obs-text included) with single spaces or tabs inside, the spaces and tabs around it not in the group.
FIELD_LINE = re.compile(rb"(" + _TOKEN + rb"):[ \t]*((?:[\x21-\x7e\x80-\xff]+(?:[ \t]+[\x21-\x7e\x80-\xff]+)*)?)"
                        rb"[ \t]*")


class ProtocolError(Exception):
    """The server's bytes were not the HTTP/1.1 this client speaks (a bug or a wrong port)."""


@dataclass(frozen=True, slots=True)
class HTTPEndpoint:
    """Where and how to reach an HTTP/1.1 server: a `stockade serve`, or an etcd member's JSON gateway.

    A ``stockade serve``'s is made from its url by `stockade.client._shared.http_endpoint`, which
    validates every field.

    Attributes:
        host, port: the server (``[v6]`` brackets stripped from ``host``).
        base_path: a path prefix before ``/v1`` (for a reverse proxy), without a trailing slash.
        tls: the TLS context for ``https://`` (None for ``http://``).
        authority: the ``Host`` header value.
        auth_token: the bearer token, or None.
        timeout_ms: deadline of one request (an acquire adds its ``wait_ms``).
        connect_timeout_ms: deadline of a TCP (and TLS) connect.
        unix_path: a Unix-domain socket to connect to instead of ``host:port`` (the host's coordinator
            process of a ``sqlite:///…`` url); None for TCP.
    """

    host: str
    port: int
    base_path: str
    tls: ssl.SSLContext | None
    authority: str
    auth_token: str | None
    timeout_ms: int
    connect_timeout_ms: int
    unix_path: str | None = None

    def __repr__(self) -> str:  # never show the bearer token
        scheme = "https" if self.tls is not None else "http"
        return f"<HTTPEndpoint {scheme}://{self.authority}{self.base_path}>"


@dataclass(slots=True)  # not frozen: made twice a lock cycle, and a frozen one costs twice as much to make
class HTTPResponse:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)  # frozen: the HTTP client reuses a head it has seen (its ``_HEADS``)
class Head:
    """A parsed response head. ``body_length``: -1 chunked, -2 until close, else bytes."""

    status: int
    headers: dict[str, str]
    keep_alive: bool
    body_length: int


def fixed_fields(authority: str, auth_token: str | None) -> tuple[str, str]:
    """The fields every request to one server carries, made once per client: ``Host`` and ``User-Agent``
    (first), and ``Authorization`` (after the body's fields; empty without a token)."""
    return (f"Host: {authority}\r\nUser-Agent: {USER_AGENT}\r\n",
            "" if auth_token is None else f"Authorization: Bearer {auth_token}\r\n")


def build_request(
    method: str,
    target: str,
    *,
    authority: str,
    auth_token: str | None,
    body: bytes = b"",
    content_type: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
    fixed: tuple[str, str] | None = None,
) -> bytes:
    """The request head and body as one buffer, so it leaves in one write.

    ``fixed``: `fixed_fields` of ``authority`` and ``auth_token``, if the caller made them already.
    """
    host, auth = fixed or fixed_fields(authority, auth_token)
    length = f"Content-Length: {len(body)}\r\n" if body or method in _BODY_METHODS else ""
    kind = "" if content_type is None else f"Content-Type: {content_type}\r\n"
    extra = "".join([f"{name}: {value}\r\n" for name, value in headers]) if headers else ""
    return f"{method} {target} HTTP/1.1\r\n{host}{length}{kind}{auth}{extra}\r\n".encode("latin-1") + body


def parse_head(raw: bytes, *, method: str) -> Head:
    """Parse a response head (without the final blank line).

    Raises:
        ProtocolError: not an HTTP/1.x response head.
    """
    try:
        text = raw.decode("latin-1")
        status_line, *header_lines = text.split("\r\n")
        version, status_text, *_ = status_line.split(" ", 2)
        status = int(status_text)
    except ValueError as exc:
        raise ProtocolError(f"bad status line {raw[:80]!r}") from exc
    if version not in ("HTTP/1.1", "HTTP/1.0") or not 100 <= status <= 599:
        raise ProtocolError(f"bad status line {raw[:80]!r}")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ProtocolError(f"bad header line {line[:80]!r}")
        name = name.lower()
        if name in headers:
            headers[name] = f"{headers[name]}, {value.strip()}"
        else:
            headers[name] = value.strip()
    connection = headers.get("connection")
    if version == "HTTP/1.1":
        keep_alive = connection is None or "close" not in connection.lower()
    else:
        keep_alive = connection is not None and "keep-alive" in connection.lower()
    transfer_encoding = headers.get("transfer-encoding")
    length = headers.get("content-length")
    if status in _NO_BODY_STATUSES or status < 200 or method == "HEAD":
        body_length = 0
    elif transfer_encoding is not None and "chunked" in transfer_encoding.lower():
        body_length = -1
    elif length is not None:
        try:
            body_length = int(length)
        except ValueError as exc:
            raise ProtocolError("bad Content-Length") from exc
        if body_length < 0:
            raise ProtocolError("bad Content-Length")
    else:
        body_length, keep_alive = -2, False
    if body_length > RESPONSE_BODY_BYTES_MAX:
        raise ProtocolError(f"response body of {body_length} bytes is over {RESPONSE_BODY_BYTES_MAX}")
    return Head(status, headers, keep_alive, body_length)


def chunk_size(line: bytes) -> int:
    """The size a chunk-size line (without its CRLF) gives.

    Raises:
        ProtocolError: not a chunk-size line.
    """
    found = CHUNK_SIZE_LINE.fullmatch(line)
    if found is None:
        raise ProtocolError(f"bad chunk size line {line[:40]!r}")
    return int(found.group(1), 16)


def json_body(response: HTTPResponse) -> Any:
    """The JSON document of a success response.

    Raises:
        BackendUnavailable: the body is not JSON (a proxy's error page, a wrong port).
    """
    return codecs.decode_json(response.body, response.status)


def error_for(
    response: HTTPResponse,
    *,
    scope: str | None = None,
    wait_ms: int | None = None,
    lease_id: str | None = None,
    token: FencingToken | None = None,
) -> tuple[StockadeError | InvariantViolation, RemoteProblem]:
    """The typed error for a problem response, and the problem to chain it from.

    The mapping is `stockade.wire.problems.error_for` (one catalogue with the
    server's); the caller raises ``error from problem``.
    """
    return problems.error_for(response.status, response.body, scope=scope, wait_ms=wait_ms, lease_id=lease_id,
                              token=token)


def item_from(response: HTTPResponse, *, scope: str, key: str) -> Item:
    return codecs.item_from(response.headers, response.body, scope=scope, key=key)
