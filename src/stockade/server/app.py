"""``stockade serve``: routes, strict input parsing, the error table, and the server's lifecycle.

The wire contract is docs/http-api.md. Every handler validates its whole input
before it touches state, so a rejected request changes nothing; every error
leaves as an RFC 9457 problem document whose status comes from `PROBLEMS`,
one table keyed by `StockadeError.code`. An unexpected exception is a bug: it
is logged with its traceback and answered with a bare 500 (no detail).
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import signal
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

from stockade.clock import SystemClock
from stockade.coordinators.sqlite import SQLiteCoordinator
from stockade.core.errors import InvalidArgument, LimitExceeded, StaleToken, StockadeError, TokenMismatch
from stockade.core.leases import LeasePolicy, ScopeInfo, lease_hint, redact_lease_path
from stockade.core.limits import (
    LIST_PAGE_MAX,
    LOCK_DELAY_MS_MAX,
    VALUE_BYTES_MAX,
    validate_holder,
    validate_idempotency_key,
    validate_int,
    validate_key,
    validate_scope,
    validate_ttl_ms,
    validate_wait_ms,
)
from stockade.core.tokens import FencingToken
from stockade.resources.store import BatchWrite, SQLiteStore, WriteResult
from stockade.server import _metrics
from stockade.server._auth import BearerAuth
from stockade.server._groupcommit import GroupCommitter
from stockade.server._http import ConnectionLimits, HttpProtocol, Request, Response, json_response, problem_response
from stockade.server._leases import LeaseService, validate_lease_id
from stockade.server.openapi import JSON_BODY_BYTES_MAX, openapi_document

__all__ = ["ServerConfig", "App", "Server", "PROBLEMS", "DEFAULT_PORT", "problem_for"]

DEFAULT_PORT = 7390
KV_BODY_BYTES_MAX = VALUE_BYTES_MAX
SWEEP_SECONDS = 5.0
EXIT_COMMIT_FAILED = 74  # EX_IOERR: coord.db could not be written; restart to reload it

def _loggable(raw_path: object) -> str:
    """A request path for logs: bounded, lease ids cut to their hint (they are secrets)."""
    text = raw_path.decode("latin-1") if isinstance(raw_path, bytes) else str(raw_path)
    return redact_lease_path(text)[:100]


_log = logging.getLogger("stockade.server")

# code -> (status, title). The one table from errors to statuses (docs/http-api.md).
PROBLEMS: dict[str, tuple[int, str]] = {
    "invalid-argument": (400, "Invalid argument"),
    "limit-exceeded": (429, "Limit exceeded"),
    "stale-token": (409, "Stale fencing token"),
    "token-mismatch": (409, "Fencing token for another scope or cluster"),
    "fence-rejected": (409, "Fencing token rejected"),
    "lock-timeout": (409, "Lock still held at the deadline"),
    "not-holder": (410, "Lease not held"),
    "lease-error": (410, "Lease not held"),
    "lease-lost": (410, "Lease not held"),
    "backend-unavailable": (503, "Backend unavailable"),
    "unauthorized": (401, "Unauthorized"),
    "invariant-violation": (500, "Internal error"),
    "stockade-error": (500, "Internal error"),
    # Protocol-level problems that no StockadeError stands for.
    "not-found": (404, "Not found"),
    "method-not-allowed": (405, "Method not allowed"),
    "unsupported-media-type": (415, "Unsupported media type"),
}
# Where one code has a second status: a bad field of a well-formed JSON body, and size limits.
_BODY_FIELD_STATUS = 422
_SIZE_STATUS = 413


class _Problem(Exception):
    """A protocol-level problem raised by a handler (404, 405, 415)."""

    def __init__(self, code: str, detail: str, headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.headers = headers


class _BodyField(Exception):
    """Wraps an `InvalidArgument` about a field of a well-formed JSON body (answered 422)."""

    def __init__(self, error: InvalidArgument) -> None:
        super().__init__(str(error))
        self.error = error


def problem_for(error: StockadeError, *, body_field: bool = False) -> Response:
    """The problem document for ``error``; its status from `PROBLEMS`."""
    status, title = PROBLEMS.get(error.code, PROBLEMS["stockade-error"])
    if body_field and error.code == "invalid-argument":
        status = _BODY_FIELD_STATUS
    extra: dict[str, Any] = {}
    if isinstance(error, InvalidArgument):
        extra["field"] = error.field
    elif isinstance(error, LimitExceeded):
        extra["limit"] = error.limit
    elif isinstance(error, StaleToken):
        token = error.token
        extra["token"] = token.encode() if isinstance(token, FencingToken) else str(token)
        extra["high_water"] = error.high_water
    elif isinstance(error, TokenMismatch):
        extra["reason"] = error.reason
    detail = None if status >= 500 else str(error)
    return problem_response(status, error.code, title, detail, extra)


# -- strict input ---------------------------------------------------------------------------------


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise InvalidArgument("body", f"duplicate key {key!r}")
        result[key] = value
    return result


def _no_constants(name: str) -> Any:
    raise InvalidArgument("body", f"{name} is not JSON")


def _json_object(request: Request, *, optional: bool) -> dict[str, Any]:
    """Parse a JSON object body strictly (no duplicate keys, no NaN/Infinity, UTF-8 only).

    Raises:
        _Problem: wrong content type (415).
        InvalidArgument: not a well-formed JSON object (400).
    """
    body = request.body
    content_type = request.headers.get("content-type")
    if "content-type" in request.repeated:
        raise InvalidArgument("content-type", "must be given once")
    if not body and optional:
        if content_type is not None and _media_type(content_type) != "application/json":
            raise _Problem("unsupported-media-type", "the body must be application/json")
        return {}
    if content_type is None or _media_type(content_type) != "application/json":
        raise _Problem("unsupported-media-type", "the body must be application/json")
    try:
        document = json.loads(body.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except InvalidArgument:
        raise
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument("body", f"not well-formed JSON: {type(exc).__name__}") from None
    if not isinstance(document, dict):
        raise InvalidArgument("body", "must be a JSON object")
    return document


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _fields(document: dict[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(document) - set(allowed))
    if unknown:
        raise _BodyField(InvalidArgument(unknown[0][:40], f"unknown field; allowed: {', '.join(allowed)}"))


def _segment(raw: str, field: str) -> str:
    """Percent-decode one path segment (or query value) as strict UTF-8."""
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(field, "must be percent-encoded UTF-8") from None


def _query(request: Request, allowed: tuple[str, ...]) -> dict[str, str]:
    params: dict[str, str] = {}
    if not request.query:
        return params
    for part in request.query.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        name = _segment(name.replace("+", " "), "query")
        if name not in allowed:
            raise InvalidArgument("query", f"unknown parameter {name[:40]!r}; allowed: {', '.join(allowed)}")
        if name in params:
            raise InvalidArgument(name, "given more than once")
        params[name] = _segment(value.replace("+", " "), name)
    return params


def _limit(params: dict[str, str]) -> int:
    raw = params.get("limit")
    if raw is None:
        return LIST_PAGE_MAX
    if not raw.isascii() or not raw.isdigit() or len(raw) > 7:
        raise InvalidArgument("limit", f"must be an integer in 1..{LIST_PAGE_MAX}")
    return validate_int("limit", int(raw), 1, LIST_PAGE_MAX)


def _header(request: Request, name: str) -> str | None:
    if name in request.repeated:
        raise InvalidArgument(name, "must be given once")
    return request.headers.get(name)


def _lock_doc(info: ScopeInfo) -> dict[str, Any]:
    return {
        "scope": info.scope,
        "state": info.state.value,
        "holder": info.holder,
        "token": info.token.encode() if info.token else None,
        "token_value": info.token.value if info.token else None,
        "last_token": info.last_token,
        "remaining_ms": info.remaining_ms,
        "waiters": info.waiters,
    }


def _write_doc(result: WriteResult) -> dict[str, Any]:
    return {"scope": result.scope, "key": result.key, "token_value": result.token_value,
            "high_water": result.high_water, "commit_seq": result.commit_seq, "replayed": result.replayed}


# -- the application ------------------------------------------------------------------------------


@dataclass
class ServerConfig:
    """Everything ``stockade serve`` is configured with (validated by `Server`)."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    auth_tokens: list[str] | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    lock_delay_ms: int = 0
    wait_ms_cap: int | None = None  # operators (and tests) may bound long polls below WAIT_MS_MAX
    extra: dict[str, Any] = field(default_factory=dict)


