"""``stockade serve``: the application (routes to handlers, the error table) and the server's lifecycle.

The wire contract is docs/http-api.md, and its data is `stockade.wire`: the
route table this module dispatches from, the problem catalogue its statuses
come from, and the codecs of its answers. Every handler validates its whole
input (`stockade.server._inputs`) before it touches state, so a rejected
request changes nothing; every error leaves as an RFC 9457 problem document.
An unexpected exception is a bug: it is logged with its traceback and
answered with a bare 500 (no detail).
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade.clock import SystemClock
from stockade.coordinators.sqlite._host import socket_path
from stockade.coordinators.sqlite.signed import open_signed_sqlite
from stockade.core.errors import InvalidArgument, InvariantViolation, LimitExceeded, StockadeError
from stockade.core.fence import Reject
from stockade.core.leases import Lease, LeasePolicy, lease_hint, redact_lease_path
from stockade.core.limits import (
    LIST_PAGE_MAX,
    LOCK_DELAY_MS_MAX,
    RELEASE_LAG_MS,
    RELEASE_LAG_MS_MAX,
    VALUE_BYTES_MAX,
    WAIT_MS_MAX,
    validate_holder,
    validate_idempotency_key,
    validate_int,
    validate_key,
    validate_scope,
    validate_ttl_ms,
    validate_wait,
    validate_wait_ms,
)
from stockade.core.tokens import FencingToken
from stockade.core.values import Op
from stockade.resources._observe import reject
from stockade.resources.store import BatchWrite, SQLiteStore
from stockade.server import _metrics
from stockade.server._auth import BearerAuth
from stockade.server._contenders_route import lock_contenders
from stockade.server._dashboard import STREAMS_MAX, Dashboard, Sessions, session_key
from stockade.server._groupcommit import GroupCommitter
from stockade.server._guard import SMALL_BODY_BYTES
from stockade.server._h1 import PARSERS, make_parser
from stockade.server._history_route import lock_history
from stockade.server._host import bind_host_socket, watch_idle
from stockade.server._http import (
    ConnectionLimits,
    Deferred,
    HttpProtocol,
    Request,
    Response,
    json_response,
    problem,
    problem_response,  # noqa: F401 - the test controls build their 401 with it
    within_share,
)
from stockade.server._inputs import (
    BodyField,
    Problem,
    fields,
    header,
    json_object,
    page_limit,
    query,
    segment,
)
from stockade.server._keys_route import verify_keys
from stockade.server._leases import LeaseService, validate_lease_id
from stockade.server._port_leases import PortLeaseService
from stockade.server._store_tx import StoreOp, StoreWrites, TxWrite, parse_steps
from stockade.server._tickets import WaitTickets, validate_ticket
from stockade.server.openapi import JSON_BODY_BYTES_MAX, openapi_document
from stockade.wire import DEFAULT_PORT, codecs
from stockade.wire.problems import PROBLEM_TYPES, code_of, problem_of
from stockade.wire.routes import ROUTES, STORE_PREFIX, TX_PREFIX, allowed_methods, match, missing_handlers

__all__ = ["ServerConfig", "App", "Server", "PROBLEMS", "DEFAULT_PORT", "problem_for"]

KV_BODY_BYTES_MAX = VALUE_BYTES_MAX
SWEEP_SECONDS = 5.0
CLOSE_GRACE_S = 0.5  # how long a stop waits for answers on their way (a waiting acquire holds it up that long at most)
IDLE_SCAN_LEASES_MAX = 1_000  # above it the host process is not idle, without looking at each lease
EXIT_COMMIT_FAILED = 74  # EX_IOERR: coord.db could not be written; restart to reload it

# code -> (status, title): the problem catalogue of `stockade.wire.problems`, in the shape it always had here.
PROBLEMS: Mapping[str, tuple[int, str]] = {code: (p.status, p.title) for code, p in PROBLEM_TYPES.items()}
# Paths answered without a bearer token even when auth is on (checked before routing, so that
# an unknown path does not tell an unauthenticated caller whether it exists).
_OPEN_PATHS = frozenset(route.path for route in ROUTES if not route.auth)
# The first three characters of every path the dashboard may own (`Dashboard.owns`: ``/``, ``/ui``, ``/ui/...``):
# any other path is not asked.
_UI_HEADS = frozenset(("/", "/ui"))
_STORE_PREFIX_CHARS = len(STORE_PREFIX)
_TX_PREFIX_CHARS = len(TX_PREFIX)
# The request metric's status label, by status: found, not formatted, per request (another one is formatted).
_STATUS_TEXT = {status: str(status) for status in range(100, 600)}


def _loggable(raw_path: object) -> str:
    """A request path for logs: bounded, lease ids cut to their hint (they are secrets)."""
    text = raw_path.decode("latin-1") if isinstance(raw_path, bytes) else str(raw_path)
    return redact_lease_path(text)[:100]


_log = logging.getLogger("stockade.server")


def problem_for(error: StockadeError | InvariantViolation, *, body_field: bool = False) -> Response:
    """The problem document for ``error``; its status from the catalogue (`stockade.wire.problems`)."""
    status, document = problem_of(error, body_field=body_field)
    return Response(status, codecs.dumps(document), codecs.PROBLEM_JSON)


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
    # A release is answered before its commit, durable at most this long later (LeaseService); 0: once durable.
    release_lag_ms: int = RELEASE_LAG_MS  # at most RELEASE_LAG_MS_MAX
    wait_ms_cap: int | None = None  # operators (and tests) may bound long polls below WAIT_MS_MAX
    dashboard_streams_max: int = STREAMS_MAX  # open event streams of the /ui/ pages (server/_dashboard.py)
    extra: dict[str, Any] = field(default_factory=dict)
    # The host's coordinator process of this file (what ``sqlite:///FILE`` reaches, server/_host.py): serve
    # FILE instead of data_dir/coord.db, on the Unix socket FILE.sock instead of host:port, and stop after
    # idle_exit_s with no lease, no waiter and no connection.
    host_file: Path | None = None
    idle_exit_s: float = 30.0
    # The request parser (server/_h1.py, PARSERS): "httptools" (the server extra's), "python" (the base
    # install's), or None for httptools when it is installed, else python. Both answer the same.
    http_parser: str | None = None


Handler = Callable[..., "Response | Awaitable[Response]"]
Leases = LeaseService | PortLeaseService  # the server's coordinator file, or --coordinator's backend


class App:
    """Routes requests to the lease service and the store, by the route table of `stockade.wire.routes`.

    Each route's handler is the method named by its operation id (``listLocks``
    -> ``list_locks``); construction fails if one is missing, so a route added
    to the table cannot go unserved.
    """

    def __init__(self, leases: Leases, store_writer: GroupCommitter[StoreOp], store_reader: SQLiteStore,
                 *, auth: BearerAuth | None, wait_ms_cap: int | None, value_bytes_max: int) -> None:
        self.leases = leases
        # The server's own file (None with --coordinator): acquire and release answer without a coroutine there.
        self.own_file: LeaseService | None = leases if isinstance(leases, LeaseService) else None
        self.tickets = WaitTickets(leases)  # the waits until granted (wait_ms null), by queue ticket
        self.store_writer = store_writer
        self.store_reader = store_reader
        self.auth = auth
        self.wait_ms_cap = wait_ms_cap
        self.value_bytes_max = value_bytes_max
        self.shares: ConnectionLimits | None = None  # the waiters' shares (stockade.server.Server sets it)
        self.cluster_id = leases.cluster_id
        self.openapi = json.dumps(openapi_document(auth=auth is not None, value_bytes_max=value_bytes_max)).encode()
        self.handlers = self.handlers_of(self)
        self.ui: Dashboard | None = None  # the /ui/ pages (stockade.server.Server sets them up)

    @staticmethod
    def handlers_of(target: object) -> dict[str, Handler]:
        """``{operation id: bound handler}`` for every route of the table.

        Raises:
            TypeError: a route has no handler (the dispatcher would answer it 404).
        """
        handlers = {route.operation_id: getattr(target, _handler_name(route.operation_id), None)
                    for route in ROUTES}
        found = {op: handler for op, handler in handlers.items() if handler is not None}
        missing = missing_handlers(found)
        if missing:
            raise TypeError(f"no handler for the routes {missing}")
        return found

    # -- transport hooks -----------------------------------------------------------------------

    @staticmethod
    def body_limit(path: str) -> int:
        # Prefixes compared as slices: ``startswith`` is a call, twice for every request.
        if path[:_STORE_PREFIX_CHARS] == STORE_PREFIX:
            return KV_BODY_BYTES_MAX
        return codecs.TX_BODY_BYTES_MAX if path[:_TX_PREFIX_CHARS] == TX_PREFIX else JSON_BODY_BYTES_MAX

    @staticmethod
    def observe(request: Request, response: Response, now: float) -> None:
        """Count an answered request; ``now``: when it was answered (`time.monotonic`)."""
        status = response.status
        _metrics.REQUEST_SECONDS.observe(now - request.started, response.route, request.method,
                                         _STATUS_TEXT[status] if status in _STATUS_TEXT else str(status))
        if response.status >= 400:
            _metrics.PROBLEMS.inc(code=_code_of(response))
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("%s %s %d", request.method, response.route, response.status,
                       extra={"method": request.method, "route": response.route, "status": response.status,
                              "seconds": round(now - request.started, 6)})

    def dispatch(self, request: Request) -> Response | Awaitable[Response]:
        route = "unmatched"
        if self.ui is not None and request.raw_path[:3] in _UI_HEADS and self.ui.owns(request):
            return self.ui.dispatch(request)  # its own auth: a session cookie, or a bearer token
        try:
            if self.auth is not None and request.raw_path not in _OPEN_PATHS and not self.auth.allows(
                request.headers.get("authorization")
            ):
                response = problem("unauthorized", headers=[("WWW-Authenticate", 'Bearer realm="stockade"')])
                response.route = "unauthorized"
                return response
            found = match(request.raw_path)
            if found is None:
                raise Problem("not-found", "no such route")
            route = found.template
            operation = found.methods.get(request.method)
            if operation is None:
                raise Problem("method-not-allowed", f"{request.method} not allowed",
                              [("Allow", allowed_methods(route))])
            result = self.handlers[operation.operation_id](request, *found.params)
        except Exception as exc:  # noqa: BLE001 - every error becomes a problem document
            response = self._error(exc, request)
            response.route = route
            return response
        if type(result) is Deferred or isinstance(result, Response):  # (a grant's and a release's: Deferred)
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
        if isinstance(exc, BodyField):
            return problem_for(exc.error, body_field=True)
        if isinstance(exc, StockadeError):
            if exc.code in ("invariant-violation", "stockade-error"):
                _log.error("bug while serving %s %s", request.method, _loggable(request.raw_path), exc_info=exc)
            elif exc.code == "backend-unavailable":
                _log.error("backend unavailable: %s", exc, extra={"error": exc.code})
            return problem_for(exc)
        if isinstance(exc, Problem):
            return problem(exc.code, exc.detail, headers=exc.headers)
        _log.error("bug while serving %s %s", request.method, _loggable(request.raw_path), exc_info=exc)
        return problem("invariant-violation")

    # -- operations (one per route; the name is the operation id in snake case) ----------------

    def healthz(self, request: Request) -> Response:
        return json_response(200, {"status": "ok"})

    def metrics(self, request: Request) -> Response:
        _metrics.LEASES_HELD.set(self.leases.leases)
        _metrics.WAITERS.set(len(self.leases.waiters))
        _metrics.SCOPES.set(len(self.leases.names))
        return Response(200, _metrics.render().encode(), "text/plain; version=0.0.4")

    def openapi_document(self, request: Request) -> Response:
        return Response(200, self.openapi, codecs.JSON)

    def cluster(self, request: Request) -> Response:
        query(request, ())
        return json_response(200, codecs.cluster_doc(self.cluster_id, dense_tokens=self.leases.dense_tokens))

    async def fence_floors(self, request: Request) -> Response:
        query(request, ())
        return json_response(200, codecs.fence_floors_doc(await self.leases.fence_floors()))

    async def dashboard(self, request: Request) -> Response:
        """``GET /``: a small HTML page of the first `LIST_PAGE_MAX` scopes, as ``stockade status`` shows them
        (from the lease table in memory; with ``--coordinator``, one page read from the backend)."""
        query(request, ())
        infos, scopes = await self.leases.overview(LIST_PAGE_MAX)
        rows = "".join(
            f"<tr><td>{html.escape(i.scope)}<td>{i.state.value}<td>{html.escape(i.holder or '-')}"
            f"<td>{i.token.value if i.token else '-'}<td>{i.last_token}"
            f"<td>{f'{i.remaining_ms} ms' if i.token else '-'}<td>{i.waiters}</tr>"
            for i in infos
        )
        shown = f"the first {len(infos)} of " if len(infos) < scopes else ""
        page = (
            "<!doctype html><meta charset=utf-8><title>stockade</title>"
            f"<h1>stockade</h1><p>cluster {html.escape(self.cluster_id)}: {shown}{scopes} scopes, "
            f"{self.leases.leases} leases, {len(self.leases.waiters)} waiters. "
            "<a href=/ui/>dashboard</a> <a href=/metrics>metrics</a> <a href=/openapi.json>openapi</a></p>"
            "<table border=1><tr><th>scope<th>state<th>holder<th>token<th>last token<th>remaining<th>waiters</tr>"
            + rows + "</table>"
        )
        return Response(200, page.encode(), "text/html; charset=utf-8")

    def acquire(self, request: Request, raw_scope: str) -> Deferred | Awaitable[Response]:
        """``POST /v1/locks/{scope}/acquire``. With no wait, on the server's own file, without a coroutine:
        the grant is made here and answered (`Deferred`) once its commit is durable (C1)."""
        scope, holder, ttl_ms, ticket, wait_ms = self._acquire_input(request, raw_scope)
        leases = self.own_file
        if ticket is None and not wait_ms and leases is not None:
            lease, durable = leases.acquire_now(scope, holder=holder, ttl_ms=ttl_ms)
            return Deferred(durable, self._granted, lease, scope, request, listen=leases.committer.listen)
        return self._acquire(request, scope, holder, ttl_ms, ticket, wait_ms)

    def _granted(self, done: Any, lease: Lease, scope: str, request: Request) -> Response | None:
        try:
            self.leases.delivered(lease, done)  # type: ignore[union-attr]  # a LeaseService's (`acquire`)
        except asyncio.CancelledError:
            return None
        except Exception as exc:  # noqa: BLE001 - every error becomes a problem document
            return self._error(exc, request)
        return json_response(200, codecs.grant_doc(lease, scope))

    def _acquire_input(self, request: Request, raw_scope: str) -> tuple[str, str, int, str | None, int]:
        """An acquire's whole input, validated: scope, holder, ttl_ms, ticket, and the wait in ms (capped)."""
        scope = validate_scope(segment(raw_scope, "scope"))
        if request.query:  # (`query` of none: only a query refuses)
            query(request, ())
        document = json_object(request, optional=False)
        fields(document, ("ttl_ms", "wait_ms", "holder", "ticket"))
        try:
            if "ttl_ms" not in document:
                raise InvalidArgument("ttl_ms", "is required")
            ttl_ms = validate_ttl_ms(document["ttl_ms"])
            wait: int | None = validate_wait(document["wait_ms"]) if "wait_ms" in document else 0
            holder = validate_holder(document["holder"]) if "holder" in document else "anonymous"
            # Waiting until granted (wait_ms null) goes with a queue ticket, and a ticket with nothing else.
            ticket = validate_ticket(document.get("ticket")) if (wait is None or "ticket" in document) else None
            if ticket is not None and wait is not None:
                raise InvalidArgument("ticket", "goes only with \"wait_ms\": null (waiting until granted)")
        except InvalidArgument as exc:
            if exc.field == "ticket" and "ticket" not in document:
                exc = InvalidArgument("ticket", "is required with \"wait_ms\": null (waiting until granted)")
            raise BodyField(exc) from None
        cap_ms = WAIT_MS_MAX if self.wait_ms_cap is None else self.wait_ms_cap
        return scope, holder, ttl_ms, ticket, cap_ms if wait is None or wait > cap_ms else wait

    async def _acquire(self, request: Request, scope: str, holder: str, ttl_ms: int, ticket: str | None,
                       wait_ms: int) -> Response:
        if ticket is None and not wait_ms:  # no wait: counted in no share (`within_share` awaits it as it is)
            lease = await self.leases.acquire(scope, holder=holder, ttl_ms=ttl_ms, wait_ms=wait_ms)
        elif ticket is not None:
            lease = await within_share(self.shares, request, wait_ms, lambda: self.tickets.acquire(
                scope, ticket, holder=holder, ttl_ms=ttl_ms, cap_ms=wait_ms))
        else:
            lease = await within_share(self.shares, request, wait_ms, lambda: self.leases.acquire(
                scope, holder=holder, ttl_ms=ttl_ms, wait_ms=wait_ms))
        if isinstance(lease, Response):  # the caller's address or token holds its share of waiting acquires
            return lease
        return json_response(200, codecs.grant_doc(lease, scope))

    async def renew(self, request: Request, raw_lease_id: str) -> Response:
        lease_id = validate_lease_id(segment(raw_lease_id, "lease_id"))
        query(request, ())
        document = json_object(request, optional=True)
        fields(document, ())
        lease = await self.leases.renew(lease_id)
        return json_response(200, codecs.renewal_doc(lease))

    def release(self, request: Request, raw_lease_id: str) -> Response | Deferred | Awaitable[Response]:
        """``DELETE /v1/leases/{lease_id}``; on the server's own file without a coroutine: answered at once (its
        commit follows, `LeaseService.release_now`), or with ``--release-lag-ms 0`` once durable (`Deferred`)."""
        lease_id = validate_lease_id(segment(raw_lease_id, "lease_id"))
        query(request, ())
        if request.body:
            raise InvalidArgument("body", "must be empty")
        leases = self.own_file
        if leases is not None:
            released, durable = leases.release_now(lease_id)
            if durable is None:
                return _no_content(released, lease_id)
            return Deferred(durable, self._released, released, lease_id, request, listen=leases.committer.listen)
        return self._release(lease_id)

    async def _release(self, lease_id: str) -> Response:
        return _no_content(await self.leases.release(lease_id), lease_id)

    def _released(self, done: Any, released: bool, lease_id: str, request: Request) -> Response | None:
        if done is not None:
            if done.cancelled():
                return None
            try:
                LeaseService.check_durable(done)
            except Exception as exc:  # noqa: BLE001 - every error becomes a problem document
                return self._error(exc, request)
        return _no_content(released, lease_id)

    async def inspect_lock(self, request: Request, raw_scope: str) -> Response:
        scope = validate_scope(segment(raw_scope, "scope"))
        query(request, ())
        return json_response(200, codecs.lock_doc(await self.leases.inspect(scope)))

    lock_history = lock_history  # GET /v1/locks/{scope}/history (server/_history_route.py)
    lock_contenders = lock_contenders  # GET /v1/locks/{scope}/contenders (server/_contenders_route.py)
    verify_keys = verify_keys  # GET /v1/admin/verify-keys, administrators only (server/_keys_route.py)

    async def list_locks(self, request: Request) -> Response:
        params = query(request, ("after", "limit"))
        after = params.get("after", "")
        if "after" in params:
            validate_scope(after, "after")
        infos, next_after = await self.leases.list(after=after, limit=page_limit(params))
        return json_response(200, codecs.lock_list_doc(infos, next_after))

    def _write(self, request: Request, raw_scope: str, raw_key: str, op: str) -> Awaitable[Response]:
        scope = validate_scope(segment(raw_scope, "scope"))
        key = validate_key(segment(raw_key, "key"))
        query(request, ())
        token = self._token_of(request, scope, key)
        idempotency_key = header(request, "idempotency-key")
        if idempotency_key is not None:
            validate_idempotency_key(idempotency_key)
        if op == "put":
            # The value is the body's bytes, whatever its Content-Type says: the type is not
            # stored, and curl labels --data-binary application/x-www-form-urlencoded.
            header(request, "content-type")  # still refused when given twice
            if len(request.body) > self.value_bytes_max:
                raise LimitExceeded("value_bytes_max", self.value_bytes_max)
            value = request.body
        else:
            if request.body:
                raise InvalidArgument("body", "must be empty")
            value = b""
        write = BatchWrite(op, scope, key, value, token, idempotency_key)  # type: ignore[arg-type]
        return self._write_result(self._submit(write, token, scope, key))

    def _token_of(self, request: Request, scope: str, key: str | None) -> FencingToken:
        """The request's ``Fencing-Token``, decoded, and refused (R5) if above what was issued."""
        raw_token = header(request, "fencing-token")
        if raw_token is None:
            raise InvalidArgument(codecs.FENCING_TOKEN_HEADER, "header is required")
        return FencingToken.decode(raw_token)

    async def _submit(self, write: Any, token: FencingToken, scope: str, key: str | None) -> Any:
        """Queue ``write`` for the store, unless its token is above the coordinator's last issued (R5: forged).

        This needs no key: even a token signed with a leaked key cannot raise a
        mark above what was issued. Issued values only grow, so checking before
        the store's commit is enough.
        """
        if token.cluster == self.cluster_id and token.value > await self.leases.last_issued(token.scope, token.value):
            reject(Reject("forged", 0, "above-issued"), resource="stockade-serve", cluster=self.cluster_id,
                   token=token, scope=scope, key=key)
        writer = self.store_writer
        return await writer.reply(writer.submit(write))  # a disconnect does not undo a queued write

    @staticmethod
    async def _write_result(pending: Awaitable[Any]) -> Response:
        result = await pending
        if isinstance(result, Exception):  # a refusal, or a bug (answered 500 and logged)
            raise result
        return json_response(200, codecs.write_doc(result))

    def transaction(self, request: Request, raw_scope: str) -> Awaitable[Response]:
        """``POST /v1/tx/{scope}``: every step or none, in one commit that checks the token (R6).

        The whole input is validated here, before anything is queued; the commit
        runs in the store's writer thread (`stockade.server._store_tx`).
        """
        scope = validate_scope(segment(raw_scope, "scope"))
        query(request, ())
        token = self._token_of(request, scope, None)
        if len(request.body) > SMALL_BODY_BYTES:
            return self._large_transaction(scope, token, request)
        write = TxWrite(scope, token, self._steps(request))
        return self._transaction_result(scope, token, self._submit(write, token, scope, None))

    def _steps(self, request: Request) -> tuple[tuple[Op, str, bytes], ...]:
        return parse_steps(json_object(request, optional=False), value_bytes_max=self.value_bytes_max)

    async def _large_transaction(self, scope: str, token: FencingToken, request: Request) -> Response:
        # Parsing megabytes of JSON and base64 takes tens of ms (45 ms for 10,000 steps here): in a
        # worker thread, the loop gets its turns meanwhile and a renewal is not held up behind it.
        steps = await asyncio.to_thread(self._steps, request)
        write = TxWrite(scope, token, steps)
        return await self._transaction_result(scope, token, self._submit(write, token, scope, None))

    @staticmethod
    async def _transaction_result(scope: str, token: FencingToken, pending: Awaitable[Any]) -> Response:
        result = await pending
        if isinstance(result, Exception):
            raise result
        high_water = result[0].high_water if result else token.value  # an accepted token is the mark
        return json_response(200, codecs.tx_doc(scope, token.value, high_water, result))

    def put(self, request: Request, raw_scope: str, raw_key: str) -> Awaitable[Response]:
        return self._write(request, raw_scope, raw_key, "put")

    def delete_key(self, request: Request, raw_scope: str, raw_key: str) -> Awaitable[Response]:
        return self._write(request, raw_scope, raw_key, "delete")

    def get(self, request: Request, raw_scope: str, raw_key: str) -> Response:
        scope = validate_scope(segment(raw_scope, "scope"))
        key = validate_key(segment(raw_key, "key"))
        query(request, ())
        item = self.store_reader.get(scope, key)
        if item is None:
            raise Problem("not-found", "no such key")
        return Response(200, item.value, codecs.OCTETS, codecs.item_headers(item))

    def list_keys(self, request: Request, raw_scope: str) -> Response:
        scope = validate_scope(segment(raw_scope, "scope"))
        params = query(request, ("after", "limit"))
        after = params.get("after", "")
        if "after" in params:
            validate_key(after)
        limit = page_limit(params)
        rows = self.store_reader.list_sizes(scope, after=after, limit=limit)
        more = len(rows) == limit and bool(self.store_reader.list_sizes(scope, after=rows[-1][0], limit=1))
        return json_response(200, codecs.key_list_doc(rows, rows[-1][0] if more and rows else None))

    def high_water(self, request: Request, raw_scope: str) -> Response:
        scope = validate_scope(segment(raw_scope, "scope"))
        query(request, ())
        return json_response(200, codecs.high_water_doc(scope, self.store_reader.high_water(scope)))


