"""The lease engine: the rules of `stockade.core.leases` over a record store.

Every coordinator in stockade is this one engine with a different record
store underneath: the embedded SQLite file (`stockade.coordinators.sqlite`),
memory (`stockade.coordinators.memory`; the server keeps its table there and
makes it durable by group commit, the simulator runs it under faults). Each
operation is the same four steps, written once, here:

    open a write unit → load the scope's record → apply the pure rule → save (old, new) → commit

The engine does no I/O of its own: time comes from the `Clock` it is given,
and everything durable goes through the `RecordStore`, whose write unit must
be atomic (all of its saves commit, or none) and durable at commit (C1: a
token is durable before the engine returns it). A rule that refuses raises
inside the unit, so nothing of that operation is saved.

The record store port is shaped like raft's ``Storage``: the engine loads what
it needs, decides, and hands back the changes; the store never decides.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import Protocol

from stockade.core import leases as rules
from stockade.core.clock import Clock
from stockade.core.errors import InvalidArgument, LimitExceeded, NotHolder
from stockade.core.leases import (
    AcquireRequest,
    Contender,
    Granted,
    Lease,
    LeasePolicy,
    Queued,
    Released,
    ScopeInfo,
    ScopeRecord,
    TimedOut,
    lease_hint,
)
from stockade.core.limits import CONTENDERS_MAX, LEASES_MAX, LIST_PAGE_MAX, validate_int, validate_scope
from stockade.core.signing import TokenSigner
from stockade.core.tokens import counter_exhausted, epoch_floor, epoch_of, grant_base, validate_cluster_id
from stockade.core.values import FenceFloors

__all__ = ["RecordTx", "RecordStore", "LeaseEngine", "Outcome", "recover_records", "is_idle"]

Outcome = Granted | Queued | TimedOut

_RECOVER_PAGE = 1_000
#: Idle scopes one acquire on a full store forgets at most (the oldest first).
FORGET_BATCH = 64
_FORGET_SCAN = 4  # candidates looked at per scope to forget


def _lease_id_arg(lease_id: object) -> str:
    # Any string may be asked about: an unknown or malformed id is simply not held. (Called for what is not
    # exactly a str: the usual lease id is taken as it is, without the call.)
    if not isinstance(lease_id, str):
        raise InvalidArgument("lease_id", f"must be a string, got {type(lease_id).__name__}")
    return lease_id


class RecordTx(Protocol):
    """One unit of work on the stored records (see `RecordStore`)."""

    def load(self, scope: str) -> ScopeRecord:
        """The scope's record; a scope never seen reads as ``ScopeRecord(scope)``.

        The engine reads its clock before it loads the records it decides on: a
        store may record renewals outside its write units (the embedded one
        does), and a load that comes after the clock reading sees every renewal
        that could count by then.
        """
        ...

    def scope_of_lease(self, lease_id: str) -> str | None:
        """The scope whose stored lease has this id, or None."""
        ...

    def leases_at_least(self, n: int) -> bool:
        """Whether at least ``n`` leases are stored (expired ones that were not settled included).

        A question, not a count: a backend answers it without counting a table
        that cannot hold ``n`` rows.
        """
        ...

    def lapsed_scopes(self, now_ns: int) -> list[str]:
        """Scopes whose stored lease expired by ``now_ns``."""
        ...

    def names(self, *, after: str, limit: int) -> list[str]:
        """Stored scope names in order, after ``after``, at most ``limit``."""
        ...

    def save(self, old: ScopeRecord, new: ScopeRecord) -> None:
        """Replace ``old`` (what this unit loaded or last saved) by ``new``.

        A store may refuse (raise) when what it holds is not ``old``: someone
        else wrote it, and a token could repeat (C1).
        """
        ...

    def token_floor(self) -> int:
        """The store-wide floor: every grant's token is above it, whatever its scope's record says.

        It covers the store's current epoch (`stockade.core.tokens`) and every
        scope the store has forgotten (`forgotten_floor`). 0 for a store with neither.
        """
        ...

    def new_epoch(self, after: int) -> int | None:
        """Start an epoch above ``after`` for a scope whose counter ran out, durably with this unit.

        None when the store composes no epochs into its tokens.
        """
        ...

    def forgotten_floor(self) -> int:
        """The greatest last token of every scope this store has forgotten (0: none)."""
        ...

    def forget(self, record: ScopeRecord) -> None:
        """Drop an idle scope's record, raising `forgotten_floor` to its last token in the same unit."""
        ...

    def oldest(self, limit: int) -> list[str]:
        """At most ``limit`` stored scope names, least recently changed first (candidates to forget)."""
        ...

    def full(self) -> bool:
        """True when storing one more scope would pass the store's bound on scopes."""
        ...


