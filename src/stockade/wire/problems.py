"""Problem documents (RFC 9457): the one catalogue of problem types, both directions.

The server turns an exception into a document with `problem_of`; the client
turns a document back into the same exception with `error_for`. Both read
`PROBLEM_TYPES`, so a code, its title and its status are written once
(docs/http-api.md, "Problem types").

    code                     status  raised as (client side)
    invalid-argument         400     InvalidArgument   (422: a bad field of a well-formed JSON body)
    limit-exceeded           429     LimitExceeded     (413: a size; 414, 431: the transport's bounds)
    stale-token              409     StaleToken(token, high_water)
    token-mismatch           409     TokenMismatch(token, reason, expected)
    fence-rejected           409     -
    lock-timeout             409     LockTimeout(scope, wait_ms, ticket=...)  (``ticket``: a wait until granted goes on)
    not-holder               410     NotHolder
    lease-error, lease-lost  410     -
    unauthorized             401     Unauthorized
    backend-unavailable      503     BackendUnavailable
    invariant-violation      500     InvariantViolation (a bug, outside the StockadeError tree; no detail)
    stockade-error           500     -
    not-found                404     InvalidArgument   (protocol-level: no exception class on the server)
    method-not-allowed       405     InvalidArgument
    unsupported-media-type   415     InvalidArgument
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
from stockade.core.leases import lease_hint
from stockade.core.tokens import FencingToken

__all__ = [
    "PROBLEM_TYPE_PREFIX",
    "ProblemType",
    "PROBLEM_TYPES",
    "BODY_FIELD_STATUS",
    "SIZE_STATUS",
    "RemoteProblem",
    "problem_document",
    "problem_of",
    "code_of",
    "error_for",
]

PROBLEM_TYPE_PREFIX = "https://stockade.invalid/problems/"


@dataclass(frozen=True, slots=True)
class ProblemType:
    """One problem type: the ``code`` that ends its ``type`` URI, a fixed ``title``, the usual ``status``."""

    code: str
    title: str
    status: int

    @property
    def uri(self) -> str:
        return PROBLEM_TYPE_PREFIX + self.code


PROBLEM_TYPES: Mapping[str, ProblemType] = {
    problem.code: problem
    for problem in (
        ProblemType("invalid-argument", "Invalid argument", 400),
        ProblemType("limit-exceeded", "Limit exceeded", 429),
        ProblemType("stale-token", "Stale fencing token", 409),
        ProblemType("token-mismatch", "Fencing token for another scope or cluster", 409),
        ProblemType("fence-rejected", "Fencing token rejected", 409),
        ProblemType("lock-timeout", "Lock still held at the deadline", 409),
        ProblemType("not-holder", "Lease not held", 410),
        ProblemType("lease-error", "Lease not held", 410),
        ProblemType("lease-lost", "Lease not held", 410),
        ProblemType("backend-unavailable", "Backend unavailable", 503),
        ProblemType("unauthorized", "Unauthorized", 401),
        ProblemType("invariant-violation", "Internal error", 500),
        ProblemType("stockade-error", "Internal error", 500),
        # Protocol-level problems that no StockadeError stands for.
        ProblemType("not-found", "Not found", 404),
        ProblemType("method-not-allowed", "Method not allowed", 405),
        ProblemType("unsupported-media-type", "Unsupported media type", 415),
    )
}
# Where one code has a second status: a bad field of a well-formed JSON body, and size limits.
BODY_FIELD_STATUS = 422
SIZE_STATUS = 413


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


def problem_document(code: str, *, status: int | None = None, detail: str | None = None,
                     extra: Mapping[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """The status and document of a problem of type ``code`` (status: the catalogue's unless given).

    ``detail`` never carries a traceback or a secret.

    Raises:
        KeyError: ``code`` is not in `PROBLEM_TYPES`.
    """
    problem = PROBLEM_TYPES[code]
    status = problem.status if status is None else status
    document: dict[str, Any] = {"type": PROBLEM_TYPE_PREFIX + code, "title": problem.title, "status": status}
    if detail:
        document["detail"] = detail
    if extra:
        document.update(extra)
    return status, document


def problem_of(error: StockadeError | InvariantViolation, *, body_field: bool = False) -> tuple[int, dict[str, Any]]:
    """The status and document for ``error``, by its ``code``; a 5xx has no detail.

    Args:
        body_field: the error is about a field of a well-formed JSON body: 422 for a bad
            one (not 400), 413 for one over its size bound (not 429).
    """
    code = error.code if error.code in PROBLEM_TYPES else "stockade-error"
    status = PROBLEM_TYPES[code].status
    if body_field and code == "invalid-argument":
        status = BODY_FIELD_STATUS
    elif body_field and code == "limit-exceeded":
        status = SIZE_STATUS
    extra: dict[str, Any] = {}
    if isinstance(error, InvalidArgument):
        extra["field"] = error.field
    elif isinstance(error, LimitExceeded):
        extra["limit"] = error.limit
    elif isinstance(error, StaleToken):
        token = error.token
        extra["token"] = str(token)  # a FencingToken prints without its MAC
        extra["high_water"] = error.high_water
    elif isinstance(error, TokenMismatch):
        extra["reason"] = error.reason
    elif isinstance(error, LockTimeout) and error.ticket is not None:
        extra["ticket"] = error.ticket  # the place in the queue of a wait until granted (docs/http-api.md)
    return problem_document(code, status=status, detail=None if status >= 500 else str(error), extra=extra)


def code_of(document: Any) -> str:
    """The code of a problem document: its ``type`` without `PROBLEM_TYPE_PREFIX` ("" if it has no type)."""
    type_uri = document.get("type") if isinstance(document, dict) else None
    return type_uri.removeprefix(PROBLEM_TYPE_PREFIX) if isinstance(type_uri, str) else ""


def _document(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body) if body else {}
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def error_for(
    status: int,
    body: bytes,
    *,
    scope: str | None = None,
    wait_ms: int | None = None,
    lease_id: str | None = None,
    token: FencingToken | None = None,
) -> tuple[StockadeError | InvariantViolation, RemoteProblem]:
    """The typed error for a problem answer, and the problem to chain it from.

    Mapped by the code of the problem ``type`` (`PROBLEM_TYPES`); an answer
    without one (a proxy, an older server) is judged by its status. The caller
    raises ``error from problem``. The arguments are what the caller asked
    about, for the fields the document does not carry.
    """
    doc = _document(body)
    problem = RemoteProblem(status, doc)
    code = code_of(doc)
    detail = str(doc.get("detail") or doc.get("title") or f"HTTP {status}")
    error: StockadeError | InvariantViolation
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
        ticket = doc.get("ticket")
        error = LockTimeout(scope or str(doc.get("scope", "")), wait_ms if wait_ms is not None else 0,
                            ticket=ticket if isinstance(ticket, str) else None)
    elif code == "not-holder":
        error = NotHolder(lease_hint(lease_id or ""), detail)
    elif code == "invalid-argument":
        error = InvalidArgument(str(doc.get("field") or "request"), detail)
    elif code == "limit-exceeded":
        value = doc.get("value")
        error = LimitExceeded(str(doc.get("limit") or f"http_{status}"), value if isinstance(value, int) else 0, detail)
    elif code == "unauthorized" or status in (401, 403):
        # The caller's configuration is at fault, and the server changed nothing.
        # The caller reads $STOCKADE_AUTH_TOKEN (or auth_token= in code): name it, not a parameter.
        if status == 403:
            error = Unauthorized(f"the server refused the credentials (HTTP 403): the token in $STOCKADE_AUTH_TOKEN "
                                 f"(or auth_token=) does not cover this scope or route ({detail})")
        else:
            error = Unauthorized(f"the server refused the credentials (HTTP {status}): set $STOCKADE_AUTH_TOKEN "
                                 "(or auth_token= in code) to a token of its --auth-tokens file")
    elif code == "invariant-violation":
        error = InvariantViolation(f"server: {detail}")
    elif code == "backend-unavailable" or status >= 500:
        error = BackendUnavailable(f"server: {detail} (HTTP {status})")
    elif status == 410:
        error = NotHolder(lease_hint(lease_id or ""), detail)
    elif status == 413:
        error = LimitExceeded(f"http_{status}", 0, detail)
    elif status in (400, 404, 405, 415, 422):
        # Not a problem this client knows: a wrong base path or an older server.
        error = InvalidArgument("request", f"server answered HTTP {status}: {detail}")
    else:
        error = BackendUnavailable(f"unexpected HTTP {status}: {detail}")
    return error, problem
