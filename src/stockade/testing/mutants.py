"""Deliberately broken fenced stores: the controls that every fence test must catch.

Each breaks one rule, and each works over the ports of
`stockade.resources.port`, so it applies to every adapter (SQLite, memory, and
those to come), not only to the one it was first written for:

- ``fencing-off`` (`fencing_off`): swaps the adapter's ``fence_rule`` for one
  that accepts every token, of any value, scope or cluster (the mark only ever
  goes up).
- ``strict-greater`` (`strict_greater`): swaps in ``>`` for ``>=``: rejects a
  holder's second write under the same token (false rejections, S19).
- ``check-then-write`` (`CheckThenWrite`): wraps the adapter; reads the mark
  through the port and judges it, then writes in a separate atomic unit that
  trusts the earlier check (R1/R6 atomicity broken, S04/S20).
  ``between_check_and_write`` is called in the gap, so a test can make the
  race happen every time.

`FencingOffStore`, `StrictGreaterStore` and `CheckThenWriteStore` are the same
controls bound to `SQLiteStore`, constructed like it.

Coordinator-side controls work over the lease engine's seams:

- ``clock-token`` (`clock_token_acquire`): a grant rule for
  `LeaseEngine.acquire_rule` that takes the token from the clock.
- ``lock-delay-lost-on-restart`` (`ForgetsLockDelays`): wraps the record-store
  port; opened at a coordinator restart, it forgets the pending lock-delays.
- ``semaphore-extra-slot``: a semaphore whose holders take one slot more than
  it admits (the simulator's clients acquire on one scope more than the
  semaphore's slots). P10 catches it (`stockade.testing.semaphore_slots`);
  tests/test_semaphore.py has its real-process twin.
- ``rwlock-skip-drain`` (`skip_drain`): a read/write lock whose writers do not drain the read slots
  (``AsyncReadWriteLock._drain`` does nothing): a writer gets in while readers hold their slots. P11
  catches it (`stockade.testing.rwlock_holds`); tests/test_rwlock.py has its real-process twin.
- ``rwlock-silent-writer`` (`silent_writer`): a read/write lock whose writers skip their check-in at
  ``WRITER_KEY``: a reader paused past its slot's lease validates its read as good after a newer writer
  got in. P11 catches it; tests/test_rwlock.py has its real-process twin.
- ``etcd-lock-delay-off`` (`lock_delay_off`): replaces a client port's C5
  decision (``lock_delay_end_ns``, the etcd port's) with one that never waits:
  the next grant after a lapse comes at once. The coordinator suite's
  lock-delay tests (`stockade.testing.conformance.coordinator_expiry`) catch it on a
  real etcd. The simulator has no etcd port: it runs the other controls
  (`simulated`).
- ``wait-requeued-at-cap`` (`requeue_at_cap`): a client port's wait until
  granted (``wait_ms=None``) asks again as a new acquire each time a server's
  per-request cap runs out, without its queue ticket: it loses its place, to
  the back of the queue. The coordinator suite's FIFO-across-caps test
  (`stockade.testing.conformance.coordinator_waits`) catches
  it on a served coordinator.
- ``wait-outlives-cancel`` (`wait_outlives_cancel`): a client port's wait
  runs on (a shielded task, a thread) when its caller is cancelled or
  interrupted: the waiter stays queued. The suite's cancel test catches it.

- ``contenders-reversed`` (`contenders_reversed`) and ``contenders-by-name``
  (`contenders_by_name`): a client port's ``contenders`` lists the waiters in
  reverse, or sorted by holder name, instead of in the order they will be
  served (C4). The coordinator suite's contenders test catches both.

`MUTANTS` is the one registry of every control, each with the seam it breaks:
the simulator (``stockade sim --mutant NAME``, ``--list-mutants``) reads it,
and the real-process tests take their controls from it (``wrap``,
``sqlite_class``); no simulator module names a mutant.
"""

from __future__ import annotations

