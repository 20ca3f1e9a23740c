"""``stockade serve --coordinator URL``: the HTTP API's lease routes over any coordinator port.

`PortLeaseService` answers the same routes as `stockade.server._leases.LeaseService`
(acquire with a long-poll wait, renew, release, inspect, list, fence floors,
last issued) but keeps no lease table of its own: every call goes to the
backend's `stockade.client._async.port.AsyncCoordinatorPort`, opened by
`stockade.connect_async`'s own code path, so any scheme with a port
(``postgresql://``, ``etcd://``, and any added later) serves with no change here.

- **Waiting** is the port's: PostgreSQL's notifications, etcd's watches. A
  client that disconnects cancels the HTTP request's task, which cancels the
  port's acquire; every port then leaves the queue and gives back a grant
  that raced the cancellation. A grant that completes in the same loop turn
  as the disconnect is released here.
- **No lease of the server's own.** A lease granted through the server lives
  only as long as its HTTP client renews it (each ``renew`` is one renewal on
  the backend: a keepalive of the etcd lease, a row update in PostgreSQL). The
  server runs no keepalive of its own, so when the client stops renewing (or
  the server dies) the backend expires the lease by its TTL.
- **Lease ids** on the wire are fresh secrets (as the SQLite service's), mapped
  here to the port's own ids, which need not be secret (etcd's name its lease
  and scope). The map is in memory: after a restart a client's next renewal
  is refused (``not-holder``) and the backend expires the lease within its TTL;
  tokens keep increasing, since the backend issues them.
- **Fence floors (R4).** The store in ``--data-dir`` trusts the backend's cluster
  id and keyring (``coord.verify_keys()``: etcd keeps it under its prefix,
  PostgreSQL in ``stockade_coord_keyring``), and at start its marks are raised
  to the backend's fence floors, so a restored store cannot accept a token
  that the backend has superseded.
- **History** (``GET /v1/locks/{scope}/history``) is the backend's own journal,
  read through the port's ``history`` (docs/history.md): every backend whose
  port keeps one answers, with no change here; one that keeps none is a 400.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stockade.coordinators._mint import new_lease_id
from stockade.coordinators.journal import HistoryEvent
from stockade.coordinators.registry import Capability
from stockade.core.errors import InvalidArgument, LimitExceeded, LockTimeout, NotHolder
from stockade.core.leases import Contender, Lease, ScopeInfo, lease_hint
from stockade.core.limits import LIST_PAGE_MAX
from stockade.core.tokens import FencingToken
from stockade.core.values import FenceFloors
from stockade.server import _metrics

if TYPE_CHECKING:
    from stockade.client._async.coordinator import AsyncCoordinator
    from stockade.client._async.port import AsyncCoordinatorPort
    from stockade.resources.store import SQLiteStore

__all__ = ["PortLeaseService", "open_port_leases", "serving_schemes", "LEASES_MAX", "WAITS_MAX"]

#: Leases granted through this server and not released, at most (a grant past it is given back: 429).
LEASES_MAX = 100_000
#: Acquires in flight at once, at most (429 past it). A PostgreSQL wait holds a worker thread
#: while it sleeps, so the worker pool is sized above it and a renewal never queues behind waits.
WAITS_MAX = 256
WORKER_THREADS = WAITS_MAX + 32
#: Last issued tokens remembered (per scope) for the above-issued check (R5).
ISSUED_CACHED_MAX = 100_000
_NS_PER_MS = 1_000_000


def serving_schemes() -> list[str]:
    """The coordinator schemes ``--coordinator`` takes: every registered backend with a port."""
    from stockade.coordinators.registry import schemes_where

    return schemes_where(served=True)  # not another server (a loop), nor this process's memory


def check_coordinator_url(url: str) -> str:
    """Raise `InvalidArgument` (field ``coordinator``) unless ``url`` names a backend that can be served."""
    from stockade.coordinators.registry import COORDINATORS, SCHEMES_PLANNED, coordinator_backend

    scheme, sep, _ = url.partition("://") if isinstance(url, str) else ("", "", "")
    if sep and scheme not in COORDINATORS and scheme not in SCHEMES_PLANNED:
        raise InvalidArgument("coordinator", f"unknown scheme {scheme!r}; use one of {', '.join(serving_schemes())}")
    backend, _ = coordinator_backend(url, "coordinator")
    if not backend.served:
        raise InvalidArgument("coordinator", f"{backend.scheme}:// cannot be served; use one of "
                                             f"{', '.join(serving_schemes())}")
    return url


@dataclass(slots=True)
class _Held:
    port_lease_id: str
    holder: str
    token: FencingToken
    ttl_ms: int
    expires_ns: int  # this server's monotonic clock: last renewal + TTL (the backend judges; this only prunes)


class PortLeaseService:
    """The lease routes over a coordinator port (see the module docstring).

    Args:
        coordinator: the handle `open_port_leases` opened (closed with the service).
        port: its port.
    """

    def __init__(self, coordinator: AsyncCoordinator, port: AsyncCoordinatorPort) -> None:
        self.coordinator = coordinator
        self.port = port
        cluster_id = port.cluster_id
        if cluster_id is None:
            raise InvalidArgument("coordinator", "the port was not opened")
        self.cluster_id: str = cluster_id
        self.keys = coordinator.verify_keys()
        self.dense_tokens = Capability.DENSE_TOKENS in port.capabilities
        self.waiters: dict[int, str] = {}  # acquires in flight: id -> scope
        self._held: dict[str, _Held] = {}
        self._issued: dict[str, int] = {}
        self._withdrawing: set[asyncio.Task[Any]] = set()
        self._next_waiter = 0

    # -- views for metrics and the status page -----------------------------------------------

    @property
    def leases(self) -> int:
        """Leases granted through this server and not released (one past its TTL counts until pruned)."""
        return len(self._held)

    @property
    def names(self) -> Sequence[str]:
        """The scopes of those leases (the backend keeps every scope; this server only sees its own)."""
        return sorted({held.token.scope for held in self._held.values()})

    async def overview(self, limit: int) -> tuple[Sequence[ScopeInfo], int]:
        """The first ``limit`` scopes as the backend reports them, and how many were read."""
        infos = await self.port.scopes(after="", limit=limit)
        return infos, len(infos)

    # -- lifecycle ---------------------------------------------------------------------------

    async def prepare_store(self, store: SQLiteStore) -> None:
        """Raise the store's marks to the backend's fence floors (R4): a restored store refuses stale tokens."""
        floors = await self.port.fence_floors()
        await asyncio.to_thread(store.raise_high_waters, floors)

    async def aclose(self) -> None:
        if self._withdrawing:
            await asyncio.gather(*self._withdrawing, return_exceptions=True)
        await self.coordinator.aclose()

    # -- leases ------------------------------------------------------------------------------

    async def acquire(self, scope: str, *, holder: str, ttl_ms: int, wait_ms: int | None) -> Lease:
        """Acquire through the port, waiting there up to ``wait_ms`` (None: until granted or cancelled).

        Raises:
            LimitExceeded: `WAITS_MAX` acquires in flight, or `LEASES_MAX` held; nothing granted.
            LockTimeout: still held when ``wait_ms`` ran out; nothing granted.
            BackendUnavailable: the backend failed (the port left its queue).
        """
        if len(self.waiters) >= WAITS_MAX:
            raise LimitExceeded("waits_max", WAITS_MAX)
        self._prune()
        if len(self._held) >= LEASES_MAX:
            raise LimitExceeded("leases_max", LEASES_MAX)
        waiter = self._next_waiter = self._next_waiter + 1
        self.waiters[waiter] = scope
        started_ns = time.monotonic_ns()
        try:
            grant = await self.port.acquire(scope, holder=holder, ttl_ms=ttl_ms, wait_ms=wait_ms)
        except LockTimeout:
            _metrics.LOCK_TIMEOUTS.inc()
            raise
        finally:
            del self.waiters[waiter]
            if wait_ms != 0:
                _metrics.WAIT_SECONDS.observe((time.monotonic_ns() - started_ns) / 1e9)
        try:
            await asyncio.sleep(0)  # a disconnect already seen by the transport cancels here
        except asyncio.CancelledError:
            self._withdraw(grant.lease_id)
            raise
        _metrics.GRANTS.inc()
        now_ns = time.monotonic_ns()
        lease_id = new_lease_id()
        held = _Held(grant.lease_id, grant.holder, grant.token, grant.ttl_ms, now_ns + grant.ttl_ms * _NS_PER_MS)
        self._held[lease_id] = held
        self._note_issued(scope, grant.token.value)
        return Lease(lease_id, held.holder, held.token, held.ttl_ms, now_ns, held.expires_ns)

    def _withdraw(self, port_lease_id: str) -> None:
        """Give back a grant nobody will receive, in the background (the caller was cancelled)."""
        task = asyncio.get_running_loop().create_task(self.port.release(port_lease_id))
        self._withdrawing.add(task)
        task.add_done_callback(self._withdrawing.discard)

    def _prune(self) -> None:
        """At the cap, forget leases a full TTL past their last renewal (the backend expired them)."""
        if len(self._held) < LEASES_MAX:
            return
        now_ns = time.monotonic_ns()
        for lease_id, held in list(self._held.items()):
            if now_ns > held.expires_ns + held.ttl_ms * _NS_PER_MS:
                del self._held[lease_id]

    async def renew(self, lease_id: str) -> Lease:
        """One renewal on the backend. Raises `NotHolder` when it refuses, or the id is unknown here."""
        held = self._held.get(lease_id)
        if held is None:
            raise NotHolder(lease_hint(lease_id), "lease expired, was released, or never existed")
        sent_ns = time.monotonic_ns()
        try:
            await self.port.renew(held.port_lease_id)
        except NotHolder:
            if self._held.get(lease_id) is held:
                del self._held[lease_id]
            _metrics.EXPIRIES.inc()
            raise NotHolder(lease_hint(lease_id), "lease expired or was released") from None
        _metrics.RENEWALS.inc()
        held.expires_ns = sent_ns + held.ttl_ms * _NS_PER_MS
        return Lease(lease_id, held.holder, held.token, held.ttl_ms, sent_ns, held.expires_ns)

    async def release(self, lease_id: str) -> bool:
        """Release on the backend; idempotent (False when the id is not held through this server)."""
        held = self._held.get(lease_id)
        if held is None:
            return False
        return await asyncio.shield(self._release(lease_id, held))  # a disconnect does not undo it

    async def _release(self, lease_id: str, held: _Held) -> bool:
        released = await self.port.release(held.port_lease_id)  # if it fails, the id stays: a retry may release
        if self._held.get(lease_id) is held:
            del self._held[lease_id]
        return released

    # -- reads -------------------------------------------------------------------------------

    async def inspect(self, scope: str) -> ScopeInfo:
        info = await self.port.inspect(scope)
        self._note_issued(scope, info.last_token)
        return info

    async def list(self, *, after: str, limit: int = LIST_PAGE_MAX) -> tuple[Sequence[ScopeInfo], str | None]:
        infos = await self.port.scopes(after=after, limit=limit)
        return infos, (infos[-1].scope if infos and len(infos) >= limit else None)

    async def fence_floors(self) -> FenceFloors:
        return await self.port.fence_floors()

    async def contenders(self, scope: str, limit: int) -> Sequence[Contender]:
        """The backend's line for ``scope`` (holder, then waiters in serving order), as its port reads it."""
        return await self.port.contenders(scope, limit=limit)

    async def history(self, scope: str, limit: int) -> Sequence[HistoryEvent]:
        """The backend's journal of ``scope``, oldest first, as its port reads it (docs/history.md).

        Raises:
            InvalidArgument: the backend keeps no history.
        """
        return await self.port.history(scope, limit=limit)

    async def last_issued(self, scope: str, at_least: int = 0) -> int:
        """The backend's last issued token of ``scope``; read from it only when ``at_least`` is above what
        this server saw issued (issued values only grow, so a remembered one is a valid lower bound)."""
        known = self._issued.get(scope, 0)
        if at_least <= known:
            return known
        value = await self.port.last_issued(scope)
        self._note_issued(scope, value)
        return value

    def _note_issued(self, scope: str, value: int) -> None:
        if value > self._issued.get(scope, 0):
            if len(self._issued) >= ISSUED_CACHED_MAX:
                self._issued.clear()
            self._issued[scope] = value


