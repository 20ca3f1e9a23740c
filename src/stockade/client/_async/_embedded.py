"""Ports to the in-process lease engines (a SQLite file on this host, memory).

Any `stockade.core.engine.LeaseEngine` serves here, whatever its record
store. The engines are blocking and answer at once; waiting for a busy scope is a
poll loop here, with a deadline and a bounded interval, so that the async
client never blocks its event loop and the sync client never blocks forever.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from stockade.client._shared import Grant
from stockade.coordinators._mint import new_lease_id
from stockade.coordinators.journal import HistoryEvent, history_of
from stockade.coordinators.registry import Capability
from stockade.core import leases as core_leases
from stockade.core.engine import LeaseEngine, Outcome
from stockade.core.errors import BackendUnavailable, InvariantViolation, LockTimeout, invariant
from stockade.core.limits import wait_deadline_ns
from stockade.core.tokens import FencingToken
from stockade.core.values import FenceFloors, Item, Write, WriteResult
from stockade.resources.port import TransactionalStorePort
from stockade.resources.store.sqlite_store import TX_BUFFER_BYTES_MAX
from stockade.transport.io import AsyncIO

__all__ = ["AsyncEmbeddedCoordinatorPort", "AsyncEmbeddedStorePort", "POLL_INTERVAL_MS_MIN", "POLL_INTERVAL_MS_MAX",
           "CLEANUP_MS_MAX", "STORE_WAIT_MS_MIN"]

POLL_INTERVAL_MS_MIN = 1
POLL_INTERVAL_MS_MAX = 20
#: How long the clean-up of a failed acquire waits for the store (the slack of an acquire's wait).
CLEANUP_MS_MAX = 50
#: However short its wait, an acquire waits this long for the store (other processes' writes take turns
#: on a shared file: 8 processes cycling locks wait up to a few hundred ms for it on a loaded host).
STORE_WAIT_MS_MIN = 1_000


class AsyncEmbeddedCoordinatorPort:
    """The coordinator port (`AsyncCoordinatorPort`) over an in-process lease engine.

    Args:
        engine: the engine; closed with the port.
        capabilities: what its backend declares (`stockade.coordinators.registry`).
    """

    def __init__(self, engine: LeaseEngine, *, capabilities: frozenset[Capability]) -> None:
        self.engine = engine
        self.cluster_id = engine.cluster_id
        self.clock = engine.clock
        self.capabilities = capabilities
        self.wait_rounds = 0  # one call waits: no per-request cap here
        self.keys = engine.signer  # what a store verifies this engine's tokens with

    async def open(self) -> None:
        pass  # an engine is open once constructed

    async def acquire(self, scope: str, *, holder: str, ttl_ms: int, wait_ms: int | None) -> Grant:
        """Acquire ``scope``, waiting in FIFO order up to ``wait_ms`` (None: until granted or cancelled).

        A wait until granted is one waiter of the engine with no deadline, kept
        alive by this loop's attempts (``waiter_stale_ms``): it keeps its place
        for as long as this process polls, and lapses when it stops.

        The wait holds whatever the engine's store is doing: each attempt waits
        for the store (a file's write lock, which a frozen process may hold) at
        most until the acquire's deadline, or `STORE_WAIT_MS_MIN` after the
        start when that is later, and the clean-up after a failed acquire at
        most `CLEANUP_MS_MAX` more: the acquire answers within
        ``max(wait_ms, STORE_WAIT_MS_MIN) + CLEANUP_MS_MAX`` and one commit
        (docs/leases.md, "A frozen party on the embedded coordinator").

        Returns:
            The grant; its ``sent_ns`` is the send time (``clock.now_ns()``) of the
            attempt that was granted: the start of the client's conservative
            lease deadline (K2). The engine shares the client's clock here.

        Raises:
            LockTimeout: still held (or others ahead) when ``wait_ms`` ran out.
            BackendUnavailable: the store could not be written for the whole
                wait (``certain_no_effect``: nothing was granted).
        """
        lease_id = new_lease_id()
        start_ns = self.clock.now_ns()
        deadline_ns = wait_deadline_ns(start_ns, wait_ms)
        # A short wait (0: "only if free") still waits for other processes' brief writes.
        store_until_ns = max(deadline_ns, start_ns + STORE_WAIT_MS_MIN * 1_000_000)
        if wait_ms is None:  # until granted: each attempt waits for the store a bounded time
            store_until_ns = start_ns + STORE_WAIT_MS_MIN * 1_000_000
        interval_ms = POLL_INTERVAL_MS_MIN
        try:
            while True:
                sent_ns = self.clock.now_ns()
                try:
                    outcome = await AsyncIO.run_blocking(
                        _attempt, self.engine, scope, lease_id=lease_id, holder=holder, ttl_ms=ttl_ms,
                        wait_deadline_ns=deadline_ns, store_until_ns=store_until_ns,
                    )
                except BackendUnavailable as exc:
                    # Busy (another process holds the write lock): nothing was done; try
                    # again while the wait lasts (a store's busy timeout may be shorter).
                    if not exc.certain_no_effect or (wait_ms is not None and self.clock.now_ns() >= store_until_ns):
                        raise
                    continue  # the attempt itself waited (its busy timeout): no spinning
                if isinstance(outcome, core_leases.Granted):
                    lease = outcome.lease
                    return Grant(lease.lease_id, lease.holder, lease.token, lease.ttl_ms, sent_ns)
                if isinstance(outcome, core_leases.TimedOut):
                    raise LockTimeout(scope, 0 if wait_ms is None else wait_ms)
                invariant(isinstance(outcome, core_leases.Queued), f"unexpected outcome {outcome!r}")
                if wait_ms is None:
                    store_until_ns = self.clock.now_ns() + STORE_WAIT_MS_MIN * 1_000_000
                remaining_ms = (deadline_ns - self.clock.now_ns()) / 1_000_000
                await AsyncIO.sleep(max(0.0, min(interval_ms, remaining_ms)) / 1000)
                interval_ms = min(interval_ms * 2, POLL_INTERVAL_MS_MAX)
        except LockTimeout:
            raise
        except BaseException:
            # Interrupted (cancelled, KeyboardInterrupt, backend error): leave the
            # queue and give back a grant that may have happened meanwhile.
            try:
                _abandon(self.engine, scope, lease_id, self.clock.now_ns() + CLEANUP_MS_MAX * 1_000_000)
            except InvariantViolation:
                raise  # a bug: shown, chained to what interrupted the acquire
            except Exception:  # noqa: BLE001 - best effort: the lease, if any, expires by TTL
                pass
            raise

    async def renew(self, lease_id: str) -> None:
        await AsyncIO.run_blocking(self.engine.renew, lease_id)

    async def release(self, lease_id: str) -> bool:
        outcome = await AsyncIO.run_blocking(self.engine.release, lease_id)
        return outcome.released

    async def inspect(self, scope: str) -> core_leases.ScopeInfo:
        return await AsyncIO.run_blocking(self.engine.inspect, scope)

    async def scopes(self, *, after: str, limit: int) -> list[core_leases.ScopeInfo]:
        return await AsyncIO.run_blocking(self.engine.scopes, after=after, limit=limit)

    async def contenders(self, scope: str, *, limit: int) -> list[core_leases.Contender]:
        return await AsyncIO.run_blocking(self.engine.contenders, scope, limit=limit)

    async def last_issued(self, scope: str) -> int:
        return await AsyncIO.run_blocking(self.engine.last_issued, scope)

    async def fence_floors(self) -> FenceFloors:
        return await AsyncIO.run_blocking(self.engine.fence_floors)

    async def history(self, scope: str, *, limit: int) -> list[HistoryEvent]:
        return await AsyncIO.run_blocking(history_of, self.engine.records, scope, limit)

    async def aclose(self) -> None:
        self.engine.close()


class AsyncEmbeddedStorePort:
    """Any in-process fenced store (`TransactionalStorePort`: SQLite, memory, ...) behind the client (`AsyncStorePort`).

    A transaction's steps are counted as the stores count what their own
    `transaction` buffers: the bytes of the values, against `TX_BUFFER_BYTES_MAX`.
    """

    tx_bytes_limit = "TX_BUFFER_BYTES_MAX"
    tx_bytes_max = TX_BUFFER_BYTES_MAX

    def __init__(self, engine: TransactionalStorePort) -> None:
        self.engine = engine
        self.cluster_id = engine.cluster_id
        self.value_bytes_max = engine.value_bytes_max

    async def open(self) -> None:
        pass  # a store is open once constructed

    async def put(
        self, scope: str, key: str, value: bytes | str, *, token: FencingToken, idempotency_key: str | None
    ) -> WriteResult:
        return await AsyncIO.run_blocking(
            self.engine.put, scope, key, value, token=token, idempotency_key=idempotency_key
        )

    async def delete(self, scope: str, key: str, *, token: FencingToken, idempotency_key: str | None) -> WriteResult:
        return await AsyncIO.run_blocking(self.engine.delete, scope, key, token=token, idempotency_key=idempotency_key)

    async def get(self, scope: str, key: str) -> Item | None:
        return await AsyncIO.run_blocking(self.engine.get, scope, key)

    async def list(self, scope: str, *, after: str, limit: int) -> list[Item]:
        return await AsyncIO.run_blocking(self.engine.list, scope, after=after, limit=limit)

    async def high_water(self, scope: str) -> int:
        return await AsyncIO.run_blocking(self.engine.high_water, scope)

    @staticmethod
    def tx_bytes(write: Write) -> int:
        return len(write.value)

    async def transaction(
        self, scope: str, writes: Sequence[Write], *, token: FencingToken
    ) -> builtins.list[WriteResult]:
        """The store's own `transaction`, the steps replayed into it in one blocking call."""
        return await AsyncIO.run_blocking(_apply_transaction, self.engine, scope, writes, token)

    async def aclose(self) -> None:
        self.engine.close()


def _attempt(
    engine: LeaseEngine, scope: str, *, lease_id: str, holder: str, ttl_ms: int, wait_deadline_ns: int,
    store_until_ns: int,
) -> Outcome:
    """One acquire attempt that waits for the engine's store no later than ``store_until_ns``."""
    with engine.within(store_until_ns):
        return engine.try_acquire(
            scope, lease_id=lease_id, holder=holder, ttl_ms=ttl_ms, wait_deadline_ns=wait_deadline_ns
        )


def _abandon(engine: LeaseEngine, scope: str, lease_id: str, until_ns: int) -> None:
    """Leave the queue and give back a grant that may have happened, waiting for the store until ``until_ns``.

    A waiter this leaves behind (the store stayed busy) lapses by itself
    (``waiter_stale_ms``); a grant, by its TTL.
    """
    with engine.within(until_ns):
        engine.cancel_wait(scope, lease_id)
        engine.release(lease_id)


def _apply_transaction(
    engine: TransactionalStorePort, scope: str, writes: Sequence[Write], token: FencingToken
) -> list[WriteResult]:
    """Run ``writes`` through ``engine.transaction``: its fence check, its commit, its results.

    A store whose steps learn their ``commit_seq`` only at the commit (SQLite)
    hands them over in ``tx.results``; one that commits what it staged under
    its lock (memory) has them in the steps' own results.
    """
    with engine.transaction(scope, token=token) as tx:
        staged = [tx.put(w.key, w.value) if w.op == "put" else tx.delete(w.key) for w in writes]
    committed: list[WriteResult] | None = getattr(tx, "results", None)
    return list(committed) if committed is not None else staged
