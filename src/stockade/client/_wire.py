"""The HTTP/1.1 wire of the remote client, without I/O (docs/http-api.md).

Shared by the async and the generated sync client (as h11 is by its users):
request bytes, response-head parsing and body framing, and the translation of
problem documents back into stockade's own exceptions. The connection that
moves the bytes is in ``_async/_http.py``.

Why not httpx or http.client: a lock cycle is two requests and the goal is a
p50 under 1 ms for both, so the client may spend ~100 µs per request. httpx
spends several times that; this module does the same job for one known
server in a few µs (measured figures in benchmarks/README.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from stockade.core import leases as core_leases
from stockade.core.errors import (
    BackendUnavailable,
    InvalidArgument,
    InvariantViolation,
    LimitExceeded,
    LockTimeout,
    NotHolder,
    StaleToken,
    StockadeError,
    TokenMismatch,
    Unauthorized,
)
from stockade.core.tokens import FencingToken
from stockade.resources.store import Item, WriteResult

__all__ = [
    "HTTPResponse",
    "ProtocolError",
    "RemoteProblem",
    "RESPONSE_HEAD_BYTES_MAX",
    "RESPONSE_BODY_BYTES_MAX",
    "build_request",
    "parse_head",
    "quote_segment",
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
PROBLEM_TYPE_PREFIX = "https://stockade.invalid/problems/"
USER_AGENT = "stockade-client/1"

_NO_BODY_STATUSES = frozenset({204, 304})


class ProtocolError(Exception):
    """The server's bytes were not the HTTP/1.1 this client speaks (a bug or a wrong port)."""


class RemoteProblem(Exception):
    """The server's problem document: the ``__cause__`` of the typed error raised for it.

    Attributes:
        status: the HTTP status.
        problem: the parsed document (empty if the body was not a problem document).
    """

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        super().__init__(f"HTTP {status}: {problem.get('type', '')} {problem.get('detail', '')}".rstrip())


@dataclass(frozen=True, slots=True)
class HTTPResponse:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class Head:
    """A parsed response head. ``body_length``: -1 chunked, -2 until close, else bytes."""

    status: int
    headers: dict[str, str]
    keep_alive: bool
    body_length: int


def quote_segment(text: str) -> str:
    """Percent-encode one path segment (store keys may hold ``/``, spaces, any UTF-8)."""
    return quote(text, safe="")