async def open_port_leases(url: str, *, lock_delay_ms: int) -> PortLeaseService:
    """Open ``url`` as `stockade.connect_async` does, read its identity, and serve it.

    The loop's worker pool (where a blocking port such as PostgreSQL's runs its
    calls and its waits) gets `WORKER_THREADS` threads.

    Raises:
        InvalidArgument: a url that cannot be served, a backend that publishes no keyring,
            or an option the backend refuses.
        BackendUnavailable: the backend cannot be reached.
    """
    from stockade.client._async.connect import connect_async
    from stockade.coordinators.registry import coordinator_backend

    check_coordinator_url(url)
    backend, _ = coordinator_backend(url, "coordinator")
    if any(option.name == "process" for option in backend.query):
        # sqlite:///F: the server is the file's one user, in its own process; it does not start F's host
        # process (the host process is itself a server; ?process=host, written out, still goes through it).
        url = backend.with_default(url, "process", "embedded")
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="stockade-port"))
    coordinator = await asyncio.to_thread(connect_async, url, lock_delay_ms=lock_delay_ms)
    try:
        port: AsyncCoordinatorPort = coordinator._port  # the port itself: no client keepalive in the server
        await port.open()
        service = PortLeaseService(coordinator, port)
        if service.keys is None:
            raise InvalidArgument("coordinator", "the backend publishes no keyring: its tokens cannot be verified")
    except BaseException:
        await coordinator.aclose()
        raise
    return service
