"""The client: coordinator handle, leases with keepalive, the lock block."""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, ParamSpec, TypeVar

from stockade.client._async.election import AsyncLeadership, watch_leader
from stockade.client._async.port import AsyncCoordinatorPort
from stockade.client._hooks import NO_HOOKS, Hooks, call_hook, lease_telemetry, validate_hooks
from stockade.client._leader import POLL_MS_DEFAULT, LeaderInfo, leader_of
from stockade.client._shared import CURRENT_LEASE, MAX_HOLD_MS_MAX, Grant, Leased, default_holder, lost_margin_ms
from stockade.clock import SystemClock
from stockade.coordinators.journal import HISTORY_PER_SCOPE, HistoryEvent
from stockade.coordinators.registry import Capability
from stockade.core import leases as core_leases
from stockade.core.clock import Clock
from stockade.core.errors import (
    BackendUnavailable,
    InvalidArgument,
    InvariantViolation,
    LeaseLost,
    NotHolder,
    StockadeError,
)
from stockade.core.limits import (
    CONTENDERS_MAX,
    LIST_PAGE_MAX,
    validate_holder,
    validate_int,
    validate_scope,
    validate_ttl_ms,
    validate_wait_ms,
)
from stockade.core.tokens import FencingToken
from stockade.core.values import FenceFloors
from stockade.transport.io import AsyncHandle, AsyncIO

__all__ = ["AsyncCoordinator", "AsyncLease"]

log = logging.getLogger("stockade.client")

RENEW_RETRY_MS = 50

P = ParamSpec("P")
T = TypeVar("T")