import asyncio
import enum
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from stockade.client._async.rwlock import WRITER_KEY as _WRITER_KEY
from stockade.core import leases as rules
from stockade.core.engine import RecordStore, RecordTx
from stockade.core.errors import InvalidArgument, LockTimeout
from stockade.core.fence import Accept, FenceDecision, FenceRule, Reject, decide
from stockade.core.leases import AcquireRequest, Granted, LeasePolicy, Queued, ScopeRecord, TimedOut
from stockade.core.limits import WAIT_MS_MAX, validate_scope
from stockade.core.tokens import FencingToken
from stockade.core.values import Item, Write, WriteResult
from stockade.resources._inputs import coerce_token, make_write
from stockade.resources._observe import reject
from stockade.resources._tx import Tx
from stockade.resources.port import FenceAdapterPort
from stockade.resources.store.sqlite_store import SQLiteStore

__all__ = [
    "accept_everything",
    "reject_equal",
    "fencing_off",
    "strict_greater",
    "CheckThenWrite",
    "FencingOffStore",
    "StrictGreaterStore",
    "CheckThenWriteStore",
    "clock_token_acquire",
    "ForgetsLockDelays",
    "no_lock_delay",
    "lock_delay_off",
    "requeue_at_cap",
    "wait_outlives_cancel",
    "contenders_reversed",
    "contenders_by_name",
    "skip_drain",
    "silent_writer",
    "simulated",
    "Seam",
    "Mutant",
    "MUTANTS",
    "mutant",
]

AdapterT = TypeVar("AdapterT", bound=FenceAdapterPort)

_NS_PER_MS = 1_000_000


# -- broken rules: swapped into any adapter's fence_rule -----------------------------------


def accept_everything(token: FencingToken, *, cluster: str, scope: str, high_water: int) -> FenceDecision:
    """No fence: accept any token (the mark still never goes down, so the store's R4 guard stays quiet)."""
    return Accept(max(token.value, high_water))


def reject_equal(token: FencingToken, *, cluster: str, scope: str, high_water: int) -> FenceDecision:
    """``>`` for ``>=``: a second write under the same token is refused."""
    decision = decide(token, cluster=cluster, scope=scope, high_water=high_water)
    if isinstance(decision, Accept) and token.value == high_water:
        return Reject("stale", high_water)
    return decision


def fencing_off(adapter: AdapterT) -> AdapterT:
    """Break ``adapter`` in place: it accepts every token. Returns it."""
    adapter.fence_rule = accept_everything
    return adapter


def strict_greater(adapter: AdapterT) -> AdapterT:
    """Break ``adapter`` in place: it rejects equal tokens. Returns it."""
    adapter.fence_rule = reject_equal
    return adapter


# -- check-then-write: a wrapper over the fence-adapter port ----------------------------------


def _trusting(checked: Accept) -> FenceRule:
    """A rule that believes an earlier check instead of comparing with the mark now: the bug's second half."""

    def trust(token: FencingToken, *, cluster: str, scope: str, high_water: int) -> FenceDecision:
        return Accept(max(high_water, checked.new_high_water))

    return trust


class _EachStepAlone:
    """A `FencedUnit` whose every step is an atomic unit of its own (a transaction that is not one)."""

    def __init__(self, adapter: FenceAdapterPort, token: FencingToken, scope: str, checked: Accept) -> None:
        self.scope = scope
        self.high_water = checked.new_high_water
        self._adapter = adapter
        self._token = token
        self._rule = _trusting(checked)

    def apply(self, write: Write, *, token_value: int) -> WriteResult:
        with self._adapter.admitted(self._token, self.scope, rule=self._rule) as unit:
            return unit.apply(write, token_value=token_value)

    def get(self, key: str) -> Item | None:
        with self._adapter.admitted(self._token, self.scope, rule=self._rule) as unit:
            return unit.get(key)


