"""The coordinator behind ``stockade serve``: the lease table in memory, durable through group commit.

The server is the only user of its coordinator file, so it loads every scope's
record once and decides in memory with the pure functions of
`stockade.core.leases`. Each change of a record is handed to the coordinator's
writer thread as an ``(old, new)`` pair (waiters stripped: they live only as
long as their HTTP requests) and committed in order, in batches; a grant,
renewal or release is answered only once its change is durable (C1).

Waiting is a long poll: a queued acquire holds its HTTP request until the
scope's head-of-queue turn comes (release, expiry, end of lock-delay wake the
head at once, C4) or until its deadline. The queue is the record's own
``waiters`` tuple, so FIFO order and the per-scope bound are the core's rules.
A waiter whose client disconnects leaves the queue; a grant that raced the
disconnect is released.

Reads (``inspect``, ``list``) take a snapshot and answer once every change
submitted before it is durable, so they never show a token that a crash could
still take back.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import os
import re
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from stockade.coordinators.sqlite import SQLiteCoordinator
from stockade.core.clock import Clock
from stockade.core.errors import BackendUnavailable, LimitExceeded, LockTimeout, NotHolder, StockadeError
from stockade.core.leases import (
    LEASE_ID_CHARS_MAX,
    LEASE_ID_CHARS_MIN,
    AcquireRequest,
    Granted,
    Lease,
    LeasePolicy,
    Queued,
    ScopeInfo,
    ScopeRecord,
    ScopeState,
    TimedOut,
    _validate_lease_id,
    acquire,
    cancel_wait,
    describe,
    lease_hint,
    release,
    renew,
    settle,
    state_of,
)
from stockade.core.limits import LEASES_MAX, LIST_PAGE_MAX
from stockade.server import _metrics
from stockade.server._groupcommit import GroupCommitter

__all__ = ["LeaseService", "SCOPES_MAX"]

SCOPES_MAX = 100_000  # scopes the server keeps in memory; acquiring a new one beyond this gets 429
_NS_PER_MS = 1_000_000
_NS_PER_S = 1_000_000_000
_WAKE_SLACK_S = 0.0005  # timers fire a little late rather than a little early

_log = logging.getLogger("stockade.server")


_LEASE_ID_BYTES = 24  # as `stockade.coordinators.sqlite.new_lease_id`: 192 random bits, URL-safe
_LEASE_ID_POOL = 128


class _LeaseIds:
    """Fresh lease ids, like `new_lease_id`, from a pool of OS randomness filled 128 ids at a time.

    Same CSPRNG and format as ``secrets.token_urlsafe(24)``; one ``getrandom`` per
    128 grants instead of one per grant.
    """

    __slots__ = ("_pool", "_at")

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def __call__(self) -> str:
        at = self._at
        if at + _LEASE_ID_BYTES > len(self._pool):
            self._pool, at = os.urandom(_LEASE_ID_BYTES * _LEASE_ID_POOL), 0
        self._at = at + _LEASE_ID_BYTES
        return base64.urlsafe_b64encode(self._pool[at:at + _LEASE_ID_BYTES]).decode("ascii")


_LEASE_ID_SHAPE = re.compile(f"[A-Za-z0-9_-]{{{LEASE_ID_CHARS_MIN},{LEASE_ID_CHARS_MAX}}}")


def validate_lease_id(lease_id: object) -> str:
    """Raise `InvalidArgument` unless ``lease_id`` has the shape of a lease id.

    The shape of `stockade.core.leases._validate_lease_id` as one regular
    expression (ASCII letters, digits, ``-``, ``_``; 16..64 of them); anything
    else goes to it for the error.
    """
    if type(lease_id) is str and _LEASE_ID_SHAPE.fullmatch(lease_id):
        return lease_id
    return _validate_lease_id(lease_id)


def _durable(record: ScopeRecord) -> ScopeRecord:
    return replace(record, waiters=()) if record.waiters else record


@dataclass(slots=True)
class _Waiter:
    request: AcquireRequest
    future: asyncio.Future[tuple[Lease, asyncio.Future[Any] | None]]


class LeaseService:
    """In-memory lease table over a `SQLiteCoordinator`, with FIFO long-poll waits.

    Args:
        engine: the coordinator file (used only by ``committer``'s thread after start).
        clock: the coordinator's monotonic clock.
        loop: the event loop everything here runs on.
    """

    def __init__(self, engine: SQLiteCoordinator, clock: Clock, loop: asyncio.AbstractEventLoop,
                 *, scopes_max: int = SCOPES_MAX) -> None:
        self.engine = engine
        self.cluster_id = engine.cluster_id
        self.policy: LeasePolicy = engine.policy
        self.clock = clock
        self.loop = loop
        self.scopes_max = scopes_max
        self.committer: GroupCommitter[tuple[ScopeRecord, ScopeRecord]] = GroupCommitter(
            "coordinator", engine.commit_records, loop)
        self.records: dict[str, ScopeRecord] = {}
        self.names: list[str] = []  # sorted, for paging
        self.scope_of_lease: dict[str, str] = {}
        self.waiters: dict[str, _Waiter] = {}
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self.leases = 0
        self._new_lease_id = _LeaseIds()

    # -- lifecycle ---------------------------------------------------------------------------

    def load(self) -> None:
        """Load the table; give every held lease a full TTL from now (C3); drop stored waiters.

        Runs before the committer starts, on the caller's thread, in one transaction.
        """
        stored = self.engine.records()
        now_ns = self.clock.now_ns()
        changes: list[tuple[ScopeRecord, ScopeRecord]] = []
        for scope, record in stored.items():
            new = replace(record, waiters=())
            lease = new.lease
            if lease is not None:  # persisted as held, even if its deadline passed while we were down
                new = replace(new, lease=replace(lease, expires_ns=max(lease.expires_ns,
                                                                       now_ns + lease.ttl_ms * _NS_PER_MS)))
            if new != record:
                changes.append((record, new))
            self.records[scope] = new
            if new.lease is not None:
                self.scope_of_lease[new.lease.lease_id] = scope
                self.leases += 1
        self.names = sorted(self.records)
        if changes:
            for error in self.engine.commit_records(changes):
                if error is not None:
                    raise error
        self.committer.start()

    def close(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
        self.committer.stop()

    # -- record changes ----------------------------------------------------------------------

    def _record(self, scope: str) -> ScopeRecord:
        record = self.records.get(scope)
        if record is None:
            if len(self.records) >= self.scopes_max:
                raise LimitExceeded("scopes_max", self.scopes_max, "the server keeps this many scopes")
            record = ScopeRecord(scope)
        return record

    def _set(self, scope: str, new: ScopeRecord, now_ns: int) -> asyncio.Future[Any] | None:
        """Make ``new`` the scope's record; queue its durable part. Returns the write's future."""
        old = self.records.get(scope)
        if old is None:
            bisect.insort(self.names, scope)
            old = ScopeRecord(scope)
        self.records[scope] = new
        old_lease, new_lease = old.lease, new.lease
        if old_lease is not None and (new_lease is None or new_lease.lease_id != old_lease.lease_id):
            self.scope_of_lease.pop(old_lease.lease_id, None)
            self.leases -= 1
            if now_ns >= old_lease.expires_ns:
                _metrics.EXPIRIES.inc()
                _log.debug("lease %s… on %r expired", lease_hint(old_lease.lease_id), scope,
                           extra={"scope": scope, "lease": lease_hint(old_lease.lease_id),
                                  "token_value": old_lease.token.value})
        if new_lease is not None and (old_lease is None or old_lease.lease_id != new_lease.lease_id):
            self.scope_of_lease[new_lease.lease_id] = scope
            self.leases += 1
        durable_old, durable_new = _durable(old), _durable(new)
        if durable_old == durable_new:
            return None
        return self.committer.submit((durable_old, durable_new))

    @staticmethod
    async def _wait_durable(write: asyncio.Future[Any] | None) -> None:
        if write is None:
            return
        error = await asyncio.shield(write)
        if isinstance(error, StockadeError):
            raise error

    # -- acquire -----------------------------------------------------------------------------

    async def acquire(self, scope: str, *, holder: str, ttl_ms: int, wait_ms: int) -> Lease:
        """Grant ``scope`` (durably) or raise `LockTimeout` at the deadline.

        Raises:
            InvalidArgument, LimitExceeded: nothing changed.
            LockTimeout: still held (or others ahead in the queue) at the deadline.
            BackendUnavailable: the grant could not be made durable (it was withdrawn).
        """
        now_ns = self.clock.now_ns()
        request = AcquireRequest(cluster=self.cluster_id, scope=scope, lease_id=self._new_lease_id(), holder=holder,
                                 ttl_ms=ttl_ms, wait_deadline_ns=now_ns + wait_ms * _NS_PER_MS)
        record = self._record(scope)
        new, outcome = acquire(record, request, now_ns, self.policy)
        if isinstance(outcome, Granted) and record.lease is None and self.leases >= LEASES_MAX:
            self._sweep_expired(now_ns)
            if self.leases >= LEASES_MAX:
                raise LimitExceeded("LEASES_MAX", LEASES_MAX)
        if isinstance(outcome, Granted):
            write = self._set(scope, new, now_ns)
            _metrics.GRANTS.inc()
            return await self._deliver(outcome.lease, write)
        if isinstance(outcome, TimedOut):
            self._set(scope, new, now_ns)  # settle may have expired a lease
            _metrics.LOCK_TIMEOUTS.inc()
            raise LockTimeout(scope, wait_ms)
        return await self._wait(scope, request, new, outcome, now_ns, wait_ms)

    def _sweep_expired(self, now_ns: int) -> None:
        # Only when the lease bound is hit: settle every lapsed lease so it stops counting.
        for scope in list(self.scope_of_lease.values()):
            record = self.records[scope]
            if record.lease is not None and now_ns >= record.lease.expires_ns:
                self._set(scope, settle(record, now_ns, self.policy), now_ns)

    async def _wait(self, scope: str, request: AcquireRequest, new: ScopeRecord, outcome: Queued,
                    now_ns: int, wait_ms: int) -> Lease:
        # The client's connection is the waiter's liveness, not polling: pin stale_ns to the deadline.
        waiters = list(new.waiters)
        waiters[-1] = replace(waiters[-1], stale_ns=request.wait_deadline_ns)
        self._set(scope, replace(new, waiters=tuple(waiters)), now_ns)
        future: asyncio.Future[tuple[Lease, asyncio.Future[Any] | None]] = self.loop.create_future()
        self.waiters[request.lease_id] = _Waiter(request, future)
        _metrics.WAITS.inc()
        self._schedule(scope, now_ns)
        started_ns = now_ns
        try:
            done, _ = await asyncio.wait((future,), timeout=wait_ms / 1000)
        except asyncio.CancelledError:
            # The client went away. Leave the queue; release a grant that raced the disconnect.
            self._abandon(scope, request.lease_id, future)
            raise
        finally:
            self.waiters.pop(request.lease_id, None)
            _metrics.WAIT_SECONDS.observe((self.clock.now_ns() - started_ns) / _NS_PER_S)
        if not done:
            self._leave_queue(scope, request.lease_id)
            _metrics.LOCK_TIMEOUTS.inc()
            raise LockTimeout(scope, wait_ms)
        lease, write = future.result()
        return await self._deliver(lease, write)

    async def _deliver(self, lease: Lease, write: asyncio.Future[Any] | None) -> Lease:
        """Answer a grant only once it is durable; withdraw it if that fails or the client is gone."""
        try:
            await self._wait_durable(write)
        except asyncio.CancelledError:
            self._release_quietly(lease.lease_id)
            raise
        except StockadeError:
            self._release_quietly(lease.lease_id)
            raise BackendUnavailable("the grant could not be made durable; it was withdrawn") from None
        return lease

    def _abandon(self, scope: str, lease_id: str, future: asyncio.Future[Any]) -> None:
        if future.done() and not future.cancelled():
            self._release_quietly(lease_id)
        else:
            future.cancel()
            self._leave_queue(scope, lease_id)

    def _leave_queue(self, scope: str, lease_id: str) -> None:
        record = self.records.get(scope)
        if record is None:
            return
        self._set(scope, cancel_wait(record, lease_id), self.clock.now_ns())
        self._pump(scope)

    def _release_quietly(self, lease_id: str) -> None:
        scope = self.scope_of_lease.get(lease_id)
        if scope is None:
            return
        now_ns = self.clock.now_ns()
        new, _ = release(self.records[scope], lease_id, now_ns, self.policy)
        self._set(scope, new, now_ns)
        self._pump(scope)

    # -- waking the head of a queue (C4) -----------------------------------------------------

    def _schedule(self, scope: str, now_ns: int) -> None:
        """Wake the scope's queue when its lease expires or its lock-delay ends."""
        record = self.records.get(scope)
        if record is None or not record.waiters:
            return
        if record.lease is not None:
            at_ns = record.lease.expires_ns
        else:
            at_ns = record.delay_until_ns
        timer = self.timers.pop(scope, None)
        if timer is not None:
            timer.cancel()
        delay_s = max(0.0, (at_ns - now_ns) / _NS_PER_S) + _WAKE_SLACK_S
        self.timers[scope] = self.loop.call_later(delay_s, self._on_timer, scope)

    def _on_timer(self, scope: str) -> None:
        self.timers.pop(scope, None)
        self._pump(scope)

    def _pump(self, scope: str) -> None:
        """Grant the scope to the head of its queue if it is free now; otherwise wake up later."""
        record = self.records.get(scope)
        if record is None:
            return
        now_ns = self.clock.now_ns()
        current = settle(record, now_ns, self.policy)
        granted: tuple[_Waiter, Lease] | None = None
        while current.waiters:
            head = current.waiters[0]
            waiter = self.waiters.get(head.lease_id)
            if waiter is None or waiter.future.done():
                current = cancel_wait(current, head.lease_id)
                continue
            if state_of(current, now_ns) is not ScopeState.FREE:
                break
            current, outcome = acquire(current, waiter.request, now_ns, self.policy)
            if isinstance(outcome, Granted):
                granted = (waiter, outcome.lease)
            break
        write = self._set(scope, current, now_ns) if current != record else None
        if granted is not None:
            waiter, lease = granted
            _metrics.GRANTS.inc()
            waiter.future.set_result((lease, write))
        self._schedule(scope, now_ns)

    # -- renew, release ----------------------------------------------------------------------

    async def renew(self, lease_id: str) -> Lease:
        """Extend a held lease by its TTL from now (durably).

        Raises:
            NotHolder: the lease expired, was released, or never existed.
        """
        scope = self.scope_of_lease.get(lease_id)
        if scope is None:
            raise NotHolder(lease_hint(lease_id), "lease expired, was released, or never existed")
        now_ns = self.clock.now_ns()
        record = self.records[scope]
        try:
            new, lease = renew(record, lease_id, now_ns, self.policy)
        except NotHolder:
            self._set(scope, settle(record, now_ns, self.policy), now_ns)
            self._pump(scope)
            raise
        write = self._set(scope, new, now_ns)
        _metrics.RENEWALS.inc()
        await self._wait_durable(write)
        return lease

    async def release(self, lease_id: str) -> bool:
        """Release a lease (durably). Idempotent: False when it was already gone."""
        scope = self.scope_of_lease.get(lease_id)
        if scope is None:
            return False
        now_ns = self.clock.now_ns()
        new, outcome = release(self.records[scope], lease_id, now_ns, self.policy)
        write = self._set(scope, new, now_ns)
        self._pump(scope)
        await self._wait_durable(write)
        return outcome.released

    # -- reads -------------------------------------------------------------------------------

    async def inspect(self, scope: str) -> ScopeInfo:
        record = self.records.get(scope) or ScopeRecord(scope)
        info = describe(record, self.clock.now_ns(), self.policy)
        await self._barrier()
        return info

    async def list(self, *, after: str, limit: int = LIST_PAGE_MAX) -> tuple[Sequence[ScopeInfo], str | None]:
        start = bisect.bisect_right(self.names, after) if after else 0
        names = self.names[start:start + limit]
        now_ns = self.clock.now_ns()
        infos = [describe(self.records[name], now_ns, self.policy) for name in names]
        more = start + limit < len(self.names)
        await self._barrier()
        return infos, (names[-1] if more and names else None)

    async def _barrier(self) -> None:
        last = self.committer.barrier()
        if last is not None:
            await asyncio.shield(last)
