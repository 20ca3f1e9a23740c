"""The HTTP routes of ``stockade serve`` as data: one table for the server, the OpenAPI document and the client.

Each `Route` says what it is (method, path template, operation id), what it
takes (path, query and header parameters, a JSON or raw body) and what it
answers (its success status and schema, and the problems it can answer, by
status). The server dispatches with `match`, ``server/openapi.py`` renders
the table, and the remote client builds every target with `Route.target`, so
a route is written once (docs/http-api.md is its prose).

    method  path template                 operation id   auth  body
    GET     /healthz                      healthz        no    -
    GET     /metrics                      metrics        yes   -
    GET     /openapi.json                 openapiDocument yes  -
    GET     /                             dashboard      yes   -     (an HTML page of scopes)
    GET     /v1/cluster                   cluster        yes   -
    GET     /v1/locks                     listLocks      yes   -
    GET     /v1/locks/{scope}             inspectLock    yes   -
    GET     /v1/locks/{scope}/history     lockHistory    yes   -
    GET     /v1/locks/{scope}/contenders  lockContenders yes   -
    POST    /v1/locks/{scope}/acquire     acquire        yes   JSON (required)
    POST    /v1/leases/{lease_id}/renew   renew          yes   JSON (optional)
    DELETE  /v1/leases/{lease_id}         release        yes   -
    GET     /v1/kv/{scope}                listKeys       yes   -
    GET     /v1/kv/{scope}/{key}          get            yes   -
    PUT     /v1/kv/{scope}/{key}          put            yes   raw bytes (any Content-Type)
    DELETE  /v1/kv/{scope}/{key}          deleteKey      yes   -
    GET     /v1/hwm/{scope}               highWater      yes   -
    POST    /v1/tx/{scope}                transaction    yes   JSON (required; up to TX_BODY_BYTES_MAX)
    GET     /v1/fence-floors              fenceFloors    yes   -
    GET     /v1/admin/verify-keys         verifyKeys     admin -     (the keyring: it can mint)

``{key}`` is the rest of the path: a store key may hold ``/``, encoded or not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple
from urllib.parse import quote

from stockade.wire.codecs import FENCING_TOKEN_HEADER, IDEMPOTENCY_KEY_HEADER

__all__ = [
    "Route",
    "Answer",
    "ROUTES",
    "ROUTE",
    "TEMPLATES",
    "STORE_PREFIX",
    "TX_PREFIX",
    "Match",
    "match",
    "allowed_methods",
    "missing_handlers",
    "page_query",
]

# The paths whose routes take a raw value body (and so the larger body bound).
STORE_PREFIX = "/v1/kv/"
# The paths whose routes take a transaction's JSON body (and so `codecs.TX_BODY_BYTES_MAX`).
TX_PREFIX = "/v1/tx/"


@dataclass(frozen=True, slots=True)
class Answer:
    """A problem answer a route can give: its status, the problem codes, and why."""

    status: int
    codes: tuple[str, ...]
    description: str


@dataclass(frozen=True, slots=True)
class Route:
    """One operation of the HTTP API.

    Attributes:
        method: the HTTP method.
        path: the path template; ``{name}`` is one percent-encoded segment
            (the last one, when ``tail``, takes the rest of the path).
        operation_id: the OpenAPI ``operationId``; the server's handler is named by it.
        summary: a short phrase (OpenAPI ``summary``), or "".
        description: a longer note (OpenAPI ``description``), or "".
        path_params: the names in ``path``, in order.
        query: the query parameters the route accepts, ``(name, kind)`` (anything else is 400);
            the kind names the parameter's schema (``after`` is a scope or a key).
        headers: the request headers the route reads, ``(name, required)``.
        body: ``"json"``, ``"bytes"`` or ``""`` (none).
        body_schema: the schema name of a JSON body.
        body_required: whether the body must be present.
        status: the success status.
        answer: the success media type: ``"json"``, ``"bytes"``, ``"text"``, ``"html"`` or ``""``.
        answer_schema: the schema name of a JSON answer.
        answer_description: what the success answer means.
        problems: the problem answers beyond those every authenticated route can give (401).
        auth: whether a bearer token is needed when the server has auth on.
        tail: the last path parameter takes the rest of the path, ``/`` included.
    """

    method: str
    path: str
    operation_id: str
    answer_description: str
    status: int = 200
    answer: str = "json"
    answer_schema: str = ""
    summary: str = ""
    description: str = ""
    query: tuple[tuple[str, str], ...] = ()
    headers: tuple[tuple[str, bool], ...] = ()
    body: str = ""
    body_schema: str = ""
    body_required: bool = False
    problems: tuple[Answer, ...] = ()
    auth: bool = True
    tail: bool = False
    path_params: tuple[str, ...] = field(init=False)
    _segments: tuple[str | None, ...] = field(init=False, repr=False)
    _around: tuple[str, str] = field(init=False, repr=False)  # the path before and after its one parameter

    def __post_init__(self) -> None:
        segments = self.path.split("/")
        names = tuple(s[1:-1] for s in segments if s.startswith("{"))
        object.__setattr__(self, "path_params", names)
        object.__setattr__(self, "_segments", tuple(None if s.startswith("{") else s for s in segments))
        head, _, tail = self.path.partition("{" + names[0] + "}") if len(names) == 1 else ("", "", "")
        object.__setattr__(self, "_around", (head, tail))

    def target_of(self, value: str) -> str:
        """``target(name=value)`` of a route with one path parameter, made without a mapping (the client's
        hot path: an acquire, a release).

        Raises:
            KeyError: the route does not take one path parameter.
        """
        if len(self.path_params) != 1:
            raise KeyError(f"{self.operation_id} takes {self.path_params}, not one parameter")
        head, tail = self._around
        return head + _segment(value) + tail

    def target(self, query: str = "", **params: str) -> str:
        """The request target for ``params`` (each percent-encoded as one segment), plus ``?query``.

        Raises:
            KeyError: a path parameter is missing.
        """
        if len(params) != len(self.path_params):
            raise KeyError(f"{self.operation_id} takes {self.path_params}, got {tuple(params)}")
        path = self.path.format_map({name: _segment(value) for name, value in params.items()})
        return f"{path}?{query}" if query else path


_MALFORMED = Answer(400, ("invalid-argument",), "Malformed request (bad path, query or header).")
_UNAVAILABLE = Answer(503, ("backend-unavailable",), "The coordinator or store file could not be written.")
_COMMON = (_MALFORMED, _UNAVAILABLE)
_BODY = (
    Answer(413, ("limit-exceeded",), "Request body too large."),
    Answer(415, ("unsupported-media-type",), "Wrong content type."),
    Answer(422, ("invalid-argument",), "Well-formed JSON body with a bad field."),
)
_WRITE = (
    Answer(409, ("stale-token", "token-mismatch"),
           "stale-token (with token and high_water) or token-mismatch (with reason)."),
    Answer(413, ("limit-exceeded",), "Value too large."),
    Answer(429, ("limit-exceeded",), "A store bound was reached."),
)
_TOKEN_HEADERS = ((FENCING_TOKEN_HEADER, True), (IDEMPOTENCY_KEY_HEADER, False))

ROUTES: tuple[Route, ...] = (
    Route("GET", "/healthz", "healthz", "Both files are open.", answer_schema="Health", summary="Liveness",
          auth=False),
    Route("GET", "/metrics", "metrics", "Prometheus text format", answer="text", summary="Prometheus metrics"),
    Route("GET", "/openapi.json", "openapiDocument", "This document.", summary="OpenAPI document"),
    Route("GET", "/", "dashboard", "A page of scopes.", answer="html", summary="Dashboard"),
    Route("GET", "/v1/cluster", "cluster", "Cluster id", answer_schema="Cluster"),
    Route("GET", "/v1/fence-floors", "fenceFloors",
          "Every scope's fence floor, for a store's restore (R4): the last issued token of each scope the "
          "coordinator holds, and a default above every token of the scopes it forgot.",
          answer_schema="FenceFloors"),
    Route("GET", "/v1/admin/verify-keys", "verifyKeys",
          "The coordinator's keyring (the keyring file's JSON), for a resource host to verify tokens with.",
          answer_schema="Keyring", summary="Verify keys (administrators only)",
          description="HMAC keys verify and mint alike: whoever holds them is trusted like the coordinator. "
                      "Served only to a bearer token without scope patterns, on a server started with "
                      "--auth-tokens (403 otherwise, and to every token limited to scopes); never logged.",
          problems=(_MALFORMED, Answer(403, ("unauthorized",), "Not an administrator's token, or no auth."))),
    Route("GET", "/v1/locks", "listLocks", "A page of scopes in name order.", answer_schema="LockList",
          query=(("after", "scope"), ("limit", "limit")), problems=_COMMON),
    Route("GET", "/v1/locks/{scope}", "inspectLock", "The scope's state.", answer_schema="LockInfo",
          problems=_COMMON),
    Route("GET", "/v1/locks/{scope}/history", "lockHistory",
          "The scope's last events (grants, expiries, releases), oldest first, as committed.",
          answer_schema="LockHistory", query=(("limit", "history-limit"),), problems=_COMMON),
    Route("GET", "/v1/locks/{scope}/contenders", "lockContenders",
          "Who holds the scope and who waits for it, in the order they will be served: the holder first "
          "(holding true), then the waiters, first queued first (C4). Holder names only.",
          answer_schema="LockContenders", query=(("limit", "contenders-limit"),), problems=_COMMON),
    Route("POST", "/v1/locks/{scope}/acquire", "acquire", "Granted; the token is durable.", answer_schema="Grant",
          description="Long-polls up to wait_ms; waiters are served first in, first out.",
          body="json", body_schema="AcquireRequest", body_required=True,
          problems=(*_COMMON, *_BODY, Answer(409, ("lock-timeout",), "lock-timeout: still held at the deadline."),
                    Answer(429, ("limit-exceeded",), "limit-exceeded: queue or lease bound reached, or the "
                           "caller's address or token holds its share of waiting acquires (Retry-After)."))),
    Route("POST", "/v1/leases/{lease_id}/renew", "renew", "Renewed for its TTL from now.", answer_schema="Renewal",
          body="json", body_schema="RenewRequest",
          problems=(*_COMMON, *_BODY, Answer(410, ("not-holder",), "not-holder: expired, released, or unknown."))),
    Route("DELETE", "/v1/leases/{lease_id}", "release", "Released, or already gone.", status=204, answer="",
          problems=_COMMON),
    Route("GET", "/v1/kv/{scope}", "listKeys", "A page of keys in order.", answer_schema="ItemList",
          query=(("after", "key"), ("limit", "limit")),
          problems=_COMMON),
    Route("GET", "/v1/kv/{scope}/{key}", "get", "The value.", answer="bytes", tail=True,
          problems=(Answer(404, ("not-found",), "No such key."), *_COMMON)),
    Route("PUT", "/v1/kv/{scope}/{key}", "put", "Accepted and durable.", answer_schema="WriteResult", tail=True,
          headers=_TOKEN_HEADERS, body="bytes", body_required=True, problems=(*_COMMON, *_WRITE)),
    Route("DELETE", "/v1/kv/{scope}/{key}", "deleteKey", "Accepted and durable.", answer_schema="WriteResult",
          tail=True, headers=_TOKEN_HEADERS, problems=(*_COMMON, *_WRITE)),
    Route("POST", "/v1/tx/{scope}", "transaction", "Every step applied, in one commit.",
          answer_schema="TransactionResult",
          description="A multi-step write on one scope, all or none (R6): the token is checked against the "
                      "scope's high-water mark in the same commit that applies the steps, in order.",
          headers=((FENCING_TOKEN_HEADER, True),), body="json", body_schema="TransactionRequest", body_required=True,
          problems=(*_COMMON, *_BODY[1:], *_WRITE[::2],
                    Answer(413, ("limit-exceeded",), "Body, step count or a value over its bound."))),
    Route("GET", "/v1/hwm/{scope}", "highWater", "The scope's high-water mark (0 if never written).",
          answer_schema="HighWater", problems=_COMMON),
)

# operation id -> route: what the client builds its targets from.
ROUTE: Mapping[str, Route] = {route.operation_id: route for route in ROUTES}

# path template -> {method: route}, in table order (also the order of ``Allow``).
_templates: dict[str, dict[str, Route]] = {}
for _route in ROUTES:
    _templates.setdefault(_route.path, {})[_route.method] = _route
TEMPLATES: Mapping[str, Mapping[str, Route]] = _templates
del _route


_SEGMENT_SAFE = re.compile(r"[A-Za-z0-9._~:-]*")


def _segment(value: str) -> str:
    """``value`` percent-encoded as one path segment (scopes and lease ids pass as they are)."""
    return value if _SEGMENT_SAFE.fullmatch(value) else quote(value, safe="")


class Match(NamedTuple):
    """A path matched to its template: the routes by method, and the raw (still encoded) parameters."""

    template: str
    methods: Mapping[str, Route]
    params: tuple[str, ...]


# Matching is on the hot path of every request: a literal path is one dict
# lookup; a parametric one is indexed by its segment count and its resource
# (``locks`` in ``/v1/locks/...``), which leaves one candidate to compare.
_LITERAL: dict[str, str] = {}
_Literals = tuple[tuple[int, str], ...]
_PARAMETRIC: dict[tuple[int, str], list[tuple[_Literals, tuple[int, ...], str, Mapping[str, Route]]]] = {}
_TAILS: dict[str, list[tuple[_Literals, tuple[int, ...], str, Mapping[str, Route], int]]] = {}
for _path, _methods in TEMPLATES.items():
    _first = next(iter(_methods.values()))
    _shape = _first._segments
    if not _first.path_params:
        _LITERAL[_path] = _path
        continue
    if len(_shape) < 4 or _shape[2] is None:
        raise ValueError(f"{_path}: a parametric path starts /<version>/<resource>/")
    _literals = tuple((i, s) for i, s in enumerate(_shape) if s is not None and i != 2)
    _params = tuple(i for i, s in enumerate(_shape) if s is None)
    if _first.tail:
        _TAILS.setdefault(_shape[2], []).append((_literals, _params, _path, _methods, len(_shape)))
    else:
        _PARAMETRIC.setdefault((len(_shape), _shape[2]), []).append((_literals, _params, _path, _methods))
del _path, _methods, _first, _shape, _literals, _params


def match(path: str) -> Match | None:
    """The template ``path`` (a raw, still percent-encoded path) belongs to, or None.

    A parameter may be empty (``/v1/locks//acquire``): the handler refuses it
    (400) as it refuses any bad value.
    """
    if path in _LITERAL:
        return Match(path, TEMPLATES[path], ())
    parts = path.split("/")
    count = len(parts)
    if count < 4:
        return None
    head = parts[2]
    key = (count, head)
    for literals, params, template, methods in _PARAMETRIC[key] if key in _PARAMETRIC else ():
        for i, literal in literals:
            if parts[i] != literal:
                break
        else:  # one parameter (the usual routes'), taken without calls; more, by a comprehension
            found = (parts[params[0]],) if not params[1:] else tuple([parts[i] for i in params])
            return Match(template, methods, found)
    for literals, params, template, methods, size in _TAILS.get(head, ()):
        if count < size:
            continue
        for i, literal in literals:
            if parts[i] != literal:
                break
        else:
            values = [parts[i] for i in params[:-1]]
            values.append("/".join(parts[size - 1:]))
            return Match(template, methods, tuple(values))
    return None


def allowed_methods(template: str) -> str:
    """The ``Allow`` header of a template: its methods in table order."""
    return ", ".join(TEMPLATES[template])


def missing_handlers(handlers: Mapping[str, object]) -> list[str]:
    """The operation ids of the table that ``handlers`` has no entry for (the dispatcher's completeness check)."""
    return [route.operation_id for route in ROUTES if route.operation_id not in handlers]


def page_query(after: str, limit: int) -> str:
    """The query of a list page. An empty ``after`` is left out: the server validates any ``after`` it is given."""
    return f"after={quote(after, safe='')}&limit={limit}" if after else f"limit={limit}"