class CheckThenWrite:
    """Wraps a store that is a `FenceAdapterPort`: checks the mark in one step, writes in another.

    Every other attribute (``get``, ``list``, ``audit``, ``close``, ...) is the
    wrapped store's.

    Attributes:
        between_check_and_write: called with ``(scope, token)`` after the check
            and before the write begins (None: no pause). Tests use it to let a
            higher token's write land in the gap.
    """

    between_check_and_write: Callable[[str, FencingToken], None] | None = None

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter  # a FenceAdapterPort that is also a store (Any: the rest is delegated)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.adapter, name)

    def __enter__(self) -> CheckThenWrite:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.adapter.close()

    def _check(self, scope: str, token: FencingToken, key: str | None) -> Accept:
        port: FenceAdapterPort = self.adapter
        high_water = port.high_water(scope)  # read through the port, in a unit of its own: the bug
        decision = port.fence_rule(token, cluster=port.cluster_id, scope=scope, high_water=high_water)
        if isinstance(decision, Reject):
            reject(decision, resource=port.resource, cluster=port.cluster_id, token=token, scope=scope, key=key)
        assert isinstance(decision, Accept)
        if self.between_check_and_write is not None:
            self.between_check_and_write(scope, token)
        return decision

    def _write(self, write: Write, token: FencingToken) -> WriteResult:
        checked = self._check(write.scope, token, write.key)
        return self.adapter.write_once(write, token, rule=_trusting(checked))

    def put(
        self, scope: str, key: str, value: bytes | str, *, token: FencingToken | str, idempotency_key: str | None = None
    ) -> WriteResult:
        write = make_write(scope, key, "put", value, idempotency_key, value_bytes_max=self.adapter.value_bytes_max)
        return self._write(write, coerce_token(token))

    def delete(
        self, scope: str, key: str, *, token: FencingToken | str, idempotency_key: str | None = None
    ) -> WriteResult:
        write = make_write(scope, key, "delete", b"", idempotency_key, value_bytes_max=self.adapter.value_bytes_max)
        return self._write(write, coerce_token(token))

    @contextmanager
    def transaction(self, scope: str, *, token: FencingToken | str) -> Iterator[Tx]:
        scope = validate_scope(scope)
        fencing_token = coerce_token(token)
        checked = self._check(scope, fencing_token, None)
        tx = Tx(_EachStepAlone(self.adapter, fencing_token, scope, checked), fencing_token,
                value_bytes_max=self.adapter.value_bytes_max)
        try:
            yield tx
        finally:
            tx.close()


# -- the same controls bound to SQLiteStore (constructed like it) -------------------------------


class FencingOffStore(SQLiteStore):
    """`SQLiteStore` with `accept_everything` as its rule (the ``fencing-off`` control)."""

    fence_rule = staticmethod(accept_everything)


class StrictGreaterStore(SQLiteStore):
    """`SQLiteStore` with `reject_equal` as its rule (the ``strict-greater`` control)."""

    fence_rule = staticmethod(reject_equal)


class CheckThenWriteStore(CheckThenWrite):
    """`CheckThenWrite` over a `SQLiteStore` opened with the same arguments."""

    def __init__(self, path: Any, **options: Any) -> None:
        super().__init__(SQLiteStore(path, **options))



# -- coordinator-side controls: over the lease engine's seams ---------------------------------