class RecordStore(Protocol):
    """Where a coordinator keeps its scope records (the durable half of a coordinator)."""

    def write(self) -> AbstractContextManager[RecordTx]:
        """A unit whose saves all commit, durably, when the block ends without an error.

        An exception inside the block discards every save of the unit.
        """
        ...

    def read(self) -> AbstractContextManager[RecordTx]:
        """A unit for reading a consistent view; saving in it is a bug."""
        ...

    def close(self) -> None:
        """Release files, connections and locks (a store that holds none does nothing)."""
        ...


def is_idle(record: ScopeRecord, now_ns: int) -> bool:
    """Whether a (settled) scope may be forgotten: no lease, no waiter, no lock-delay pending at ``now_ns``."""
    return record.lease is None and not record.waiters and record.delay_until_ns <= now_ns


def recover_records(tx: RecordTx, now_ns: int, policy: LeasePolicy, *, same_clock: bool) -> int:
    """Apply the restart rule to every record in ``tx``; returns how many changed.

    For a store that must apply it inside a unit of its own (the SQLite file
    does it in the transaction that notices the reboot, so that exactly one
    opener applies it); everyone else calls `LeaseEngine.recover`.
    """
    changed = 0
    after = ""
    while names := tx.names(after=after, limit=_RECOVER_PAGE):
        for name in names:
            record = tx.load(name)
            new = rules.recover(record, now_ns, policy, same_clock=same_clock)
            if new is not record:
                tx.save(record, new)
                changed += 1
        after = names[-1]
    return changed