def build_request(
    method: str,
    target: str,
    *,
    authority: str,
    auth_token: str | None,
    body: bytes = b"",
    content_type: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """The request head and body as one buffer, so it leaves in one write."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {authority}", f"User-Agent: {USER_AGENT}"]
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    if auth_token is not None:
        lines.append(f"Authorization: Bearer {auth_token}")
    for name, value in headers:
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


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
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    connection = headers.get("connection", "").lower()
    if version == "HTTP/1.1":
        keep_alive = "close" not in connection
    else:
        keep_alive = "keep-alive" in connection
    if status in _NO_BODY_STATUSES or status < 200 or method == "HEAD":
        body_length = 0
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        body_length = -1
    elif "content-length" in headers:
        try:
            body_length = int(headers["content-length"])
        except ValueError as exc:
            raise ProtocolError("bad Content-Length") from exc
        if body_length < 0:
            raise ProtocolError("bad Content-Length")
    else:
        body_length, keep_alive = -2, False
    if body_length > RESPONSE_BODY_BYTES_MAX:
        raise ProtocolError(f"response body of {body_length} bytes is over {RESPONSE_BODY_BYTES_MAX}")
    return Head(status, headers, keep_alive, body_length)


def json_body(response: HTTPResponse) -> Any:
    """The JSON document of a success response.

    Raises:
        BackendUnavailable: the body is not JSON (a proxy's error page, a wrong port).
    """
    try:
        return json.loads(response.body)
    except ValueError as exc:
        raise BackendUnavailable(f"server sent a malformed JSON body (HTTP {response.status})") from exc


def _problem(response: HTTPResponse) -> dict[str, Any]:
    try:
        doc = json.loads(response.body) if response.body else {}
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def error_for(
    response: HTTPResponse,
    *,
    scope: str | None = None,
    wait_ms: int | None = None,
    lease_id: str | None = None,
    token: FencingToken | None = None,
) -> tuple[StockadeError, RemoteProblem]:
    """The typed error for a problem response, and the problem to chain it from.

    Mapped by the ``code`` at the end of the problem ``type`` (one table, in
    docs/http-api.md); a response without one is judged by its status. The
    caller raises ``error from problem``.
    """
    doc = _problem(response)
    status = response.status
    problem = RemoteProblem(status, doc)
    type_uri = doc.get("type")
    code = type_uri.removeprefix(PROBLEM_TYPE_PREFIX) if isinstance(type_uri, str) else ""
    detail = str(doc.get("detail") or doc.get("title") or f"HTTP {status}")
    error: StockadeError
    if code == "stale-token":
        high_water = doc.get("high_water")
        rejected: object = token
        if isinstance(doc.get("token"), str):
            try:
                rejected = FencingToken.decode(doc["token"])
            except InvalidArgument:
                pass
        error = StaleToken(rejected, high_water if isinstance(high_water, int) else -1)
    elif code == "token-mismatch":
        reason = str(doc.get("reason") or "mismatch")
        expected = doc.get("expected")
        if not isinstance(expected, str):
            expected = scope if reason == "wrong-scope" and scope is not None else "this server's cluster"
        error = TokenMismatch(token, reason, expected)
    elif code == "lock-timeout":
        error = LockTimeout(scope or str(doc.get("scope", "")), wait_ms if wait_ms is not None else 0)
    elif code == "not-holder":
        error = NotHolder(core_leases.lease_hint(lease_id or ""), detail)
    elif code == "invalid-argument":
        error = InvalidArgument(str(doc.get("field") or "request"), detail)
    elif code == "limit-exceeded":
        value = doc.get("value")
        error = LimitExceeded(str(doc.get("limit") or f"http_{status}"), value if isinstance(value, int) else 0, detail)
    elif code == "unauthorized" or status in (401, 403):
        # The caller's configuration is at fault, and the server changed nothing.
        error = Unauthorized(f"the server refused the credentials (HTTP {status}); check auth_token")
    elif code == "invariant-violation":
        error = InvariantViolation(f"server: {detail}")
    elif code == "backend-unavailable" or status >= 500:
        error = BackendUnavailable(f"server: {detail} (HTTP {status})")
    elif status == 410:
        error = NotHolder(core_leases.lease_hint(lease_id or ""), detail)
    elif status == 413:
        error = LimitExceeded(f"http_{status}", 0, detail)
    elif status in (400, 404, 405, 415, 422):
        # Not a problem this client knows: a wrong base path or an older server.
        error = InvalidArgument("request", f"server answered HTTP {status}: {detail}")
    else:
        error = BackendUnavailable(f"unexpected HTTP {status}: {detail}")
    return error, problem


def _field(doc: Any, name: str, kind: type) -> Any:
    value = doc.get(name) if isinstance(doc, dict) else None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BackendUnavailable(f"server response lacks a valid {name!r}")
    return value


def _token(doc: Any, name: str = "token") -> FencingToken:
    try:
        return FencingToken.decode(_field(doc, name, str))
    except InvalidArgument as exc:
        raise BackendUnavailable(f"server sent a malformed {name!r}") from exc


def lease_from(doc: Any, *, lease_id: str, holder: str, sent_ns: int) -> core_leases.Lease:
    """A core `Lease` from an acquire or renew answer.

    ``granted_ns``/``expires_ns`` are on *this* host's monotonic clock (the send
    time, and send time + TTL): the server's clock is never seen (C3).
    """
    token = _token(doc)
    ttl_ms = _field(doc, "ttl_ms", int)
    return core_leases.Lease(
        lease_id=lease_id,
        holder=holder,
        token=token,
        ttl_ms=ttl_ms,
        granted_ns=sent_ns,
        expires_ns=sent_ns + ttl_ms * 1_000_000,
    )


def scope_info_from(doc: Any) -> core_leases.ScopeInfo:
    try:
        state = core_leases.ScopeState(_field(doc, "state", str))
    except ValueError as exc:
        raise BackendUnavailable("server sent an unknown scope state") from exc
    holder = doc.get("holder")
    return core_leases.ScopeInfo(
        scope=_field(doc, "scope", str),
        state=state,
        holder=holder if isinstance(holder, str) else None,
        token=_token(doc) if doc.get("token") is not None else None,
        last_token=_field(doc, "last_token", int),
        remaining_ms=_field(doc, "remaining_ms", int),
        waiters=_field(doc, "waiters", int),
    )


def write_result_from(doc: Any) -> WriteResult:
    return WriteResult(
        scope=_field(doc, "scope", str),
        key=_field(doc, "key", str),
        token_value=_field(doc, "token_value", int),
        high_water=_field(doc, "high_water", int),
        commit_seq=_field(doc, "commit_seq", int),
        replayed=bool(doc.get("replayed", False)),
    )


def item_from(response: HTTPResponse, *, scope: str, key: str) -> Item:
    try:
        token_value = int(response.headers["token-value"])
        commit_seq = int(response.headers["commit-seq"])
    except (KeyError, ValueError) as exc:
        raise BackendUnavailable("server response lacks Token-Value or Commit-Seq") from exc
    return Item(scope=scope, key=key, value=response.body, token_value=token_value, commit_seq=commit_seq)