def clock_token_acquire(
    record: ScopeRecord, request: AcquireRequest, now_ns: int, policy: LeasePolicy
) -> tuple[ScopeRecord, Granted | Queued | TimedOut]:
    """The grant rule with the token taken from the coordinator's clock (ms), not from the counter.

    Two grants in one millisecond share a token, and after a failover to a host
    whose clock is behind, tokens go back (C1). The record's counter itself
    never goes down (the record store refuses that), only the tokens handed out.
    """
    new, outcome = rules.acquire(record, request, now_ns, policy)
    if isinstance(outcome, Granted) and new.last_token > record.last_token:
        value = max(1, now_ns // _NS_PER_MS)
        lease = replace(outcome.lease, token=replace(outcome.lease.token, value=value))
        new = replace(new, lease=lease, last_token=max(record.last_token, value))
        outcome = Granted(lease)
    return new, outcome


class ForgetsLockDelays:
    """A `RecordStore` wrapper that forgets every pending lock-delay when it is opened.

    Opened when a coordinator comes back from its durable records (a restart or
    a failover), it rewrites each stored record's ``delay_until_ns`` to 0
    before the engine sees it: a scope whose lease expired just before the
    crash can be granted at once after the restart (C5 broken). Every unit is
    otherwise the wrapped store's.
    """

    def __init__(self, inner: RecordStore) -> None:
        self.inner = inner
        self.forgotten = 0
        with inner.write() as tx:
            after = ""
            while names := tx.names(after=after, limit=1_000):
                for name in names:
                    record = tx.load(name)
                    if record.delay_until_ns:
                        tx.save(record, replace(record, delay_until_ns=0))
                        self.forgotten += 1
                after = names[-1]

    def write(self) -> AbstractContextManager[RecordTx]:
        return self.inner.write()

    def read(self) -> AbstractContextManager[RecordTx]:
        return self.inner.read()

    def close(self) -> None:
        self.inner.close()


def no_lock_delay(*, lapsed: bool, ended_ns: int, lock_delay_ms: int) -> int:
    """`stockade.core.leases.lock_delay_end_ns` without C5: a scope may be granted again at once."""
    return ended_ns


def lock_delay_off(port: Any) -> Any:
    """Break a client port's lock-delay (etcd's, ZooKeeper's) in place: it never holds a grant back. Returns it."""
    port.lock_delay_end_ns = no_lock_delay
    return port


def requeue_at_cap(port: Any) -> Any:
    """Break a client port's wait until granted in place: at each per-request cap (a `LockTimeout` of the
    longest wait) it asks again as a new acquire, at the back of the queue. Returns it."""
    acquire = port.acquire

    def note_round() -> None:
        port.wait_rounds += 1

    if asyncio.iscoroutinefunction(acquire):
        async def requeued_async(scope: str, *, holder: str, ttl_ms: int, wait_ms: int | None) -> Any:
            while True:
                try:
                    return await acquire(scope, holder=holder, ttl_ms=ttl_ms,
                                         wait_ms=WAIT_MS_MAX if wait_ms is None else wait_ms)
                except LockTimeout:
                    if wait_ms is not None:
                        raise
                    note_round()

        port.acquire = requeued_async
        return port

    def requeued(scope: str, *, holder: str, ttl_ms: int, wait_ms: int | None) -> Any:
        while True:
            try:
                return acquire(scope, holder=holder, ttl_ms=ttl_ms, wait_ms=WAIT_MS_MAX if wait_ms is None else wait_ms)
            except LockTimeout:
                if wait_ms is not None:
                    raise
                note_round()

    port.acquire = requeued
    return port


def wait_outlives_cancel(port: Any) -> Any:
    """Break a client port's acquire in place: the wait runs in a task the caller's cancellation does not
    reach (async: shielded; sync: a thread that a KeyboardInterrupt in the caller leaves running). Returns it."""
    acquire = port.acquire

    if asyncio.iscoroutinefunction(acquire):
        async def shielded(scope: str, **arguments: Any) -> Any:
            return await asyncio.shield(acquire(scope, **arguments))

        port.acquire = shielded
        return port

    def in_a_thread(scope: str, **arguments: Any) -> Any:
        box: list[Any] = []
        worker = threading.Thread(target=lambda: box.append(_outcome(acquire, scope, arguments)), daemon=True)
        worker.start()
        worker.join()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    port.acquire = in_a_thread
    return port


def skip_drain(rwlock: Any) -> Any:
    """Break a read/write lock (`stockade.ReadWriteLock` or its async twin) in place: its writers take the
    gate and check in without waiting for the read slots to be free. Returns it."""
    if asyncio.iscoroutinefunction(rwlock._drain):
        async def no_drain_async(*arguments: Any) -> None:
            return None

        rwlock._drain = no_drain_async
        return rwlock

    def no_drain(*arguments: Any) -> None:
        return None

    rwlock._drain = no_drain
    return rwlock


def silent_writer(rwlock: Any) -> Any:
    """Break a read/write lock in place: its writers do not check in (readers' `validate` cannot see them).
    Returns it."""
    check_in = rwlock._check_in

    if asyncio.iscoroutinefunction(check_in):
        async def silent_async(key: str, gate: Any, holder: str) -> None:
            if key != _WRITER_KEY:
                await check_in(key, gate, holder)

        rwlock._check_in = silent_async
        return rwlock

    def silent(key: str, gate: Any, holder: str) -> None:
        if key != _WRITER_KEY:
            check_in(key, gate, holder)

    rwlock._check_in = silent
    return rwlock


def _misordered(port: Any, order: Callable[[list[Any]], list[Any]]) -> Any:
    """Break a client port's ``contenders`` in place: the holder stays first, the waiters come in ``order``."""
    contenders = port.contenders

    def line(found: list[Any]) -> list[Any]:
        head = found[:1] if found and found[0].holding else []
        return head + order(found[len(head):])

    if asyncio.iscoroutinefunction(contenders):
        async def misordered_async(scope: str, *, limit: int) -> list[Any]:
            return line(await contenders(scope, limit=limit))

        port.contenders = misordered_async
        return port

    def misordered(scope: str, *, limit: int) -> list[Any]:
        return line(contenders(scope, limit=limit))

    port.contenders = misordered
    return port


def contenders_reversed(port: Any) -> Any:
    """A client port whose ``contenders`` lists the waiters last queued first. Returns it."""
    return _misordered(port, lambda waiters: waiters[::-1])


def contenders_by_name(port: Any) -> Any:
    """A client port whose ``contenders`` lists the waiters sorted by holder name. Returns it."""
    return _misordered(port, lambda waiters: sorted(waiters, key=lambda c: c.holder))


def _outcome(call: Callable[..., Any], scope: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
    try:
        return True, call(scope, **arguments)
    except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
        return False, exc


# -- the one registry ----------------------------------------------------------------------------


class Seam(enum.Enum):
    """Where a control plugs in: each is a port or a seam of the real code, never a copy of it."""

    FENCE_RULE = "FenceAdapterPort.fence_rule"
    FENCE_UNIT = "FenceAdapterPort (check and write in separate atomic units)"
    RESTORE_FLOOR = "restore: the fence floor (R4)"
    ACQUIRE_RULE = "LeaseEngine.acquire_rule"
    RECORD_STORE = "RecordStore (opened at a coordinator restart)"
    COMMIT = "RecordStore commit: durable before the answer (MemoryRecords.on_commit)"
    PORT_LOCK_DELAY = "a client port's lock-delay decision (lock_delay_end_ns, C5)"
    PORT_WAIT = "a client port's wait until granted (acquire with wait_ms=None)"
    PORT_CONTENDERS = "a client port's contenders listing (its serving order, C4)"
    SEMAPHORE_SLOTS = "a semaphore's slots (Semaphore.scope_of: the scopes its holders take)"
    RWLOCK_DRAIN = "a read/write lock's writer drain (ReadWriteLock._drain: every read slot free once)"
    RWLOCK_CHECK_IN = "a read/write lock's writer check-in (ReadWriteLock._check_in at WRITER_KEY)"


#: Seams of a backend's own client port, which the simulator does not model: their controls run
#: against the real backend only (the simulator's coordinator is the lease engine).
PORT_SEAMS = frozenset({Seam.PORT_LOCK_DELAY, Seam.PORT_WAIT, Seam.PORT_CONTENDERS})
#: Seams of the read/write lock: their controls run in the simulator's world of the lock, and only there (the
#: other controls run in the plain world only, so their seeds and costs stay those of P1–P10).
RWLOCK_SEAMS = frozenset({Seam.RWLOCK_DRAIN, Seam.RWLOCK_CHECK_IN})


@dataclass(frozen=True, slots=True)
class Mutant:
    """One control: a deliberately broken variant that every fault test must catch.

    Attributes:
        description: what it breaks.
        seam: where it plugs in.
        rule: the broken rule, for `Seam.FENCE_RULE` (a `FenceRule`) and
            `Seam.ACQUIRE_RULE` (a replacement for `LeaseEngine.acquire_rule`).
        wrap: makes the control from the real thing: a store that is a
            `FenceAdapterPort` (fence seams), a `RecordStore`
            (`Seam.RECORD_STORE`), or a client port (`Seam.PORT_LOCK_DELAY`).
            None when only the simulator models it.
        sqlite_class: the control bound to `SQLiteStore`, constructed like it.
        caught_by: the properties that usually catch it (for the docs and reports).
    """

    description: str
    seam: Seam
    rule: Callable[..., Any] | None = None
    wrap: Callable[[Any], Any] | None = None
    sqlite_class: type | None = None
    caught_by: str = ""


#: Every control, for the simulator (``stockade sim --mutant NAME``) and the real-process tests alike.
MUTANTS: dict[str, Mutant] = {
    "fencing-off": Mutant("the resource accepts every token (no fence)", Seam.FENCE_RULE,
                          rule=accept_everything, wrap=fencing_off, sqlite_class=FencingOffStore, caught_by="P2"),
    "strict-greater": Mutant("'>' for '>=': rejects a holder's second write under one token", Seam.FENCE_RULE,
                             rule=reject_equal, wrap=strict_greater, sqlite_class=StrictGreaterStore,
                             caught_by="P8 false rejection, linearizability"),
    "check-then-write": Mutant("the resource checks the mark in one atomic unit and writes in another",
                               Seam.FENCE_UNIT, wrap=CheckThenWrite, sqlite_class=CheckThenWriteStore,
                               caught_by="P2, P7"),
    "clock-token": Mutant("the coordinator takes the token from its clock (ms) instead of the counter",
                          Seam.ACQUIRE_RULE, rule=clock_token_acquire, caught_by="P1"),
    "restore-no-floor": Mutant("a restore from backup keeps the backup's high-water marks (no fence floor)",
                               Seam.RESTORE_FLOOR, caught_by="P5, P2"),
    "volatile-tokens": Mutant("the coordinator answers before its records are durable (checkpointed now and then)",
                              Seam.COMMIT, caught_by="P1 after a coordinator crash"),
    "lock-delay-lost-on-restart": Mutant("a restarted coordinator forgets the pending lock-delays",
                                         Seam.RECORD_STORE, wrap=ForgetsLockDelays, caught_by="P9"),
    "semaphore-extra-slot": Mutant("a semaphore's holders take one slot more than it admits (its slots miscounted)",
                                   Seam.SEMAPHORE_SLOTS, caught_by="P10"),
    "rwlock-skip-drain": Mutant("a read/write lock's writers do not wait for the read slots to be free (no drain)",
                                Seam.RWLOCK_DRAIN, wrap=skip_drain, caught_by="P11"),
    "rwlock-silent-writer": Mutant("a read/write lock's writers skip their check-in (validate cannot see them)",
                                   Seam.RWLOCK_CHECK_IN, wrap=silent_writer, caught_by="P11"),
    "etcd-lock-delay-off": Mutant("the etcd port grants at once after a lapse (no lock-delay)", Seam.PORT_LOCK_DELAY,
                                  rule=no_lock_delay, wrap=lock_delay_off,
                                  caught_by="C5, the coordinator suite's lock-delay tests on a real etcd"),
    "wait-requeued-at-cap": Mutant("a wait until granted asks again as a new acquire at each server cap (no ticket)",
                                   Seam.PORT_WAIT, wrap=requeue_at_cap,
                                   caught_by="C4, the coordinator suite's FIFO-across-caps test, served"),
    "wait-outlives-cancel": Mutant("a wait until granted runs on when its caller is cancelled or interrupted",
                                   Seam.PORT_WAIT, wrap=wait_outlives_cancel,
                                   caught_by="the coordinator suite's cancel test"),
    "contenders-reversed": Mutant("contenders lists the waiters last queued first", Seam.PORT_CONTENDERS,
                                  wrap=contenders_reversed, caught_by="C4, the coordinator suite's contenders test"),
    "contenders-by-name": Mutant("contenders lists the waiters sorted by holder name", Seam.PORT_CONTENDERS,
                                 wrap=contenders_by_name, caught_by="C4, the coordinator suite's contenders test"),
}


def simulated() -> list[str]:
    """The controls the simulator runs (``stockade sim --mutant``): every one but those of a client port."""
    return [name for name, found in MUTANTS.items() if found.seam not in PORT_SEAMS]


def mutant(name: str | None) -> Mutant | None:
    """The control called ``name`` (None: none).

    Raises:
        InvalidArgument: no control has that name.
    """
    if name is None:
        return None
    found = MUTANTS.get(name)
    if found is None:
        raise InvalidArgument("mutant", f"must be one of {', '.join(MUTANTS)}, got {name!r}")
    return found
