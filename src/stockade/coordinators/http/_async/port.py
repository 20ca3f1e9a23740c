"""Ports to a remote `stockade serve` over HTTP/1.1 keep-alive (docs/http-api.md).

The ports have the methods and return types of the embedded ones, and raise
the same exceptions: a problem document becomes its typed error (``raise …
from`` the `RemoteProblem`), and a connection that fails or times out becomes
`BackendUnavailable`. Every request has a deadline; an acquire gets its
``wait_ms`` on top, since the server long-polls.

The requests go through the transport's HTTP/1.1 client
(`stockade.transport._async.http_client`: keep-alive connections, deadlines,
one retry of a reused connection the server had closed).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stockade.client._shared import Grant
from stockade.clock import SystemClock
from stockade.coordinators._mint import new_wait_ticket
from stockade.coordinators.journal import HistoryEvent
from stockade.coordinators.registry import COORDINATORS, Capability
from stockade.core import leases as core_leases
from stockade.core.errors import BackendUnavailable, InvalidArgument, LockTimeout, NotHolder
from stockade.core.limits import (
    LEASES_MAX,
    VALUE_BYTES_MAX,
    WAIT_MS_MAX,
    validate_idempotency_key,
    validate_key,
    validate_scope,
    validate_value,
)
from stockade.core.tokens import FencingToken
from stockade.core.values import FenceFloors, Item, Write, WriteResult
from stockade.keys import FixedKeys, _parse
from stockade.transport._async.http_client import AsyncHTTPClient
from stockade.transport.http11 import (
    HTTPEndpoint,
    error_for,
    item_from,
    json_body,
    lease_from,
    scope_info_from,
    write_result_from,
)
from stockade.transport.io import AsyncIO
from stockade.wire import codecs
from stockade.wire.routes import ROUTE, Route, page_query

__all__ = ["AsyncHTTPCoordinatorPort", "AsyncHTTPStorePort"]

# A renewal must come back in time to matter: at most a third of the TTL.
RENEW_TIMEOUT_MS_MIN = 50

#: A wait until granted whose server stopped answering tries again after this pause, doubled
#: up to the max (a restart takes a second or so; the waiter queues again when it is back).
REQUEUE_PAUSE_MS_MIN = 50
REQUEUE_PAUSE_MS_MAX = 1_000

# The routes this client calls, from the one table (`stockade.wire.routes`): no path is written here.
_CLUSTER, _ACQUIRE, _RENEW, _RELEASE = ROUTE["cluster"], ROUTE["acquire"], ROUTE["renew"], ROUTE["release"]
_INSPECT, _LIST_LOCKS, _FENCE_FLOORS = ROUTE["inspectLock"], ROUTE["listLocks"], ROUTE["fenceFloors"]
_VERIFY_KEYS = ROUTE["verifyKeys"]
_PUT, _DELETE, _GET, _LIST_KEYS, _HIGH_WATER, _TRANSACTION = (
    ROUTE["put"], ROUTE["deleteKey"], ROUTE["get"], ROUTE["listKeys"], ROUTE["highWater"], ROUTE["transaction"])


def check_store_cluster(expected: str | None, remote: str) -> None:
    """Raises `InvalidArgument` when a store was opened for another cluster than the server's."""
    if expected is not None and expected != remote:
        raise InvalidArgument("cluster_id", f"{expected!r} differs from the store's cluster {remote!r}")


async def fetch_cluster_id(client: AsyncHTTPClient) -> str:
    """The server's cluster id (the ``cluster`` route): what its tokens carry."""
    _, doc = await client.get_json(_CLUSTER.target())
    return codecs.cluster_id_from(doc)


def fetch_verify_keys(endpoint: HTTPEndpoint) -> FixedKeys:
    """A ``stockade serve``'s verify keys, from ``GET /v1/admin/verify-keys``, in one blocking round trip.

    What ``coord.verify_keys()`` gives on an ``http(s)://`` coordinator (docs/tokens.md). The keys can
    mint tokens as well as verify them, so the server hands them only to a bearer token without scope
    patterns, on a server started with ``--auth-tokens``. They are a copy: after ``stockade keys rotate``
    on the server's host fetch them again, or keep them in a file (``stockade keys export``) that a
    `stockade.keys.KeyFile` follows. Blocking even in the async client, as reading a keyring file is.

    Raises:
        Unauthorized: no administrator's token, or a server without auth.
        BackendUnavailable: the server cannot be reached, or the answer is not a keyring.
    """

    async def read() -> Any:
        client = AsyncHTTPClient(endpoint)
        try:
            return (await client.get_json(_VERIFY_KEYS.target()))[1]
        finally:
            await client.aclose()

    doc = AsyncIO.run_now(read)
    return FixedKeys(_parse(codecs.dumps(doc), Path(f"{endpoint.authority}{_VERIFY_KEYS.path}")))


