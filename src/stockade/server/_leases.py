"""The coordinator behind ``stockade serve``: the lease engine in memory, durable through group commit.

The server is the only user of its coordinator file, so it loads every scope's
record once into `MemoryRecords` and runs the one lease engine
(`stockade.core.engine.LeaseEngine`) on them. Every committed change of a
record is handed to the group committer as an ``(old, new)`` pair (waiters
stripped: they live only as long as their HTTP requests) and committed in
order, in batches, each appended to the file's record log with one write and
one ``fdatasync`` (`stockade.coordinators.sqlite._log`; folded into the file
every few thousand changes); a grant or renewal is answered only once its
change is durable (C1).

A release is answered as soon as the engine has applied it (and offered the
scope to the head of its queue): its change is deferred (`GroupCommitter.defer`)
and commits with the next change that is waited for, or ``release_lag_ms``
later. A crash in between loses the release, and the restart holds that lease
a full TTL (C3), as any lease held at a crash; no token goes back, since a
grant's commit takes every release before it along (docs/rules.md, C3).
``release_lag_ms`` 0 answers a release only once it is durable, as a grant.

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
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from stockade.coordinators._mint import LeaseIds
from stockade.coordinators.journal import HistoryEvent
from stockade.coordinators.memory import Change, MemoryRecords
from stockade.coordinators.sqlite import SQLiteCoordinator
from stockade.core.clock import Clock
from stockade.core.engine import LeaseEngine
from stockade.core.errors import BackendUnavailable, LockTimeout, NotHolder, StockadeError
from stockade.core.leases import (
    AcquireRequest,
    Contender,
    Granted,
    Lease,
    LeasePolicy,
    ScopeInfo,
    ScopeRecord,
    TimedOut,
    describe,
    lease_hint,
    validate_lease_id,
)
from stockade.core.limits import LIST_PAGE_MAX, RELEASE_LAG_MS, wait_deadline_ns
from stockade.core.values import FenceFloors
from stockade.server import _metrics
from stockade.server._groupcommit import GroupCommitter

__all__ = ["LeaseService", "SCOPES_MAX", "validate_lease_id"]

# Scopes the server keeps in memory. At the cap, an acquire of a new scope first forgets
# the least recently changed idle scopes (no lease, no waiter, no lock-delay pending; up
# to `stockade.core.engine.FORGET_BATCH` of them), folding their last tokens into the
# coordinator's forgotten floor; only when none is idle does it get 429.
SCOPES_MAX = 100_000
_NS_PER_MS = 1_000_000
_NS_PER_S = 1_000_000_000
_WAKE_SLACK_S = 0.0005  # timers fire a little late rather than a little early

_log = logging.getLogger("stockade.server")


def _durable(record: ScopeRecord) -> ScopeRecord:
    return replace(record, waiters=()) if record.waiters else record


@dataclass(slots=True)
class _Waiter:
    attempt: dict[str, Any]  # the keyword arguments of its `LeaseEngine.try_acquire`
    future: asyncio.Future[tuple[Lease, asyncio.Future[Any] | None]]


class LeaseService:
    """The lease engine on in-memory records over a `SQLiteCoordinator` file, with FIFO long-poll waits.

    Args:
        coordinator: the coordinator file (written only by ``committer``'s thread after `load`).
        clock: the coordinator's monotonic clock.
        loop: the event loop everything here runs on.
        scopes_max: bound on the scopes kept in memory.
        release_lag_ms: a release is answered before its commit, which comes at most this long after it (with
            the next commit that is waited for, if one comes sooner); 0: a release is answered once durable.
    """

    def __init__(self, coordinator: SQLiteCoordinator, clock: Clock, loop: asyncio.AbstractEventLoop,
                 *, scopes_max: int = SCOPES_MAX, release_lag_ms: int = RELEASE_LAG_MS) -> None:
        self.file = coordinator.records
        self.cluster_id = coordinator.cluster_id
        self.policy: LeasePolicy = coordinator.policy
        self.clock = clock
        self.loop = loop
        self.scopes_max = scopes_max
        # The file's record log: a batch of changes is durable once appended there (one write, one fdatasync),
        # and folded into the file later (`stockade.coordinators.sqlite._log`).
        self.log = self.file.open_log()
        # A batch that folds the log (about 1 ms every 256 changes) folds where it commits, on the loop as a rule:
        # handed to the committer's thread, the batches after it would stay there under load, at more CPU a batch.
        self.committer: GroupCommitter[Change] = GroupCommitter("coordinator", self.log.commit_records, loop,
                                                                lag_ms=release_lag_ms)
        self.release_lag_ms = release_lag_ms
        # `committer.submit`, or `committer.defer` while a release applies: how `_on_commit` queues a change.
        self._queue_change = self.committer.submit
        self.table = MemoryRecords(scopes_max=scopes_max, on_commit=self._on_commit, journal=False)
        self.signer = coordinator.signer
        self.engine = LeaseEngine(self.table, cluster_id=self.cluster_id, clock=clock, policy=self.policy,
                                  signer=self.signer)
        self.waiters: dict[str, _Waiter] = {}
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self._write: asyncio.Future[Any] | None = None  # the last change handed to the committer
        self._loading: list[Change] | None = None
        self._new_lease_id = LeaseIds()
        self.dense_tokens = True  # the engine's grants: the scope's previous token + 1

    # -- views for the dashboard --------------------------------------------------------------

    @property
    def records(self) -> Mapping[str, ScopeRecord]:
        return self.table.records

    @property
    def names(self) -> Sequence[str]:
        return self.table.names

    @property
    def leases(self) -> int:
        return self.table.lease_count

    # -- lifecycle ---------------------------------------------------------------------------

    def load(self) -> None:
        """Load the table and apply the restart rule (`stockade.core.leases.recover`, same clock).

        Runs before the committer starts, on the caller's thread; what the rule
        changes (held leases get a full TTL from now, C3; stored waiters go) is
        committed in one transaction before anything is answered.
        """
        epoch_floor, forgotten_floor = self.file.token_floor_now()
        self.table = MemoryRecords(self.file.records(), scopes_max=self.scopes_max, on_commit=self._on_commit,
                                   epoch_floor=epoch_floor, forgotten_floor=forgotten_floor,
                                   wall_ns=time.time_ns if self.file.epochs else None,
                                   journal=False)  # the file journals what it commits; history is read there
        self.engine = LeaseEngine(self.table, cluster_id=self.cluster_id, clock=self.clock, policy=self.policy,
                                  signer=self.signer)
        self._loading = []
        try:
            self.engine.recover(same_clock=True)
            changes, self._loading = self._loading, None
        finally:
            self._loading = None
        if changes:
            for error in self.file.commit_records(changes):
                if error is not None:
                    raise error
        self.committer.start()

    def close(self) -> None:
        """Commit what is queued (deferred releases too), stop the committer and fold the record log into the
        file; on the loop's thread."""
        self._end_timers()
        self.committer.commit_gathered()
        self.committer.stop()
        self.log.close()

    async def aclose(self) -> None:
        self._end_timers()
        self.committer.commit_gathered()  # on the loop; the thread commits it before it stops
        await self.loop.run_in_executor(None, self.committer.stop)
        await self.loop.run_in_executor(None, self.log.close)

    def _end_timers(self) -> None:
        for timer in self.timers.values():
            timer.cancel()

    async def prepare_store(self, store: object) -> None:
        """Nothing: the store beside this coordinator's file is raised by ``stockade floor`` after a restore."""

    # -- durability --------------------------------------------------------------------------

    def _on_commit(self, changes: Sequence[Change]) -> None:
        """Every committed change of the in-memory table: count expiries, queue the durable part."""
        if self._loading is not None:
            self._loading.extend(changes)  # stored waiters are removed on disk too
            return
        submit = self._queue_change
        for old, new in changes:
            if new is None:  # an idle scope forgotten at the scope cap: the file forgets it too
                self._write = submit((_durable(old), None))
                continue
            old_lease = old.lease
            # (The clock is read only for a lease that ended: not for a grant.)
            if old_lease is not None and (new.lease is None or new.lease.lease_id != old_lease.lease_id) \
                    and self.clock.now_ns() >= old_lease.expires_ns:
                _metrics.EXPIRIES.inc()
                _log.debug("lease %s… on %r expired", lease_hint(old_lease.lease_id), new.scope,
                           extra={"scope": new.scope, "lease": lease_hint(old_lease.lease_id),
                                  "token_value": old_lease.token.value})
            if not old.waiters and not new.waiters:
                # The usual change: durable as it is, and a change (the table hands over only what changed).
                self._write = submit((old, new))
                continue
            durable_old, durable_new = _durable(old), _durable(new)
            if durable_old != durable_new:
                self._write = submit((durable_old, durable_new))

    def _take_write(self) -> asyncio.Future[Any] | None:
        """The durability of what the last engine call changed (None: nothing durable changed)."""
        write, self._write = self._write, None
        return write

    @staticmethod
    def durable(write: asyncio.Future[Any] | None) -> asyncio.Future[Any] | None:
        """What an answer waits for before it goes out: ``write``, the committer's future of the change
        (None: nothing to wait for). Its result is the change's error, or None; never cancel it (a handler
        waits through `GroupCommitter.reply` or `GroupCommitter.listen`).

        The seam the fault tests' ack-before-commit control replaces.
        """
        return write

    @staticmethod
    def check_durable(done: Any) -> None:
        """Raise what made ``done`` (a future from `durable`, done) fail: the change's `StockadeError`, or the
        batch's error."""
        if done is not None and isinstance(error := done.result(), StockadeError):
            raise error

    async def _wait_durable(self, write: asyncio.Future[Any] | None) -> None:
        await self._settled(self.durable(write))

    async def _settled(self, durable: asyncio.Future[Any] | None) -> None:
        """Wait until ``durable`` (from `durable`) is done; raise what made it fail."""
        if durable is not None:
            reply = self.committer.reply(durable)
            await reply  # cancelled by a disconnect: the write goes on
            self.check_durable(reply)

    # -- acquire -----------------------------------------------------------------------------

    async def acquire(self, scope: str, *, holder: str, ttl_ms: int, wait_ms: int | None) -> Lease:
        """Grant ``scope`` (durably) or raise `LockTimeout` at the deadline (None: none; a cancellation
        ends such a wait, as a disconnect does).

        Raises:
            InvalidArgument, LimitExceeded: nothing changed.
            LockTimeout: still held (or others ahead in the queue) at the deadline.
            BackendUnavailable: the grant could not be made durable (it was withdrawn).
        """
        now_ns = self.clock.now_ns()
        deadline_ns = wait_deadline_ns(now_ns, wait_ms)
        # The client's open connection is the waiter's liveness, not polling: it
        # counts as alive until its deadline.
        attempt: dict[str, Any] = {"lease_id": self._new_lease_id(), "holder": holder, "ttl_ms": ttl_ms,
                                   "wait_deadline_ns": deadline_ns, "live_until_ns": deadline_ns}
        outcome, write = self._try(scope, attempt, wait_ms)
        if isinstance(outcome, Granted):
            return await self._deliver(outcome.lease, write)
        return await self._wait(scope, attempt, now_ns, wait_ms)

    def acquire_now(self, scope: str, *, holder: str, ttl_ms: int) -> tuple[Lease, asyncio.Future[Any] | None]:
        """`acquire` with no wait, without a coroutine: the grant and the future of its durability (`durable`).

        The caller answers only once that future is done, through `delivered` (C1).

        ``scope``, ``holder`` and ``ttl_ms`` come validated by the app's input parsing, with the core's
        validators: the engine takes them through its trusted entry (`AcquireRequest.prevalidated`), with a
        lease id minted here and deadlines read from the clock.

        Raises:
            LimitExceeded: nothing changed.
            LockTimeout: held by another.
        """
        now_ns = self.clock.now_ns()
        lease_id = self._new_lease_id()
        self._write = None
        try:
            outcome = self.engine.try_acquire_request(
                AcquireRequest.prevalidated(self.cluster_id, scope, lease_id, holder, ttl_ms, now_ns, now_ns))
        finally:
            write, self._write = self._write, None  # `_take_write`, written out
        if type(outcome) is Granted:
            _metrics.GRANTS.inc()
            return outcome.lease, self.durable(write)
        if type(outcome) is not TimedOut:  # not queued with no wait; if it were, leave the queue at once
            self._leave_queue(scope, lease_id)
        _metrics.LOCK_TIMEOUTS.inc()
        raise LockTimeout(scope, 0)

    def _try(self, scope: str, attempt: dict[str, Any], wait_ms: int | None) -> tuple[Any, asyncio.Future[Any] | None]:
        """One attempt: the engine's outcome (a grant counted) and the future of what it changed."""
        self._write = None
        try:
            outcome = self.engine.try_acquire(scope, **attempt)
        finally:
            write = self._take_write()
        if isinstance(outcome, Granted):
            _metrics.GRANTS.inc()
        elif isinstance(outcome, TimedOut):
            _metrics.LOCK_TIMEOUTS.inc()
            raise LockTimeout(scope, wait_ms or 0)
        return outcome, write

    def delivered(self, lease: Lease, done: Any) -> Lease:
        """`_deliver`'s outcome once the grant's durability (``done``, from `durable`) is settled.

        Raises:
            CancelledError: the client went away (``done`` says cancelled): the grant is withdrawn.
            BackendUnavailable: the grant could not be made durable: it is withdrawn.
        """
        try:
            if done is not None:
                if done.cancelled():
                    raise asyncio.CancelledError
                if done.result() is not None:  # `check_durable` past its usual None (no error)
                    self.check_durable(done)
        except (asyncio.CancelledError, StockadeError) as exc:
            raise self._withdrawn(lease, exc) from None
        return lease

    def _withdrawn(self, lease: Lease, exc: BaseException) -> BaseException:
        """What a grant that did not become durable raises once it is withdrawn: a cancellation as it came,
        anything else as `BackendUnavailable`."""
        self._release_quietly(lease.lease_id)
        if isinstance(exc, asyncio.CancelledError):
            return exc
        return BackendUnavailable("the grant could not be made durable; it was withdrawn")

    async def _wait(self, scope: str, attempt: dict[str, Any], now_ns: int, wait_ms: int | None) -> Lease:
        lease_id = attempt["lease_id"]
        future: asyncio.Future[tuple[Lease, asyncio.Future[Any] | None]] = self.loop.create_future()
        self.waiters[lease_id] = _Waiter(attempt, future)
        _metrics.WAITS.inc()
        self._schedule(scope, now_ns)
        started_ns = now_ns
        try:
            done, _ = await asyncio.wait((future,), timeout=None if wait_ms is None else wait_ms / 1000)
        except asyncio.CancelledError:
            # The client went away. Leave the queue; release a grant that raced the disconnect.
            self._abandon(scope, lease_id, future)
            raise
        finally:
            self.waiters.pop(lease_id, None)
            _metrics.WAIT_SECONDS.observe((self.clock.now_ns() - started_ns) / _NS_PER_S)
        if not done:
            self._leave_queue(scope, lease_id)
            _metrics.LOCK_TIMEOUTS.inc()
            raise LockTimeout(scope, wait_ms or 0)
        lease, write = future.result()
        return await self._deliver(lease, write)

    async def _deliver(self, lease: Lease, write: asyncio.Future[Any] | None) -> Lease:
        """Answer a grant only once it is durable; withdraw it if that fails or the client is gone."""
        try:
            await self._wait_durable(write)  # the seam the fault tests' ack-before-commit control replaces
        except (asyncio.CancelledError, StockadeError) as exc:
            raise self._withdrawn(lease, exc) from None
        return lease

    def _abandon(self, scope: str, lease_id: str, future: asyncio.Future[Any]) -> None:
        if future.done() and not future.cancelled():
            self._release_quietly(lease_id)
        else:
            future.cancel()
            self._leave_queue(scope, lease_id)

    def _leave_queue(self, scope: str, lease_id: str) -> None:
        if self.table.peek(scope) is None:
            return
        self.engine.cancel_wait(scope, lease_id)
        self._take_write()
        self._pump(scope)

    def _release_quietly(self, lease_id: str) -> None:
        scope = self.table.scope_of_lease(lease_id)
        if scope is None:
            return
        self.engine.release(lease_id)
        self._take_write()
        self._pump(scope)

    # -- waking the head of a queue (C4) -----------------------------------------------------

    def _schedule(self, scope: str, now_ns: int) -> None:
        """Wake the scope's queue when its lease expires or its lock-delay ends."""
        record = self.table.peek(scope)
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
        """Offer the scope to the head of its queue (the engine grants it if it is free now); else wake later."""
        while (record := self.table.peek(scope)) is not None and record.waiters:
            head = record.waiters[0]
            waiter = self.waiters.get(head.lease_id)
            if waiter is None or waiter.future.done():
                self.engine.cancel_wait(scope, head.lease_id)
                continue
            outcome = self.engine.try_acquire(scope, **waiter.attempt)
            if isinstance(outcome, Granted):
                _metrics.GRANTS.inc()
                waiter.future.set_result((outcome.lease, self._take_write()))
            elif isinstance(outcome, TimedOut):
                continue  # its own deadline passed: the next in line may go
            break
        self._take_write()
        self._schedule(scope, self.clock.now_ns())

    # -- renew, release ----------------------------------------------------------------------

    async def renew(self, lease_id: str) -> Lease:
        """Extend a held lease by its TTL from now (durably).

        Raises:
            NotHolder: the lease expired, was released, or never existed.
        """
        scope = self.table.scope_of_lease(lease_id)
        if scope is None:
            raise NotHolder(lease_hint(lease_id), "lease expired, was released, or never existed")
        try:
            lease = self.engine.renew(lease_id)
        except NotHolder:
            self._take_write()
            self._pump(scope)  # the expiry it found may let the next waiter in
            raise
        write = self._take_write()
        _metrics.RENEWALS.inc()
        await self._wait_durable(write)
        return lease

    async def release(self, lease_id: str) -> bool:
        """Release a lease (durably only with ``release_lag_ms`` 0; see `release_now`). Idempotent: False when
        it was already gone."""
        released, durable = self.release_now(lease_id)
        await self._settled(durable)
        return released

    def release_now(self, lease_id: str) -> tuple[bool, asyncio.Future[Any] | None]:
        """`release` without a coroutine: whether it was held, and what its answer waits for: None (its change
        is deferred: it commits with the next grant or renewal, or ``release_lag_ms`` from now; a crash before
        then leaves the lease held a full TTL from the restart, C3), or with ``release_lag_ms`` 0 the future of
        its durability (`durable`): the caller answers once it is done and `check_durable` passes."""
        scope = self.table.scope_of_lease(lease_id)
        if scope is None:
            return False, None
        if self.release_lag_ms:
            self._queue_change = self.committer.defer
            try:
                outcome = self.engine.release(lease_id)
            finally:
                self._queue_change = self.committer.submit
            self._write = None
            record = self.table.peek(scope)
            if record is not None and record.waiters:  # else `_pump` has nobody to offer the scope to
                self._pump(scope)  # the next waiter's grant is submitted: the release commits with it, first
            return outcome.released, None
        outcome = self.engine.release(lease_id)
        write = self._take_write()
        self._pump(scope)
        return outcome.released, self.durable(write)

    # -- reads -------------------------------------------------------------------------------

    async def inspect_barrier(self) -> None:
        """Wait until what a read just saw is durable (nothing is answered that a crash could take back)."""
        await self._barrier()

    async def overview(self, limit: int) -> tuple[Sequence[ScopeInfo], int]:
        """The first ``limit`` scopes from the table in memory (no file, no wait), and how many there are."""
        now_ns = self.clock.now_ns()
        names = self.table.names
        return [describe(self.table.records[name], now_ns, self.policy) for name in names[:limit]], len(names)

    async def fence_floors(self) -> FenceFloors:
        floors = self.engine.fence_floors()
        await self._barrier()
        return floors

    async def last_issued(self, scope: str, at_least: int = 0) -> int:
        """The last issued token of ``scope`` (in memory: ``at_least`` changes nothing here)."""
        return self.engine.last_issued(scope)

    async def inspect(self, scope: str) -> ScopeInfo:
        info = self.engine.inspect(scope)
        await self._barrier()
        return info

    async def list(self, *, after: str, limit: int = LIST_PAGE_MAX) -> tuple[Sequence[ScopeInfo], str | None]:
        infos = self.engine.scopes(after=after, limit=limit)
        names = self.table.names
        more = bool(infos) and names[-1] != infos[-1].scope
        await self._barrier()
        return infos, (infos[-1].scope if more else None)

    async def contenders(self, scope: str, limit: int) -> Sequence[Contender]:
        """The holder and the waiters of ``scope`` in serving order, as the lease table has them (C4),
        answered once what was read is durable."""
        line = self.engine.contenders(scope, limit=limit)
        await self._barrier()
        return line

    async def history(self, scope: str, limit: int) -> Sequence[HistoryEvent]:
        """The scope's last events as the coordinator file holds them: what has committed (docs/history.md), the
        record log folded into the file first."""
        await self._barrier()
        return await self.loop.run_in_executor(None, self._folded_history, scope, limit)

    def _folded_history(self, scope: str, limit: int) -> Sequence[HistoryEvent]:
        self.log.fold_now()
        return self.file.history(scope, limit)

    async def _barrier(self) -> None:
        last = self.committer.barrier()
        if last is not None:
            await asyncio.shield(last)