class AsyncLease(Leased):
    """A held lease: its token, and a keepalive that renews it at about TTL/3 (K2).

    The lease is *lost* when a renewal is refused, when its local deadline
    passes without a successful renewal (the send time of the last successful
    renew, or of the acquire, plus the TTL, minus a margin for drift), or when
    ``max_hold_ms`` has passed since the grant. Once lost it stays lost;
    `raise_if_lost` raises `LeaseLost`, and writes through a `FencedStore` that
    name this lease refuse to start. The deadline is an entry on a timer, which
    marks the loss at the deadline itself, even while a renewal hangs on a
    coordinator that stopped answering. Then, in the async client, the body of
    the lease's ``lock()`` block is cancelled; in both clients the hooks and
    ``on_lost`` are called (docs/leases.md).

    Attributes:
        scope: the scope held.
        token: the `FencingToken` of this grant; pass it with every write.
        ttl_ms: the lease's time to live.
        holder: the holder name the coordinator shows.
        max_hold_ms: the longest the keepalive renews this lease, or None.
    """

    def __init__(
        self,
        port: AsyncCoordinatorPort,
        grant: Grant,
        *,
        clock: Clock,
        max_hold_ms: int | None = None,
        hooks: Hooks = NO_HOOKS,
        on_lost: Callable[[Any], None] | None = None,
    ) -> None:
        self.scope = grant.token.scope
        self.token: FencingToken = grant.token
        self.ttl_ms = grant.ttl_ms
        self.holder = grant.holder
        self.max_hold_ms = max_hold_ms
        self._lease_id = grant.lease_id
        self._port = port
        self._clock = clock
        # Past this the keepalive stops: the lease is lost here at the latest.
        self._hold_end_ns = None if max_hold_ms is None else grant.sent_ns + max_hold_ms * 1_000_000
        deadline_ns = grant.sent_ns + (grant.ttl_ms - lost_margin_ms(grant.ttl_ms)) * 1_000_000
        self._deadline_ns = deadline_ns if max_hold_ms is None else self._capped(deadline_ns)
        self._lost = AsyncIO.event()
        self._stop = AsyncIO.event()  # set on release and on loss: the background work ends
        self._lost_cause = ""
        # Marking a loss runs once, whichever of a renewal, the deadline's timer entry
        # or a reader of `lost` (any thread, in the sync client) gets there first.
        self._loss_once = threading.Lock()
        self._released = False
        self._background: list[Any] = []  # the renewal queued or running, to join at release
        self._start_lock = threading.Lock()  # scheduling and stopping the keepalive, one at a time
        self._due: Any = None  # the timer's entry for the keepalive's start, or for the next renewal
        self._deadline_due: Any = None  # the timer's entry for the local deadline, once the keepalive started
        self._told: Any = None  # the loss's callbacks, when handed off to run elsewhere
        self._renew_at_s = 0.0
        self._keepalive_bug: InvariantViolation | None = None
        self._enclosing: Leased | None = None  # the lease of the enclosing lock() block, if any
        self._telemetry = lease_telemetry(hooks)
        self._on_lost = on_lost
        self._guard: Any = None  # the lock() block's body guard, while its body runs

    def __repr__(self) -> str:
        return f"<Lease scope={self.scope!r} token={self.token.value} lost={self.lost}>"

    def _capped(self, deadline_ns: int) -> int:
        return deadline_ns if self._hold_end_ns is None else min(deadline_ns, self._hold_end_ns)

    @property
    def lease_id(self) -> str:
        """The lease's secret id (needed to renew or release it elsewhere). Do not log it."""
        return self._lease_id

    @property
    def lost(self) -> bool:
        """True once the lease is known or presumed lost. Never turns back to False."""
        if not self._lost.is_set() and not self._released and self._clock.now_ns() >= self._deadline_ns:
            self._mark_lost(self._deadline_cause())
        return self._lost.is_set()

    @property
    def lost_cause(self) -> str:
        return self._lost_cause

    @property
    def remaining_ms(self) -> int:
        """Milliseconds until the local deadline (0 when lost or released)."""
        if self.lost or self._released:
            return 0
        return max(0, (self._deadline_ns - self._clock.now_ns()) // 1_000_000)

    def raise_if_lost(self) -> None:
        """Raises `LeaseLost` if the lease is lost or already released."""
        if self.lost:
            raise LeaseLost(self.scope, self.token, self._lost_cause)
        if self._released:
            raise LeaseLost(self.scope, self.token, "lease was released")

    def _deadline_cause(self) -> str:
        if self._hold_end_ns is not None and self._deadline_ns >= self._hold_end_ns:
            return f"max_hold_ms={self.max_hold_ms} reached"
        return "local deadline passed without a successful renewal"

    def _mark_lost(self, cause: str, *, hand_off: bool = False) -> None:
        """Mark the lease lost, once. ``hand_off``: called by a renewal (joined by `release`) or by the timer
        (holding `_start_lock`), which must not wait for the user's callbacks: they run on the callback
        thread (sync), and `release` waits for them (`_told`)."""
        with self._loss_once:
            if self._lost.is_set():
                return
            self._lost_cause = cause
            self._lost.set()
        self._stop.set()
        guard = self._guard
        if guard is not None:
            guard.interrupt(cause)  # first: the work the lease guards stops
        if hand_off:  # the log too: a handler may do I/O, and the timer's thread marks every lease's deadline
            self._told = AsyncIO.hand_off(self._tell_lost)
        else:
            self._tell_lost()

    def _tell_lost(self) -> None:
        log.warning("lease lost", extra={"scope": self.scope, "token": self.token.value, "cause": self._lost_cause})
        self._telemetry.lost(self)
        call_hook("on_lost", self._on_lost, self)

    async def wait_lost(self, timeout_ms: int | None = None) -> bool:
        """Wait until the lease is lost, at most ``timeout_ms``; returns `lost`."""
        end_ns = None if timeout_ms is None else self._clock.now_ns() + timeout_ms * 1_000_000
        while not self.lost and not self._released:
            wake_ns = self._deadline_ns if end_ns is None else min(end_ns, self._deadline_ns)
            timeout_s = max(0.0, (wake_ns - self._clock.now_ns()) / 1e9)
            await AsyncIO.wait_event(self._lost, timeout_s + 0.001)
            if end_ns is not None and self._clock.now_ns() >= end_ns:
                break
        return self.lost

    async def renew(self) -> None:
        """Renew now, moving the local deadline to send time + TTL - margin (never past ``max_hold_ms``).

        Raises:
            LeaseLost: the lease is lost (including: the coordinator refused the renewal).
            BackendUnavailable: the coordinator could not be reached; the lease is not lost yet.
        """
        self.raise_if_lost()
        await self._renew_now()

    async def _renew_now(self, *, hand_off: bool = False) -> None:
        sent_ns = self._clock.now_ns()
        try:
            await self._port.renew(self._lease_id)
        except NotHolder as exc:
            self._mark_lost("coordinator refused renewal: lease expired or released", hand_off=hand_off)
            raise LeaseLost(self.scope, self.token, self._lost_cause) from exc
        deadline_ns = self._capped(sent_ns + (self.ttl_ms - lost_margin_ms(self.ttl_ms)) * 1_000_000)
        self._deadline_ns = max(self._deadline_ns, deadline_ns)
        if not self._lost.is_set():
            self._telemetry.renewed(self)

    async def contenders(self, *, limit: int = CONTENDERS_MAX) -> list[core_leases.Contender]:
        """Who holds this lease's scope and who waits for it, in serving order (`AsyncCoordinator.contenders`):
        while the lease is held, this holder first. A snapshot; holder names only.

        Raises:
            InvalidArgument: a bad limit.
        """
        validate_int("limit", limit, 1, CONTENDERS_MAX)
        return await self._port.contenders(self.scope, limit=limit)

    async def release(self) -> None:
        """Stop the keepalive and release the lease. Idempotent.

        Raises:
            InvariantViolation: the keepalive stopped on a bug in stockade (after
                the lease is released), so that the bug is not lost in a background
                task.
        """
        for renewal in self._stop_background():
            await AsyncIO.join(renewal)
        if self._told is not None:  # the loss's callbacks, handed off: they run before the release is done
            await AsyncIO.join(self._told)
        if not self._released:
            self._released = True
            try:
                await self._port.release(self._lease_id)
            finally:
                self._telemetry.released(self)
        bug, self._keepalive_bug = self._keepalive_bug, None
        if bug is not None:
            raise bug

    async def _orphan(self) -> None:
        """Its coordinator handle closes: stop renewing, and count the lease as lost unless released."""
        for renewal in self._stop_background():
            await AsyncIO.join(renewal)
        if self._told is not None:
            await AsyncIO.join(self._told)
        if not self._released:
            self._mark_lost("the coordinator handle was closed")

    def _schedule_keepalive(self) -> None:
        """Start the keepalive at TTL/3, or at a sooner deadline (``max_hold_ms``).

        A lease released before then (a lock held for one write) starts nothing (docs/leases.md).
        """
        interval_s = self.ttl_ms / 3 / 1000
        to_deadline_s = max(0.0, (self._deadline_ns - self._clock.now_ns()) / 1e9)
        self._renew_at_s = time.monotonic() + interval_s
        self._due = AsyncIO.call_later(min(interval_s, to_deadline_s), self._on_due)

    def _on_due(self) -> None:
        with self._start_lock:
            if self._stop.is_set():
                return
            try:
                self._start_keepalive(first_wait_s=max(0.0, self._renew_at_s - time.monotonic()))
            except Exception as exc:  # noqa: BLE001 - e.g. no thread can be started: nobody renews the lease
                self._mark_lost(f"the keepalive could not start: {exc!r}", hand_off=True)

    def _stop_background(self) -> list[Any]:
        """Stop the keepalive, started or not; returns the renewal to join (it may be running)."""
        with self._start_lock:
            self._stop.set()
            due, self._due = self._due, None
            deadline_due, self._deadline_due = self._deadline_due, None
            background, self._background = self._background, []
        if due is not None:
            due.cancel()
        if deadline_due is not None:
            deadline_due.cancel()
        return background

    def _start_keepalive(self, *, first_wait_s: float) -> None:
        """Put the local deadline and the first renewal on the timer (holding `_start_lock`, or before the
        lease is returned). Nothing here is a thread or a task of the lease's own: the timer runs the
        deadline, and a renewal due runs on the process's few keepalive threads (sync) or a task (async)."""
        to_deadline_s = max(0.0, (self._deadline_ns - self._clock.now_ns()) / 1e9)
        self._deadline_due = AsyncIO.call_later(to_deadline_s, self._on_deadline)
        self._due = AsyncIO.call_later(first_wait_s, self._on_renewal_due)

    def _on_deadline(self) -> None:
        """On the timer: mark the lease lost at its local deadline, whatever its renewal is doing.

        A renewal may hang on a coordinator that stopped answering (up to its
        request timeout); the deadline does not wait for it. Marking only flips
        the lease's state; the callbacks run on the callback thread (sync).
        """
        with self._start_lock:  # held while marking: a release that stops the keepalive then sees `_told`
            if self._stop.is_set():
                return
            remaining_s = (self._deadline_ns - self._clock.now_ns()) / 1e9
            if remaining_s > 0:  # renewed since: look again at the new deadline
                self._deadline_due = AsyncIO.call_later(remaining_s, self._on_deadline)
            elif not self._released:
                self._mark_lost(self._deadline_cause(), hand_off=True)

    def _on_renewal_due(self) -> None:
        """On the timer: a renewal is due; it runs on a keepalive thread (sync) or a task (async)."""
        with self._start_lock:
            if not self._stop.is_set():
                self._renew_at_s = time.monotonic()  # the next one is due a third of the TTL after this one
                self._background = [AsyncIO.submit(self._renew_round, name=f"stockade-keepalive-{self.scope}")]

    async def _renew_round(self) -> None:
        """Renew once; then put the next renewal on the timer: a third of the TTL after this one was due (the
        time it waited for a thread and the renewal's own do not add up), or `RENEW_RETRY_MS` later if this
        one failed for backend reasons (until the local deadline, which marks the loss)."""
        now_ns = self._clock.now_ns()
        if self._stop.is_set() or now_ns >= self._deadline_ns:
            return  # released, lost, or past the deadline: the timer's deadline entry marks the loss
        if self._hold_end_ns is not None and now_ns >= self._hold_end_ns:
            return  # max_hold_ms: no more renewals; the deadline marks the loss
        try:
            await self._renew_now(hand_off=True)
            next_s = max(0.0, self._renew_at_s + self.ttl_ms / 3 / 1000 - time.monotonic())
        except LeaseLost:
            return
        except InvariantViolation as exc:
            # A bug, not backend trouble: retrying would only hide it. Nobody can
            # vouch for the lease any more, so it is lost; release() raises the bug.
            self._keepalive_bug = exc
            self._mark_lost(f"bug while renewing: {exc}", hand_off=True)
            return
        except Exception as exc:  # noqa: BLE001 - backend trouble: retry until the local deadline
            log.info("renewal failed, retrying", extra={"scope": self.scope, "error": repr(exc)})
            next_s = min(RENEW_RETRY_MS / 1000, max(0.0, (self._deadline_ns - self._clock.now_ns()) / 1e9))
        with self._start_lock:
            if not self._stop.is_set():
                self._due = AsyncIO.call_later(next_s, self._on_renewal_due)


def _loss_note(lease: AsyncLease) -> str:
    """The note a `lock()` body's own exception carries when the lease was lost while the body ran."""
    return (f"stockade: the lease on {lease.scope!r} (token {lease.token.value}) was lost while the block ran: "
            f"{lease.lost_cause}")

async def _renew_late_grant(lease: AsyncLease) -> bool:
    """Renew a long-polled grant once, at once: its local deadline counts from the request's send time,
    so it may already be near or past; this makes it count from now. True if the renewal failed (the
    keepalive then retries at once); a lease refused or interrupted here is released and the error raised.
    """
    try:
        await lease._renew_now()
    except BackendUnavailable as exc:
        # Granted, and not lost yet: like any failed renewal, the keepalive
        # retries (at once) and the local deadline decides.
        log.info("renewal of a late grant failed, retrying", extra={"scope": lease.scope, "error": repr(exc)})
        return True
    except BaseException:
        await lease.release()
        raise
    return False


class AsyncCoordinator(AsyncHandle):
    """A handle on a coordinator: acquire leases, inspect scopes.

    Create with ``await stockade.connect_async(url)``, or use as ``async with
    stockade.connect_async(url) as coord``.

    Attributes:
        cluster_id: the id every token of this coordinator carries.
        capabilities: what the backend guarantees or accepts
            (`stockade.coordinators.registry.Capability`).
    """

    # A private seam for the tests' control: with False, a lost lease no longer
    # cancels the body of its lock() block (tests/test_lease_loss.py).
    _interrupt_body_on_loss = True

    def __init__(self, port: AsyncCoordinatorPort, *, clock: Clock | None = None, hooks: Hooks | None = None) -> None:
        self._port = port
        self._clock: Clock = clock or SystemClock()
        self._hooks = validate_hooks(hooks)
        self._leases: weakref.WeakSet[AsyncLease] = weakref.WeakSet()  # to stop their keepalives at close

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What the backend guarantees or accepts (a remote server's are complete once the handle is opened)."""
        return self._port.capabilities

    @property
    def cluster_id(self) -> str:
        """The coordinator's cluster id.

        Raises:
            InvalidArgument: not known yet: a remote coordinator opened inside a
                running event loop tells it on the first ``await`` of the handle.
        """
        cluster_id = self._port.cluster_id
        if cluster_id is None:
            raise InvalidArgument("cluster_id", "not known yet: await stockade.connect_async(url) first")
        return cluster_id

    async def _open(self) -> None:
        # Every call opens first: a handle made inside an event loop is opened by
        # its first use if nobody awaited it (the same requests, in the same order).
        await self._port.open()

    async def __aenter__(self) -> AsyncCoordinator:
        await self._open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the handle. A lease it still holds can no longer be renewed: its keepalive
        stops and it is marked lost at once (it stays held on the coordinator until its TTL
        runs out; release it first to free the scope sooner)."""
        for lease in list(self._leases):
            await lease._orphan()
        await self._port.aclose()

    async def acquire(
        self,
        scope: str,
        *,
        ttl_ms: int,
        wait_ms: int | None = 0,
        holder: str | None = None,
        keepalive: bool = True,
        max_hold_ms: int | None = None,
        on_lost: Callable[[Any], None] | None = None,
    ) -> AsyncLease:
        """Acquire ``scope``, waiting up to ``wait_ms`` in FIFO order.

        Args:
            scope: the lock name, 1..200 of ``[A-Za-z0-9._:-]``.
            ttl_ms: lease time to live, 100 ms .. 1 h.
            wait_ms: how long to wait if held, 0 .. 5 min (0: try once); None: until granted, keeping
                the FIFO place, or until cancelled (docs/leases.md, "Waiting until granted").
            holder: name shown in status; defaults to ``host:pid``.
            keepalive: renew in the background at about TTL/3, and watch the local deadline.
            max_hold_ms: stop renewing this long after the grant, 1 .. 7 days
                (None: no bound); the lease is lost then at the latest.
            on_lost: ``on_lost(lease)``, called once when the lease is marked lost:
                sync, on stockade's callback thread when the keepalive or the
                deadline noticed, else on the thread that noticed; async, on the
                loop (docs/leases.md). An exception from it is logged and ignored.

        Returns:
            The `AsyncLease`; ``lease.token`` goes with every write. Release it
            with ``await lease.release()`` (or use `lock`).

        Raises:
            InvalidArgument: a bad argument (checked before any I/O; ``wait_ms="forever"`` too).
            LockTimeout: still held when ``wait_ms`` ran out (never for ``wait_ms=None``).
            LimitExceeded: the scope's queue or the lease table is full.
            LeaseLost: the grant came back so late that the coordinator refused
                its renewal (the lease had lapsed meanwhile); it is released.
            BackendUnavailable: the coordinator failed; outcome unknown.
        """
        validate_scope(scope)
        validate_ttl_ms(ttl_ms)
        if wait_ms is not None:  # `validate_wait`, without its call
            validate_wait_ms(wait_ms)
        if max_hold_ms is not None:
            validate_int("max_hold_ms", max_hold_ms, 1, MAX_HOLD_MS_MAX)
        if on_lost is not None and not callable(on_lost):
            raise InvalidArgument("on_lost", f"must be callable or None, got {type(on_lost).__name__}")
        holder = validate_holder(holder) if holder is not None else default_holder()
        await self._port.open()  # `_open`, without its call
        grant = await self._port.acquire(scope, holder=holder, ttl_ms=ttl_ms, wait_ms=wait_ms)
        lease = AsyncLease(
            self._port, grant, clock=self._clock, max_hold_ms=max_hold_ms, hooks=self._hooks, on_lost=on_lost
        )
        lease._telemetry.granted(lease)
        retry_now = False
        if self._clock.now_ns() - grant.sent_ns > ttl_ms * 1_000_000 // 3:
            retry_now = await _renew_late_grant(lease)
        if keepalive and retry_now:
            lease._start_keepalive(first_wait_s=RENEW_RETRY_MS / 1000)
        elif keepalive:
            lease._schedule_keepalive()
        self._leases.add(lease)
        return lease

    @asynccontextmanager
    async def lock(
        self,
        scope: str,
        *,
        ttl_ms: int,
        wait_ms: int | None = 0,
        holder: str | None = None,
        max_hold_ms: int | None = None,
        on_lost: Callable[[Any], None] | None = None,
    ) -> AsyncIterator[AsyncLease]:
        """``async with coord.lock(scope, ttl_ms=...) as lease:`` — acquire, keep alive, release.

        Inside the block the lease is the context's current lease, so store
        writes to ``scope`` without an explicit ``token=`` carry its token (K1).
        Blocks nest: a write to the scope of an outer block uses the outer
        block's lease, whatever is held inside it.

        When the lease is lost while the block runs (its local deadline passed,
        a renewal was refused, or ``max_hold_ms`` ran out), the async body is
        cancelled at once and the block raises `LeaseLost` (its ``cause`` says
        why), not `CancelledError`. A cancellation
        from outside still propagates as `CancelledError`. The sync body cannot
        be interrupted safely, so it is not: it learns of the loss through
        ``on_lost``, ``lease.lost`` and every write naming the lease, and when
        it ends the block raises `LeaseLost`, so the caller learns that the
        work ran unprotected. A body that raised keeps its own exception, with
        a note saying the lease was lost.

        Args: as for `acquire`.

        Raises:
            LeaseLost: the lease was lost while the body ran (async: the body
                was cancelled; sync: when the body ended), or before it started.
            and what `acquire` raises.
        """
        lease = await self.acquire(
            scope, ttl_ms=ttl_ms, wait_ms=wait_ms, holder=holder, max_hold_ms=max_hold_ms, on_lost=on_lost
        )
        # The blocks open in this context form a stack: each lease links to the
        # one it is nested in, so a write finds the lease of *its* scope, not just
        # the innermost one (`lease_in_context`).
        lease._enclosing = CURRENT_LEASE.get()
        context_token = CURRENT_LEASE.set(lease)
        guard = AsyncIO.body_guard()
        try:
            lease.raise_if_lost()
            if self._interrupt_body_on_loss:
                lease._guard = guard
                guard.arm()
            try:
                yield lease
            except BaseException as exc:
                if guard.disarm(exc):
                    raise LeaseLost(lease.scope, lease.token, lease.lost_cause) from None
                if isinstance(exc, Exception) and lease.lost:
                    exc.add_note(_loss_note(lease))
                raise
            finally:
                guard.disarm(None)
                lease._guard = None
            if lease.lost:  # the body ran to its end without the lease (a sync body is never interrupted)
                raise LeaseLost(lease.scope, lease.token, lease.lost_cause)
        finally:
            CURRENT_LEASE.reset(context_token)
            try:
                await lease.release()
            except StockadeError as exc:
                # The lease expires by TTL anyway; do not hide the block's own error.
                log.warning("release failed", extra={"scope": scope, "error": repr(exc)})

    def locked(
        self,
        scope: str,
        *,
        ttl_ms: int,
        wait_ms: int | None = 0,
        holder: str | None = None,
        max_hold_ms: int | None = None,
        on_lost: Callable[[Any], None] | None = None,
    ) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
        """A decorator: every call of the function runs inside ``async with self.lock(...)``.

        ``@coord.locked("reports", ttl_ms=10_000)`` above ``async def f(...)``;
        the arguments are those of `lock`, checked at each call. Inside, store
        writes to ``scope`` carry the lease's token without ``token=``.
        """

        def decorate(function: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
            @functools.wraps(function)
            async def locked_call(*args: P.args, **kwargs: P.kwargs) -> T:
                async with self.lock(
                    scope, ttl_ms=ttl_ms, wait_ms=wait_ms, holder=holder, max_hold_ms=max_hold_ms, on_lost=on_lost
                ):
                    return await function(*args, **kwargs)

            return locked_call

        return decorate

    async def elect(
        self, name: str, *, ttl_ms: int, wait_ms: int | None = 0, identity: str | None = None,
        max_hold_ms: int | None = None, on_lost: Callable[[Any], None] | None = None,
    ) -> AsyncLeadership:
        """Become the leader of ``name``: wait in FIFO order up to ``wait_ms``, publish ``identity``
        (default ``host:pid``) with the lease; arguments and errors as `acquire` (docs/election.md)."""
        lease = await self.acquire(
            name, ttl_ms=ttl_ms, wait_ms=wait_ms, holder=identity, max_hold_ms=max_hold_ms, on_lost=on_lost
        )
        return AsyncLeadership(name, lease)

    async def leader(self, name: str) -> LeaderInfo | None:
        """Who leads ``name`` now (identity and term), or None."""
        return leader_of(await self.inspect(name))

    async def watch_leader(
        self, name: str, *, since: LeaderInfo | None, timeout_ms: int, poll_ms: int = POLL_MS_DEFAULT
    ) -> LeaderInfo | None:
        """Wait, at most ``timeout_ms``, until the leader of ``name`` is another than ``since``;
        returns the leader then (polls `inspect` every ``poll_ms``)."""
        validate_scope(name)
        return await watch_leader(self.inspect, name, since=since, timeout_ms=timeout_ms, poll_ms=poll_ms)

    def verify_keys(self) -> object:
        """What a fenced store of this coordinator verifies token MACs with (docs/tokens.md).

        Embedded: its keyring (a `stockade.keys.KeyFile` following the file; ``memory://``: in-process keys);
        etcd, ZooKeeper, PostgreSQL: the keyring the backend keeps; ``stockade serve``: a copy fetched in
        one blocking round trip from its administrators' route (a bearer token without scope patterns, else
        `Unauthorized`). Pass it as ``keys=coord.verify_keys()`` to a store or a fence. It can sign as well
        as verify: whoever holds it is trusted like the coordinator.
        """
        return self._port.keys

    async def inspect(self, scope: str) -> core_leases.ScopeInfo:
        """The scope's state: holder, current token (without its MAC: not a write capability),
        last issued token, remaining TTL, waiters."""
        validate_scope(scope)
        await self._open()
        return await self._port.inspect(scope)

    async def scopes(self, *, after: str = "", limit: int = LIST_PAGE_MAX) -> list[core_leases.ScopeInfo]:
        """Known scopes in name order, a page at a time."""
        validate_int("limit", limit, 1, LIST_PAGE_MAX)
        await self._open()
        return await self._port.scopes(after=after, limit=limit)

    async def contenders(self, scope: str, *, limit: int = CONTENDERS_MAX) -> list[core_leases.Contender]:
        """Who holds ``scope`` and who waits for it, in the order they will be served: the holder first
        (``holding=True``; none while the scope is free or in its lock-delay), then the waiters, first
        queued first (C4), at most ``limit`` (1..`CONTENDERS_MAX`, a holder and a full queue). Each is a
        `Contender` with its holder name only: lease ids and tokens are secrets (docs/leases.md).

        For an election (`elect`) these are the leader and the candidates in line; for a semaphore, see
        `AsyncSemaphore.contenders`. A snapshot: the line may move as soon as it is read.

        Raises:
            InvalidArgument: a bad scope or limit.
        """
        validate_scope(scope)
        validate_int("limit", limit, 1, CONTENDERS_MAX)
        await self._open()
        return await self._port.contenders(scope, limit=limit)

    async def last_issued(self, scope: str) -> int:
        """The greatest token value issued for ``scope`` so far (0 if none).

        This is the scope's fence floor: after restoring a resource from a
        backup, raise its high-water mark to at least this (R4).
        """
        validate_scope(scope)
        await self._open()
        return await self._port.last_issued(scope)

    async def fence_floors(self) -> FenceFloors:
        """The fence floor of every scope, in one value a store's restore takes (R4).

        ``floors`` maps each scope the coordinator holds to its last issued
        token; ``default`` covers every other scope (never used, or forgotten
        by the coordinator): it is at least every token such a scope was
        issued. Pass it as ``restore(..., fence_floors=coord.fence_floors())``.
        """
        await self._open()
        return await self._port.fence_floors()

    async def history(self, scope: str, *, limit: int = HISTORY_PER_SCOPE) -> list[HistoryEvent]:
        """The scope's last ``limit`` (1..100) lease events, oldest first: grants, expiries, releases.

        Each was journaled in the same commit as the change it records (docs/history.md).

        Raises:
            InvalidArgument: a bad scope or limit, or a backend whose port keeps no history.
        """
        validate_scope(scope)
        validate_int("limit", limit, 1, HISTORY_PER_SCOPE)
        await self._open()
        return await self._port.history(scope, limit=limit)