class AsyncHTTPCoordinatorPort:
    """The coordinator of a remote `stockade serve`.

    Args:
        client: the connection pool.
        cluster_id: the server's, if known; None to fetch it on `open` (or before the first grant).
    """

    def __init__(self, client: AsyncHTTPClient, *, cluster_id: str | None) -> None:
        self._client = client
        self.cluster_id = cluster_id
        self.capabilities = COORDINATORS["https" if client.endpoint.tls is not None else "http"].capabilities
        self.clock = SystemClock()
        # lease id -> (holder, ttl_ms) of leases granted through this port: a renewal
        # answer carries neither, and a renewal's deadline depends on the TTL.
        self._held: dict[str, tuple[str, int]] = {}
        self._described = False  # the server's cluster document was read (`open`)
        self.wait_rounds = 0  # requests of waits until granted past their first

    @property
    def keys(self) -> FixedKeys:
        """The server's verify keys: one blocking round trip, administrators only (`fetch_verify_keys`)."""
        return fetch_verify_keys(self._client.endpoint)

    async def open(self) -> None:
        if self._described:
            return
        _, doc = await self._client.get_json(_CLUSTER.target())
        if self.cluster_id is None:
            self.cluster_id = codecs.cluster_id_from(doc)
        if not codecs.dense_tokens_from(doc):  # serve --coordinator etcd://: tokens only increase
            self.capabilities = self.capabilities - {Capability.DENSE_TOKENS}
        self._described = True

    async def acquire(self, scope: str, *, holder: str, ttl_ms: int, wait_ms: int | None) -> Grant:
        """Acquire ``scope``; the server queues the request FIFO for up to ``wait_ms``.

        ``wait_ms=None`` waits until granted: every request carries the wait's queue
        ticket (a secret this port draws); the server answers at its per-request cap
        with 409 and the ticket, and the next request, sent at once, continues at the
        same place (`wait_rounds` counts them). A connection lost once the first
        request may have been sent (the server restarted) is tried again, pausing
        up to `REQUEUE_PAUSE_MS_MAX`, with the ticket; a server that no longer knows
        it queues the request again, at the back (docs/leases.md).

        Returns:
            The grant; ``sent_ns`` is the send time of the request (the start of
            the client's conservative lease deadline, K2).

        Raises:
            LockTimeout: still held when ``wait_ms`` ran out.
            BackendUnavailable: the server could not be reached or did not answer in time
                (for ``wait_ms=None``: only before the request was first queued).
        """
        await self.open()  # a grant is checked against the cluster id
        ticket = new_wait_ticket() if wait_ms is None else None
        pause_ms = REQUEUE_PAUSE_MS_MIN
        sent_once = False
        while True:
            fields: dict[str, Any] = {"ttl_ms": ttl_ms, "wait_ms": wait_ms, "holder": holder}
            if ticket is not None:
                fields["ticket"] = ticket
            sent_ns = self.clock.now_ns()
            try:
                response = await self._client.request(
                    _ACQUIRE.method, _ACQUIRE.target_of(scope), body=codecs.dumps(fields),
                    content_type=codecs.JSON, timeout_ms=self._client.endpoint.timeout_ms + (wait_ms or WAIT_MS_MAX),
                )
            except BackendUnavailable as exc:
                if ticket is None or not (sent_once or not exc.certain_no_effect):
                    raise  # never sent: a wrong url or a server that is down fails at once
                sent_once = True
                await AsyncIO.sleep(pause_ms / 1000)  # the server restarts: try again, with the ticket
                pause_ms = min(2 * pause_ms, REQUEUE_PAUSE_MS_MAX)
                continue
            sent_once = True
            if response.status == 200:
                break
            error, problem = error_for(response, scope=scope, wait_ms=wait_ms)
            if ticket is not None and isinstance(error, LockTimeout) and error.ticket == ticket:
                pause_ms = REQUEUE_PAUSE_MS_MIN
                self.wait_rounds += 1
                continue
            raise error from problem
        grant = codecs.grant_from(codecs.decode_json(response.body, response.status), holder=holder, sent_ns=sent_ns)
        if grant.token.scope != scope or grant.token.cluster != self.cluster_id:
            # Never hand out a token this client did not ask for.
            raise BackendUnavailable(f"server granted a token for another scope or cluster: {grant.token}")
        if len(self._held) >= LEASES_MAX:  # leases never released nor renewed: forget the oldest
            self._held.pop(next(iter(self._held)))
        self._held[grant.lease_id] = (holder, grant.ttl_ms)
        return grant

    async def renew(self, lease_id: str) -> None:
        holder, ttl_ms = self._held.get(lease_id, ("", 0))
        timeout_ms = self._client.endpoint.timeout_ms
        if ttl_ms:
            timeout_ms = min(timeout_ms, max(RENEW_TIMEOUT_MS_MIN, ttl_ms // 3))
        sent_ns = self.clock.now_ns()
        response = await self._client.request(
            _RENEW.method, _RENEW.target(lease_id=lease_id), body=b"{}", content_type=codecs.JSON,
            timeout_ms=timeout_ms, idempotent=True,
        )
        if response.status != 200:
            error, problem = error_for(response, lease_id=lease_id)
            if isinstance(error, NotHolder):
                self._held.pop(lease_id, None)
            raise error from problem
        lease_from(json_body(response), lease_id=lease_id, holder=holder or "?", sent_ns=sent_ns)  # validates it

    async def release(self, lease_id: str) -> bool:
        """Release; idempotent. ``released`` is True if this port held the lease until now."""
        response = await self._client.request(
            _RELEASE.method, _RELEASE.target_of(lease_id), timeout_ms=self._client.endpoint.timeout_ms,
            idempotent=True,
        )
        if response.status not in (200, 204):
            error, problem = error_for(response, lease_id=lease_id)
            raise error from problem
        return self._held.pop(lease_id, None) is not None

    async def inspect(self, scope: str) -> core_leases.ScopeInfo:
        _, doc = await self._client.get_json(_INSPECT.target(scope=scope))
        return scope_info_from(doc)

    async def history(self, scope: str, *, limit: int) -> list[HistoryEvent]:
        _, doc = await self._client.get_json(ROUTE["lockHistory"].target(f"limit={limit}", scope=scope))
        return [HistoryEvent(**event) for event in doc["events"]]

    async def scopes(self, *, after: str, limit: int) -> list[core_leases.ScopeInfo]:
        _, doc = await self._client.get_json(_LIST_LOCKS.target(page_query(after, limit)))
        return codecs.scope_infos_from(doc)

    async def contenders(self, scope: str, *, limit: int) -> list[core_leases.Contender]:
        _, doc = await self._client.get_json(ROUTE["lockContenders"].target(f"limit={limit}", scope=scope))
        return codecs.contenders_from(doc)

    async def last_issued(self, scope: str) -> int:
        last = (await self.inspect(scope)).last_token
        return last if last else (await self.fence_floors()).default  # not held: never used, or forgotten

    async def fence_floors(self) -> FenceFloors:
        _, doc = await self._client.get_json(_FENCE_FLOORS.target())
        return codecs.fence_floors_from(doc)

    async def aclose(self) -> None:
        await self._client.aclose()


class AsyncHTTPStorePort:
    """The fenced store of a remote `stockade serve` (`AsyncStorePort`).

    Arguments are validated here, as the embedded store does, so a bad one
    raises the same `InvalidArgument` without a round trip. A transaction is
    one request whose JSON body is bounded by `codecs.TX_BODY_BYTES_MAX`: each
    step counts the exact bytes it adds to that body, so a transaction the
    server would refuse for its size is refused here before anything is sent.
    """

    value_bytes_max = VALUE_BYTES_MAX
    tx_bytes_limit = "TX_BODY_BYTES_MAX"
    tx_bytes_max = codecs.tx_body_bytes_max()

    def __init__(
        self, client: AsyncHTTPClient, *, cluster_id: str | None, expected_cluster_id: str | None = None
    ) -> None:
        """``cluster_id``: the server's, if known; None to fetch it on `open`, and then
        check it against ``expected_cluster_id`` (the caller's, if given)."""
        self._client = client
        self.cluster_id = cluster_id
        self._expected_cluster_id = expected_cluster_id

    async def open(self) -> None:
        """Fetch the server's cluster id if not known yet.

        Raises:
            InvalidArgument: it differs from the cluster id the store was opened for.
        """
        if self.cluster_id is None:
            cluster_id = await fetch_cluster_id(self._client)
            check_store_cluster(self._expected_cluster_id, cluster_id)
            self.cluster_id = cluster_id

    async def _write(
        self, route: Route, scope: str, key: str, body: bytes, *, token: FencingToken, idempotency_key: str | None
    ) -> WriteResult:
        headers: tuple[tuple[str, str], ...] = ((codecs.FENCING_TOKEN_HEADER, token.encode()),)
        if idempotency_key is not None:
            headers += ((codecs.IDEMPOTENCY_KEY_HEADER, idempotency_key),)
        response = await self._client.request(
            route.method, route.target(scope=scope, key=key), body=body,
            content_type=codecs.OCTETS if route.body == "bytes" else None,
            headers=headers, timeout_ms=self._client.endpoint.timeout_ms,
        )
        if response.status != 200:
            error, problem = error_for(response, scope=scope, token=token)
            raise error from problem
        return write_result_from(json_body(response))

    async def put(
        self, scope: str, key: str, value: bytes | str, *, token: FencingToken, idempotency_key: str | None
    ) -> WriteResult:
        scope, key, data = validate_scope(scope), validate_key(key), validate_value(value)
        if idempotency_key is not None:
            validate_idempotency_key(idempotency_key)
        return await self._write(_PUT, scope, key, data, token=token, idempotency_key=idempotency_key)

    async def delete(self, scope: str, key: str, *, token: FencingToken, idempotency_key: str | None) -> WriteResult:
        scope, key = validate_scope(scope), validate_key(key)
        if idempotency_key is not None:
            validate_idempotency_key(idempotency_key)
        return await self._write(_DELETE, scope, key, b"", token=token, idempotency_key=idempotency_key)

    async def get(self, scope: str, key: str) -> Item | None:
        response = await self._client.request(
            _GET.method, _GET.target(scope=scope, key=key), timeout_ms=self._client.endpoint.timeout_ms
        )
        if response.status == 404:
            return None
        if response.status != 200:
            error, problem = error_for(response, scope=scope)
            raise error from problem
        return item_from(response, scope=scope, key=key)

    async def list(self, scope: str, *, after: str, limit: int) -> list[Item]:
        """A page of items with their values.

        The list answer carries no values (docs/http-api.md), so each is fetched;
        a key deleted in between is left out.
        """
        if after != "":
            validate_key(after)
        _, doc = await self._client.get_json(_LIST_KEYS.target(page_query(after, limit), scope=scope))
        items = []
        for key in codecs.keys_from(doc):
            item = await self.get(scope, key)
            if item is not None:
                items.append(item)
        return items

    async def high_water(self, scope: str) -> int:
        _, doc = await self._client.get_json(_HIGH_WATER.target(scope=scope))
        return codecs.high_water_from(doc)

    @staticmethod
    def tx_bytes(write: Write) -> int:
        return codecs.tx_step_bytes(write.op, write.key, len(write.value))

    async def transaction(
        self, scope: str, writes: Sequence[Write], *, token: FencingToken
    ) -> builtins.list[WriteResult]:
        """One ``POST /v1/tx/{scope}``; never resent (the first may have been applied)."""
        body = codecs.tx_body((w.op, w.key, w.value) for w in writes)
        response = await self._client.request(
            _TRANSACTION.method, _TRANSACTION.target(scope=scope), body=body, content_type=codecs.JSON,
            headers=((codecs.FENCING_TOKEN_HEADER, token.encode()),), timeout_ms=self._client.endpoint.timeout_ms,
        )
        if response.status != 200:
            error, problem = error_for(response, scope=scope, token=token)
            raise error from problem
        return codecs.tx_results_from(json_body(response), scope=scope, keys=[w.key for w in writes])

    async def aclose(self) -> None:
        await self._client.aclose()