Handler = Callable[..., "Response | Awaitable[Response]"]


class App:
    """Routes requests to the lease service and the store."""

    def __init__(self, leases: LeaseService, store_writer: GroupCommitter[BatchWrite], store_reader: SQLiteStore,
                 *, auth: BearerAuth | None, wait_ms_cap: int | None, value_bytes_max: int) -> None:
        self.leases = leases
        self.store_writer = store_writer
        self.store_reader = store_reader
        self.auth = auth
        self.wait_ms_cap = wait_ms_cap
        self.value_bytes_max = value_bytes_max
        self.cluster_id = leases.cluster_id
        self.openapi = json.dumps(openapi_document(auth=auth is not None, value_bytes_max=value_bytes_max)).encode()

    # -- transport hooks -----------------------------------------------------------------------

    @staticmethod
    def body_limit(path: str) -> int:
        return KV_BODY_BYTES_MAX if path.startswith("/v1/kv/") else JSON_BODY_BYTES_MAX

    @staticmethod
    def observe(request: Request, response: Response) -> None:
        _metrics.REQUEST_SECONDS.observe(time.monotonic() - request.started, response.route, request.method,
                                         str(response.status))
        if response.status >= 400:
            _metrics.PROBLEMS.inc(code=_code_of(response))
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("%s %s %d", request.method, response.route, response.status,
                       extra={"method": request.method, "route": response.route, "status": response.status,
                              "seconds": round(time.monotonic() - request.started, 6)})

    def dispatch(self, request: Request) -> Response | Awaitable[Response]:
        route = "unmatched"
        try:
            if self.auth is not None and request.raw_path != "/healthz" and not self.auth.allows(
                request.headers.get("authorization")
            ):
                response = problem_response(401, "unauthorized", "Unauthorized",
                                            headers=[("WWW-Authenticate", 'Bearer realm="stockade"')])
                response.route = "unauthorized"
                return response
            route, handler, args = self._route(request)
            result = handler(request, *args)
        except Exception as exc:  # noqa: BLE001 - every error becomes a problem document
            response = self._error(exc, request)
            response.route = route
            return response
        if isinstance(result, Response):
            result.route = route
            return result
        return self._finish(route, result, request)

    async def _finish(self, route: str, pending: Awaitable[Response], request: Request) -> Response:
        try:
            response = await pending
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            response = self._error(exc, request)
        response.route = route
        return response

    @staticmethod
    def _error(exc: Exception, request: Request) -> Response:
        if isinstance(exc, _BodyField):
            return problem_for(exc.error, body_field=True)
        if isinstance(exc, StockadeError):
            if exc.code in ("invariant-violation", "stockade-error"):
                _log.error("bug while serving %s %s", request.method, _loggable(request.raw_path), exc_info=exc)
            elif exc.code == "backend-unavailable":
                _log.error("backend unavailable: %s", exc, extra={"error": exc.code})
            return problem_for(exc)
        if isinstance(exc, _Problem):
            status, title = PROBLEMS[exc.code]
            return problem_response(status, exc.code, title, exc.detail, headers=exc.headers)
        _log.error("bug while serving %s %s", request.method, _loggable(request.raw_path), exc_info=exc)
        status, title = PROBLEMS["invariant-violation"]
        return problem_response(status, "invariant-violation", title)

    # -- routing -------------------------------------------------------------------------------

    def _route(self, request: Request) -> tuple[str, Handler, tuple[Any, ...]]:
        path, method = request.raw_path, request.method
        if path == "/healthz":
            return "/healthz", self._only(method, "GET", self.healthz), ()
        if path == "/metrics":
            return "/metrics", self._only(method, "GET", self.metrics), ()
        if path == "/openapi.json":
            return "/openapi.json", self._only(method, "GET", self.openapi_json), ()
        if path == "/":
            return "/", self._only(method, "GET", self.dashboard), ()
        if not path.startswith("/v1/"):
            raise _Problem("not-found", "no such route")
        parts = path[4:].split("/")
        head, count = parts[0], len(parts)
        if head == "locks":
            if count == 1:
                return "/v1/locks", self._only(method, "GET", self.list_locks), ()
            if count == 2:
                return "/v1/locks/{scope}", self._only(method, "GET", self.inspect), (parts[1],)
            if count == 3 and parts[2] == "acquire":
                return "/v1/locks/{scope}/acquire", self._only(method, "POST", self.acquire), (parts[1],)
        elif head == "leases":
            if count == 2:
                return "/v1/leases/{lease_id}", self._only(method, "DELETE", self.release), (parts[1],)
            if count == 3 and parts[2] == "renew":
                return "/v1/leases/{lease_id}/renew", self._only(method, "POST", self.renew), (parts[1],)
        elif head == "kv":
            if count == 2:
                return "/v1/kv/{scope}", self._only(method, "GET", self.list_keys), (parts[1],)
            if count >= 3:
                raw_key = "/".join(parts[2:])  # a key may hold '/', encoded or not
                handlers = {"GET": self.get_key, "PUT": self.put_key, "DELETE": self.delete_key}
                handler = handlers.get(method)
                if handler is None:
                    raise _Problem("method-not-allowed", f"{method} not allowed",
                                   [("Allow", "GET, PUT, DELETE")])
                return "/v1/kv/{scope}/{key}", handler, (parts[1], raw_key)
        elif head == "hwm" and count == 2:
            return "/v1/hwm/{scope}", self._only(method, "GET", self.high_water), (parts[1],)
        elif head == "cluster" and count == 1:
            return "/v1/cluster", self._only(method, "GET", self.cluster), ()
        raise _Problem("not-found", "no such route")

    @staticmethod
    def _only(method: str, allowed: str, handler: Handler) -> Handler:
        if method != allowed:
            raise _Problem("method-not-allowed", f"{method} not allowed", [("Allow", allowed)])
        return handler

    # -- operations ----------------------------------------------------------------------------

    def healthz(self, request: Request) -> Response:
        return json_response(200, {"status": "ok"})

    def metrics(self, request: Request) -> Response:
        return Response(200, _metrics.render().encode(), "text/plain; version=0.0.4")

    def openapi_json(self, request: Request) -> Response:
        return Response(200, self.openapi, "application/json")

    def cluster(self, request: Request) -> Response:
        _query(request, ())
        return json_response(200, {"cluster_id": self.cluster_id})

    def dashboard(self, request: Request) -> Response:
        rows = "".join(
            f"<tr><td>{html.escape(name)}</td><td>{record.last_token}</td>"
            f"<td>{html.escape(record.lease.holder) if record.lease else '-'}</td>"
            f"<td>{len(record.waiters)}</td></tr>"
            for name, record in ((n, self.leases.records[n]) for n in self.leases.names[:LIST_PAGE_MAX])
        )
        page = (
            "<!doctype html><meta charset=utf-8><title>stockade</title>"
            f"<h1>stockade</h1><p>cluster {self.cluster_id}; {len(self.leases.names)} scopes, "
            f"{self.leases.leases} leases. <a href=/metrics>metrics</a> <a href=/openapi.json>openapi</a></p>"
            "<table border=1><tr><th>scope<th>last token<th>holder<th>waiters</tr>" + rows + "</table>"
        )
        return Response(200, page.encode(), "text/html; charset=utf-8")

    async def acquire(self, request: Request, raw_scope: str) -> Response:
        scope = validate_scope(_segment(raw_scope, "scope"))
        _query(request, ())
        document = _json_object(request, optional=False)
        _fields(document, ("ttl_ms", "wait_ms", "holder"))
        try:
            if "ttl_ms" not in document:
                raise InvalidArgument("ttl_ms", "is required")
            ttl_ms = validate_ttl_ms(document["ttl_ms"])
            wait_ms = validate_wait_ms(document.get("wait_ms", 0))
            holder = validate_holder(document["holder"]) if "holder" in document else "anonymous"
        except InvalidArgument as exc:
            raise _BodyField(exc) from None
        if self.wait_ms_cap is not None:
            wait_ms = min(wait_ms, self.wait_ms_cap)
        lease = await self.leases.acquire(scope, holder=holder, ttl_ms=ttl_ms, wait_ms=wait_ms)
        return json_response(200, {"scope": scope, "token": lease.token.encode(), "token_value": lease.token.value,
                                   "lease_id": lease.lease_id, "ttl_ms": lease.ttl_ms})

    async def renew(self, request: Request, raw_lease_id: str) -> Response:
        lease_id = validate_lease_id(_segment(raw_lease_id, "lease_id"))
        _query(request, ())
        document = _json_object(request, optional=True)
        _fields(document, ())
        lease = await self.leases.renew(lease_id)
        return json_response(200, {"scope": lease.scope, "token": lease.token.encode(),
                                   "token_value": lease.token.value, "ttl_ms": lease.ttl_ms})

    async def release(self, request: Request, raw_lease_id: str) -> Response:
        lease_id = validate_lease_id(_segment(raw_lease_id, "lease_id"))
        _query(request, ())
        if request.body:
            raise InvalidArgument("body", "must be empty")
        released = await self.leases.release(lease_id)
        if released:
            _log.debug("lease %s… released", lease_hint(lease_id), extra={"lease": lease_hint(lease_id)})
        return Response(204)

    async def inspect(self, request: Request, raw_scope: str) -> Response:
        scope = validate_scope(_segment(raw_scope, "scope"))
        _query(request, ())
        return json_response(200, _lock_doc(await self.leases.inspect(scope)))

    async def list_locks(self, request: Request) -> Response:
        params = _query(request, ("after", "limit"))
        after = params.get("after", "")
        if "after" in params:
            validate_scope(after, "after")
        infos, next_after = await self.leases.list(after=after, limit=_limit(params))
        return json_response(200, {"locks": [_lock_doc(i) for i in infos], "next_after": next_after})

    def _write(self, request: Request, raw_scope: str, raw_key: str, op: str) -> Awaitable[Response]:
        scope = validate_scope(_segment(raw_scope, "scope"))
        key = validate_key(_segment(raw_key, "key"))
        _query(request, ())
        raw_token = _header(request, "fencing-token")
        if raw_token is None:
            raise InvalidArgument("Fencing-Token", "header is required")
        token = FencingToken.decode(raw_token)
        idempotency_key = _header(request, "idempotency-key")
        if idempotency_key is not None:
            validate_idempotency_key(idempotency_key)
        if op == "put":
            content_type = _header(request, "content-type")
            if content_type is not None and _media_type(content_type) != "application/octet-stream":
                raise _Problem("unsupported-media-type", "the value must be application/octet-stream")
            if len(request.body) > self.value_bytes_max:
                raise LimitExceeded("value_bytes_max", self.value_bytes_max)
            value = request.body
        else:
            if request.body:
                raise InvalidArgument("body", "must be empty")
            value = b""
        future = self.store_writer.submit(BatchWrite(op, scope, key, value, token, idempotency_key))  # type: ignore[arg-type]
        return self._write_result(future)

    @staticmethod
    async def _write_result(future: asyncio.Future[Any]) -> Response:
        result = await asyncio.shield(future)  # a disconnect does not undo a queued write
        if isinstance(result, StockadeError):
            raise result
        return json_response(200, _write_doc(result))

    def put_key(self, request: Request, raw_scope: str, raw_key: str) -> Awaitable[Response]:
        return self._write(request, raw_scope, raw_key, "put")

    def delete_key(self, request: Request, raw_scope: str, raw_key: str) -> Awaitable[Response]:
        return self._write(request, raw_scope, raw_key, "delete")

    def get_key(self, request: Request, raw_scope: str, raw_key: str) -> Response:
        scope = validate_scope(_segment(raw_scope, "scope"))
        key = validate_key(_segment(raw_key, "key"))
        _query(request, ())
        item = self.store_reader.get(scope, key)
        if item is None:
            raise _Problem("not-found", "no such key")
        return Response(200, item.value, "application/octet-stream",
                        [("Token-Value", str(item.token_value)), ("Commit-Seq", str(item.commit_seq))])

    def list_keys(self, request: Request, raw_scope: str) -> Response:
        scope = validate_scope(_segment(raw_scope, "scope"))
        params = _query(request, ("after", "limit"))
        after = params.get("after", "")
        if "after" in params:
            validate_key(after)
        limit = _limit(params)
        rows = self.store_reader.list_sizes(scope, after=after, limit=limit)
        more = len(rows) == limit and bool(self.store_reader.list_sizes(scope, after=rows[-1][0], limit=1))
        items = [{"key": k, "token_value": t, "commit_seq": c, "size": n} for k, t, c, n in rows]
        return json_response(200, {"items": items, "next_after": rows[-1][0] if more and rows else None})

    def high_water(self, request: Request, raw_scope: str) -> Response:
        scope = validate_scope(_segment(raw_scope, "scope"))
        _query(request, ())
        return json_response(200, {"scope": scope, "high_water": self.store_reader.high_water(scope)})