def _handler_name(operation_id: str) -> str:
    """``listLocks`` -> ``list_locks``."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in operation_id)


def _code_of(response: Response) -> str:
    if response.content_type != codecs.PROBLEM_JSON:
        return "other"
    try:
        return code_of(json.loads(response.body))[:40] or "other"
    except ValueError:
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
        validate_int("release_lag_ms", config.release_lag_ms, 0, RELEASE_LAG_MS_MAX)
        validate_int("dashboard_streams_max", config.dashboard_streams_max, 0, 100_000)
        if config.wait_ms_cap is not None:
            validate_wait_ms(config.wait_ms_cap)
        if (config.tls_cert is None) != (config.tls_key is None):
            raise InvalidArgument("tls", "--tls-cert and --tls-key go together")
        if config.http_parser is not None and config.http_parser not in PARSERS:
            raise InvalidArgument("http_parser", f"must be one of {', '.join(PARSERS)}")
        try:
            self.parser = make_parser(config.http_parser)
        except ImportError:
            raise InvalidArgument("http_parser",
                                  "httptools is not installed (pip install 'stockade[server]')") from None
        self.config = config
        self.exit_status = 0
        self.app: App | None = None
        self.leases: Leases | None = None
        self._files: tuple[Any, ...] = ()
        self.store_writer: GroupCommitter[StoreOp] | None = None
        self.port: int | None = None
        self._server: asyncio.base_events.Server | None = None
        self._limits = ConnectionLimits()
        self._idle_watch: asyncio.Task[None] | None = None
        self._start_lock: int | None = None
        # Made here, not in `start`: a stop asked for during startup is kept, and acted on once it ends.
        self._stopping = asyncio.Event()

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
        leases, keys = await self.open_leases(loop)
        self.leases, cluster_id = leases, leases.cluster_id
        try:
            writer_store = SQLiteStore(config.data_dir / "store.db", cluster_id=cluster_id, keys=keys)
            reader_store = SQLiteStore(config.data_dir / "store.db", cluster_id=cluster_id, keys=keys)
            self._files += (writer_store, reader_store)
            await leases.prepare_store(writer_store)
        except BaseException:
            await self._close_files()
            raise
        writes = StoreWrites(writer_store)  # single writes in group commits, transactions one commit each
        self.store_writer = GroupCommitter("store", writes.run_batch, loop, try_batch=writes.try_batch)
        self.store_writer.start()
        auth = BearerAuth(config.auth_tokens) if config.auth_tokens else None
        self.app = App(self.leases, self.store_writer, reader_store, auth=auth, wait_ms_cap=config.wait_ms_cap,
                       value_bytes_max=writer_store.value_bytes_max)
        app, limits = self.app, self._limits
        app.ui = Dashboard(leases=leases, store=reader_store, store_writer=self.store_writer, auth=auth,
                                  cluster_id=cluster_id, lock_delay_ms=config.lock_delay_ms, error=app._error,
                                  connections=lambda: len(limits.open), streams_max=config.dashboard_streams_max,
                                  sessions=Sessions(session_key(config.data_dir / "dashboard.key"), auth,
                                                    logouts=config.data_dir / "dashboard.logouts"),
                                  secure=context is not None)
        parser = self.parser
        protocol = lambda: HttpProtocol(app.dispatch, app.observe, app.body_limit, limits, parser)  # noqa: E731
        if config.host_file is not None:  # the host process of a file: its Unix socket, and its idle exit
            self._server = await loop.create_unix_server(protocol, sock=bind_host_socket(config.host_file, 1024))
            self.port = 0
            self._idle_watch = loop.create_task(watch_idle(config.host_file, config.idle_exit_s, self._idle,
                                                           self._stop_idle))
        else:
            self._server = await loop.create_server(protocol, host=config.host, port=config.port, ssl=context,
                                                    backlog=1024, reuse_address=True)
            self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = loop.create_task(self._sweep())
        _log.info("listening on %s", self.url, extra={"url": self.url, "cluster_id": cluster_id,
                                                       "auth": auth is not None, "tls": context is not None})

    async def open_leases(self, loop: asyncio.AbstractEventLoop) -> tuple[Leases, object]:
        """The lease service, and the keys the store verifies its tokens with.

        Here the coordinator file ``data_dir/coord.db``, signing with ``coord.keys``
        beside it (docs/tokens.md); `stockade.server.Server` serves ``--coordinator`` instead.
        """
        engine = open_signed_sqlite(
            self.config.host_file or self.config.data_dir / "coord.db",
            LeasePolicy(lock_delay_ms=self.config.lock_delay_ms), exclusive=True,
        )
        self._files = (engine,)
        leases = LeaseService(engine, SystemClock(), loop, release_lag_ms=self.config.release_lag_ms)
        leases.committer.on_failure = self._coordinator_failed
        leases.load()
        return leases, engine.signer

    def _idle(self) -> bool:
        """No connection, no waiter, no live lease (the host process's idle exit, server/_host.py)."""
        leases = self.leases
        if self._limits.open or not isinstance(leases, LeaseService) or leases.waiters:
            return False
        if not leases.leases:
            return True
        now_ns = time.monotonic_ns()  # the lease table's clock (SystemClock)
        return leases.leases <= IDLE_SCAN_LEASES_MAX and all(
            record.lease is None or record.lease.expires_ns <= now_ns for record in leases.records.values())

    def _stop_idle(self, start_lock_fd: int | None) -> None:
        if start_lock_fd is None:
            _log.info("idle, and the file's directory was removed: stopping")
        else:
            _log.info("idle for %g s: stopping", self.config.idle_exit_s)
        self._start_lock = start_lock_fd  # let go once the file is closed (`close`)
        self.stop()

    @property
    def url(self) -> str:
        if self.config.host_file is not None:
            return f"unix:{socket_path(self.config.host_file)}"
        scheme = "https" if self.config.tls_cert else "http"
        host = self.config.host if ":" not in self.config.host else f"[{self.config.host}]"
        return f"{scheme}://{host}:{self.port}"

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            self._limits.sweep()

    def stop(self) -> None:
        """Ask the server to stop (a signal handler: safe before, during and after `start`)."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _coordinator_failed(self, detail: str) -> None:
        # The lease table in memory may now differ from coord.db. Like PostgreSQL and
        # etcd on a failed fsync, stop: a restart reloads the durable state (C1, C3).
        _log.critical("coordinator commit failed; stopping so that a restart reloads coord.db: %s", detail)
        self.exit_status = EXIT_COMMIT_FAILED
        self.stop()

    async def serve_until_stopped(self) -> None:
        await self._stopping.wait()
        await self.close()

    async def close(self) -> None:
        """Stop accepting, end open connections, commit what is queued, close the files."""
        if self._server is not None:
            self._server.close()
        if self.app is not None and self.app.ui is not None:
            self.app.ui.close()
        self._sweeper.cancel()
        if self._idle_watch is not None:
            self._idle_watch.cancel()
        # An answer already decided goes out first: a grant withdrawn because its commit failed gets its 503.
        answering = [conn.answering for conn in self._limits.open if conn.answering is not None]
        if answering:
            await asyncio.wait(answering, timeout=CLOSE_GRACE_S)
        for conn in list(self._limits.open):
            conn._close()
        await asyncio.sleep(0)
        await self._close_files(self.store_writer)
        if self._start_lock is not None:  # the idle exit's: a client may start the next process from now
            os.close(self._start_lock)
            self._start_lock = None
        _log.info("stopped")

    async def _close_files(self, store_writer: GroupCommitter[StoreOp] | None = None) -> None:
        if self.app is not None:
            await self.app.tickets.aclose()
        if self.leases is not None:
            await self.leases.aclose()
        if store_writer is not None:
            await asyncio.get_running_loop().run_in_executor(None, store_writer.stop)
        for file in self._files:
            file.close()


def _no_content(released: bool, lease_id: str) -> Response:
    """A release's answer (204 either way: releasing is idempotent), logged when it released the lease."""
    if released and _log.isEnabledFor(logging.DEBUG):  # its hint is worked out only for a line that is written
        hint = lease_hint(lease_id)
        _log.debug("lease %s… released", hint, extra={"lease": hint})
    return Response(204)