class LeaseEngine:
    """A coordinator: the core lease rules applied to a record store.

    Non-blocking: every method answers at once (bounded by the record store).
    Waiting for a busy scope is the caller's loop (the embedded client polls,
    the server parks a long poll and calls `try_acquire` again when the head of
    the queue may go).

    Args:
        records: where the records live.
        cluster_id: the id every token of this coordinator carries.
        clock: the coordinator's monotonic clock; the only judge of expiry (C3).
        policy: lock-delay and queue settings.
        leases_max: bound on stored leases; a grant beyond it raises `LimitExceeded`.
        forget_batch: how many idle scopes one acquire forgets, at most, when
            the store is full (see `forget_idle`).
        signer: signs every token this engine hands out (`stockade.core.signing`);
            None: tokens go out unsigned (only a store opened without keys takes them).

    Signing: the records keep token values only; a grant's and a renewal's
    lease carry the signed token, while `inspect` and `scopes` show the
    holder's token without its MAC (a read never returns a write capability).

    Forgetting: a store that bounds its scopes (the server's table) is never
    full for good. When an acquire finds it full, the engine first forgets up to
    ``forget_batch`` idle scopes (no lease, no waiter, no lock-delay pending),
    least recently changed first, in the acquire's own unit. The store folds
    each forgotten scope's last token into its floor, which every later grant,
    of any scope, counts above: a token never goes down.
    """

    def __init__(
        self,
        records: RecordStore,
        *,
        cluster_id: str,
        clock: Clock,
        policy: LeasePolicy | None = None,
        leases_max: int = LEASES_MAX,
        forget_batch: int = FORGET_BATCH,
        signer: TokenSigner | None = None,
    ) -> None:
        validate_cluster_id(cluster_id, "cluster_id")  # once: every request of this engine names it
        validate_int("leases_max", leases_max, 1, LEASES_MAX)
        validate_int("forget_batch", forget_batch, 1, LIST_PAGE_MAX)
        self.forget_batch = forget_batch
        self.records = records
        self.cluster_id = cluster_id
        self.clock = clock
        self.policy = policy or LeasePolicy()
        self.leases_max = leases_max
        self.signer = signer

    #: Signs the tokens handed out; set by whoever opens the coordinator with its keys.
    signer: TokenSigner | None = None

    def _signed(self, lease: Lease) -> Lease:
        if self.signer is None:
            return lease
        # Built directly: `dataclasses.replace` costs more than the rest of a grant's Python work here.
        return Lease(lease.lease_id, lease.holder, self.signer.sign(lease.token), lease.ttl_ms, lease.granted_ns,
                     lease.expires_ns)

    #: The grant rule; a seam for the controls of the test suite (a barging or
    #: overlapping rule must be caught), never changed in production.
    acquire_rule = staticmethod(rules.acquire)

    def close(self) -> None:
        """Release what the record store holds (files, locks)."""
        self.records.close()

    def within(self, until_ns: int) -> AbstractContextManager[None]:
        """Units begun in this thread inside the block wait for their store at most until ``until_ns``.

        ``until_ns`` is on this engine's clock. A store that never waits for
        another party (memory) ignores it; one that does (a file shared with
        other processes, whose write lock a frozen process may hold) gives up
        at ``until_ns`` with `BackendUnavailable`, so that a caller's own
        deadline (an acquire's wait) holds whatever the others are doing.
        """
        return nullcontext()

    # -- writes ------------------------------------------------------------------------------

    def try_acquire(
        self,
        scope: str,
        *,
        lease_id: str,
        holder: str,
        ttl_ms: int,
        wait_deadline_ns: int,
        live_until_ns: int | None = None,
    ) -> Outcome:
        """One non-blocking acquire attempt; call again with the same ``lease_id`` to keep waiting.

        Args:
            live_until_ns: how long a queued attempt counts as alive without
                being repeated (None: the policy's ``waiter_stale_ms`` from now;
                a server that holds the request open passes its wait deadline).

        Returns:
            `Granted` (durable before return), `Queued` (position in the FIFO
            queue), or `TimedOut` (``wait_deadline_ns`` passed; dequeued).

        Raises:
            InvalidArgument: bad scope, holder, ttl or lease id. Nothing changed.
            LimitExceeded: the queue or the lease table is full. Nothing changed.
        """
        return self.try_acquire_request(AcquireRequest(  # checks every value (`AcquireRequest`)
            cluster=self.cluster_id, scope=scope, lease_id=lease_id, holder=holder, ttl_ms=ttl_ms,
            wait_deadline_ns=wait_deadline_ns, live_until_ns=live_until_ns,
        ))

    def try_acquire_request(self, request: AcquireRequest) -> Outcome:
        """`try_acquire` of a request already built: checked by its constructor, or built by
        `AcquireRequest.prevalidated` for a caller that validated its values at its own boundary
        (``stockade serve``'s acquire), which is the one way to skip the checks.

        Raises:
            InvalidArgument: the request names another cluster than this engine's. Nothing changed.
            LimitExceeded: as `try_acquire`.
        """
        if request.cluster != self.cluster_id:
            raise InvalidArgument("cluster", "is not this coordinator's")
        scope = request.scope
        with self.records.write() as tx:
            now_ns = self.clock.now_ns()
            record = tx.load(scope)
            if tx.full() and record == ScopeRecord(scope):  # only a scope not stored needs room
                self._forget_idle(tx, now_ns, self.forget_batch)
                record = tx.load(scope)
            new, outcome = self._acquire(tx, record, request, now_ns)
            if type(outcome) is Granted and record.lease is None and tx.leases_at_least(self.leases_max):
                for lapsed in tx.lapsed_scopes(now_ns):  # settle lapsed leases so they stop counting
                    old = tx.load(lapsed)
                    tx.save(old, rules.settle(old, now_ns, self.policy))
                if tx.leases_at_least(self.leases_max):
                    raise LimitExceeded("LEASES_MAX", self.leases_max)
                record = tx.load(scope)
                new, outcome = self._acquire(tx, record, request, now_ns)
            tx.save(record, new)
        if type(outcome) is Granted:
            outcome = Granted(self._signed(outcome.lease))
        return outcome

    def _acquire(
        self, tx: RecordTx, record: ScopeRecord, request: AcquireRequest, now_ns: int
    ) -> tuple[ScopeRecord, Outcome]:
        """The grant rule on ``record`` counted from the store's floor; the result replaces ``record``.

        The rule counts a grant's token as ``last_token + 1``; here the count
        starts from the store's floor when that is higher (a new epoch, a
        forgotten scope), and moves to a new epoch when the scope's counter has
        run out. Nothing of this is saved unless the rule grants.
        """
        base = grant_base(record.last_token, tx.token_floor())
        lifted = record if base == record.last_token else replace(record, last_token=base)
        new, outcome = self.acquire_rule(lifted, request, now_ns, self.policy)
        if not (type(outcome) is Granted and new.last_token > lifted.last_token):
            if new.last_token != record.last_token:
                new = replace(new, last_token=record.last_token)
            return new, outcome
        if counter_exhausted(base):
            epoch = tx.new_epoch(epoch_of(base))
            if epoch is not None:
                lifted = replace(record, last_token=epoch_floor(epoch))
                new, outcome = self.acquire_rule(lifted, request, now_ns, self.policy)
        return new, outcome

    def renew(self, lease_id: str) -> Lease:
        """Extend a held lease by its TTL from now.

        Raises:
            NotHolder: the lease expired, was released, or never existed. An
                expiry found here is recorded (the scope's state is settled).
        """
        expired = False
        with self.records.write() as tx:
            scope = tx.scope_of_lease(lease_id if type(lease_id) is str else _lease_id_arg(lease_id))
            if scope is None:
                raise NotHolder(lease_hint(lease_id), "lease expired, was released, or never existed")
            now_ns = self.clock.now_ns()  # before the load: see `RecordTx.load`
            record = tx.load(scope)
            try:
                new, lease = rules.renew(record, lease_id, now_ns, self.policy)
            except NotHolder:
                tx.save(record, rules.settle(record, now_ns, self.policy))
                expired = True
            else:
                tx.save(record, new)
        if expired:
            raise NotHolder(lease_hint(lease_id), "lease expired, was released, or never existed")
        return self._signed(lease)

    def release(self, lease_id: str) -> Released:
        """Release a lease. Idempotent: an unknown or expired lease id is not an error."""
        with self.records.write() as tx:
            scope = tx.scope_of_lease(lease_id if type(lease_id) is str else _lease_id_arg(lease_id))
            now_ns = self.clock.now_ns()
            if scope is None:
                return Released(False, now_ns)
            record = tx.load(scope)
            new, outcome = rules.release(record, lease_id, now_ns, self.policy)
            tx.save(record, new)
        return outcome

    def cancel_wait(self, scope: str, lease_id: str) -> None:
        """Leave the queue of ``scope`` early. Idempotent."""
        validate_scope(scope)
        with self.records.write() as tx:
            record = tx.load(scope)
            tx.save(record, rules.cancel_wait(record, lease_id))

    def settle(self, scope: str) -> ScopeRecord:
        """Apply what time alone decides to ``scope`` (expire, drop lapsed waiters); returns the record."""
        with self.records.write() as tx:
            now_ns = self.clock.now_ns()  # before the load: see `RecordTx.load`
            record = tx.load(scope)
            new = rules.settle(record, now_ns, self.policy)
            tx.save(record, new)
        return new

    def recover(self, *, same_clock: bool) -> int:
        """Apply the restart rule (`stockade.core.leases.recover`) to every stored record, in one unit.

        Call it once when a coordinator comes back from its durable records,
        before it answers anything.

        Args:
            same_clock: the stored times are on the clock this engine reads
                (a process restart on the same boot).

        Returns:
            How many records changed.
        """
        with self.records.write() as tx:
            return recover_records(tx, self.clock.now_ns(), self.policy, same_clock=same_clock)

    # -- reads -------------------------------------------------------------------------------

    def inspect(self, scope: str) -> ScopeInfo:
        """The state of one scope (a never-used scope reads as free with last_token 0)."""
        validate_scope(scope)
        with self.records.read() as tx:
            record = tx.load(scope)
        return rules.describe(record, self.clock.now_ns(), self.policy)

    def contenders(self, scope: str, *, limit: int = CONTENDERS_MAX) -> list[Contender]:
        """Who holds ``scope`` and who waits for it, in the order they will be served (C4), at most ``limit``."""
        validate_scope(scope)
        validate_int("limit", limit, 1, CONTENDERS_MAX)
        with self.records.read() as tx:
            record = tx.load(scope)
        return rules.contenders_of(record, self.clock.now_ns(), self.policy, limit)

    def scopes(self, *, after: str = "", limit: int = LIST_PAGE_MAX) -> list[ScopeInfo]:
        """Scopes in name order after ``after``, at most ``limit`` of them."""
        validate_int("limit", limit, 1, LIST_PAGE_MAX)
        if after:
            validate_scope(after, "after")
        with self.records.read() as tx:
            records = [tx.load(name) for name in tx.names(after=after, limit=limit)]
        now_ns = self.clock.now_ns()
        return [rules.describe(r, now_ns, self.policy) for r in records]

    def last_issued(self, scope: str) -> int:
        """The scope's fence floor: no token at or below it will be issued for ``scope`` again.

        For a stored scope, its last issued token; for a scope the store does
        not hold (never used, or forgotten), the forgotten floor, which is at
        least every token a forgotten scope was issued (0 if none was).
        """
        validate_scope(scope)
        with self.records.read() as tx:
            last = tx.load(scope).last_token
            return last if last else tx.forgotten_floor()

    def fence_floors(self) -> FenceFloors:
        """The fence floor of every scope, for a store's restore (R4).

        Returns:
            ``FenceFloors(floors, default)``: ``floors`` maps each stored scope
            to its last issued token; ``default`` is the floor of every scope not
            named (never used, or forgotten): above every token a forgotten scope
            was issued. Pass it to `stockade.resources.store.backup.restore`.
        """
        floors: dict[str, int] = {}
        with self.records.read() as tx:
            after = ""
            while names := tx.names(after=after, limit=_RECOVER_PAGE):
                for name in names:
                    last = tx.load(name).last_token
                    if last:
                        floors[name] = last
                after = names[-1]
            default = tx.forgotten_floor()
        return FenceFloors(floors, default)

    # -- forgetting idle scopes -------------------------------------------------------------

    def forget_idle(self, limit: int = FORGET_BATCH) -> int:
        """Forget up to ``limit`` idle scopes, least recently changed first; returns how many.

        A scope is idle when, settled at now, it has no lease, no waiter and no
        lock-delay pending. What it had issued is folded into the store's
        forgotten floor in the same unit, so its next grant (and every grant)
        counts above it.
        """
        validate_int("limit", limit, 1, LIST_PAGE_MAX)
        with self.records.write() as tx:
            return self._forget_idle(tx, self.clock.now_ns(), limit)

    def _forget_idle(self, tx: RecordTx, now_ns: int, limit: int) -> int:
        forgotten = 0
        for name in tx.oldest(limit * _FORGET_SCAN):
            record = tx.load(name)
            settled = rules.settle(record, now_ns, self.policy)
            if is_idle(settled, now_ns):
                tx.save(record, settled)  # an expiry or a lapsed waiter is recorded first
                tx.forget(settled)
                forgotten += 1
                if forgotten >= limit:
                    break
        return forgotten