def _code_of(response: Response) -> str:
    if response.content_type != "application/problem+json":
        return "other"
    try:
        return str(json.loads(response.body)["type"]).rsplit("/", 1)[-1][:40]
    except (ValueError, KeyError, TypeError):
        return "other"


# -- the server -----------------------------------------------------------------------------------


class Server:
    """Opens the files, binds, serves until stopped, closes cleanly.

    Raises (from `start`):
        InvalidArgument: bad configuration.
        BackendUnavailable: a file cannot be opened.
        OSError: the address cannot be bound.
    """

    def __init__(self, config: ServerConfig) -> None:
        validate_int("port", config.port, 0, 65535)
        validate_int("lock_delay_ms", config.lock_delay_ms, 0, LOCK_DELAY_MS_MAX)
        if config.wait_ms_cap is not None:
            validate_wait_ms(config.wait_ms_cap)
        if (config.tls_cert is None) != (config.tls_key is None):
            raise InvalidArgument("tls", "--tls-cert and --tls-key go together")
        self.config = config
        self.exit_status = 0
        self.app: App | None = None
        self.leases: LeaseService | None = None
        self.store_writer: GroupCommitter[BatchWrite] | None = None
        self.port: int | None = None
        self._server: asyncio.base_events.Server | None = None
        self._limits = ConnectionLimits()
        self._stopping: asyncio.Event | None = None

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.config.tls_cert is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(str(self.config.tls_cert), str(self.config.tls_key))
        except (OSError, ssl.SSLError) as exc:
            raise InvalidArgument("tls", f"cannot load certificate and key: {exc}") from None
        return context

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        config = self.config
        context = self._ssl_context()
        config.data_dir.mkdir(parents=True, exist_ok=True)
        engine = SQLiteCoordinator(
            config.data_dir / "coord.db", policy=LeasePolicy(lock_delay_ms=config.lock_delay_ms), exclusive=True
        )
        writer_store = SQLiteStore(config.data_dir / "store.db", cluster_id=engine.cluster_id)
        reader_store = SQLiteStore(config.data_dir / "store.db", cluster_id=engine.cluster_id)
        self.leases = LeaseService(engine, SystemClock(), loop)
        self.leases.committer.on_failure = self._coordinator_failed
        self.leases.load()
        self.store_writer = GroupCommitter("store", writer_store.apply_batch, loop)
        self.store_writer.start()
        self._files = (engine, writer_store, reader_store)
        auth = BearerAuth(config.auth_tokens) if config.auth_tokens else None
        self.app = App(self.leases, self.store_writer, reader_store, auth=auth, wait_ms_cap=config.wait_ms_cap,
                       value_bytes_max=writer_store.value_bytes_max)
        app, limits = self.app, self._limits
        self._server = await loop.create_server(
            lambda: HttpProtocol(app.dispatch, app.observe, app.body_limit, limits),
            host=config.host, port=config.port, ssl=context, backlog=1024, reuse_address=True,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = loop.create_task(self._sweep())
        self._stopping = asyncio.Event()
        _log.info("listening on %s", self.url, extra={"url": self.url, "cluster_id": engine.cluster_id,
                                                       "auth": auth is not None, "tls": context is not None})

    @property
    def url(self) -> str:
        scheme = "https" if self.config.tls_cert else "http"
        host = self.config.host if ":" not in self.config.host else f"[{self.config.host}]"
        return f"{scheme}://{host}:{self.port}"

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            self._limits.sweep()

    def stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    def _coordinator_failed(self, detail: str) -> None:
        # The lease table in memory may now differ from coord.db. Like PostgreSQL and
        # etcd on a failed fsync, stop: a restart reloads the durable state (C1, C3).
        _log.critical("coordinator commit failed; stopping so that a restart reloads coord.db: %s", detail)
        self.exit_status = EXIT_COMMIT_FAILED
        self.stop()

    async def serve_until_stopped(self) -> None:
        assert self._stopping is not None
        await self._stopping.wait()
        await self.close()

    async def close(self) -> None:
        """Stop accepting, end open connections, commit what is queued, close the files."""
        if self._server is not None:
            self._server.close()
        self._sweeper.cancel()
        for conn in list(self._limits.open):
            conn._close()
        await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        if self.leases is not None:
            await loop.run_in_executor(None, self.leases.close)
        if self.store_writer is not None:
            await loop.run_in_executor(None, self.store_writer.stop)
        for file in self._files:
            file.close()
        _log.info("stopped")


def run(config: ServerConfig, *, ready: Callable[[Server], None] | None = None) -> int:
    """Run a server until SIGTERM or SIGINT (uvloop when installed).

    Returns:
        0, or `EXIT_COMMIT_FAILED` when it stopped because a coordinator commit failed.
    """
    try:
        import uvloop
    except ImportError:  # optional: the server works on the standard loop, somewhat slower
        uvloop = None  # type: ignore[assignment]
    loop = uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    server = Server(config)
    try:
        loop.run_until_complete(server.start())
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, server.stop)
        if ready is not None:
            ready(server)
        loop.run_until_complete(server.serve_until_stopped())
    finally:
        loop.close()
    return server.exit_status
