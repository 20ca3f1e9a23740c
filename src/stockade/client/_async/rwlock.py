"""A read/write lock: many readers or one writer, every token from one sequence (docs/rwlock.md).

``AsyncReadWriteLock(coord, store, "catalog", readers=8)`` uses the scope ``rw.catalog`` (the
*gate*) and the read slots of a semaphore, ``sem.rw.catalog.0`` .. ``sem.rw.catalog.<readers-1>``.
Every acquisition, read or write, first takes the gate, so readers and writers wait in one
first in, first out queue (C4: a waiting writer holds back the readers behind it) and every
one of them gets a token of the gate's one sequence (C1).

- A writer keeps the gate, waits until every read slot is free (it takes and gives back each
  in turn: a new reader needs the gate to take a slot), then *checks in*: a fenced write of its
  token at the key `WRITER_KEY` of the gate scope in ``store``. Its token fences its writes to
  the gate scope (R1) against older writers and against the readers that checked in before it.
- A reader, holding the gate, checks in (a fenced write of its token at `READER_KEY`), which
  raises the scope's mark to its token, so every older writer, paused or not, is refused from
  then on (R1); it takes a read slot and gives the gate back. Its `AsyncReadLease.validate`
  after a read refuses that read if a newer writer has checked in since (the read may have
  seen that writer's writes).

The lock is a recipe over the public client: it works on every coordinator backend, sync
(`ReadWriteLock`) and async alike, and asks nothing more of them than leases.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from stockade.client._async.coordinator import AsyncCoordinator, AsyncLease
from stockade.client._async.semaphore import AsyncSemaphore
from stockade.client._async.store import AsyncFencedStore
from stockade.client._shared import CURRENT_LEASE, default_holder
from stockade.core.errors import InvalidArgument, LeaseLost, LockTimeout, StaleToken, StockadeError
from stockade.core.limits import (
    validate_holder,
    validate_int,
    validate_scope,
    validate_ttl_ms,
    validate_wait,
    wait_deadline_ns,
)
from stockade.core.tokens import FencingToken

__all__ = ["AsyncReadLease", "AsyncReadWriteLock", "READERS_MAX", "READER_KEY", "WRITER_KEY"]

log = logging.getLogger("stockade.client")

#: The most readers a lock may admit at once (a writer takes and gives back every read slot).
READERS_MAX = 100
#: The key of the gate scope where each writer checks in (its token, before it returns).
WRITER_KEY = "rw.writer"
#: The key of the gate scope where each reader checks in (its token raises the mark).
READER_KEY = "rw.reader"


def _remaining_ms(deadline_ns: int, wait_ms: int | None) -> int | None:
    """What is left of a wait, for one step of it: None (until granted) or 0 .. ``wait_ms``."""
    if wait_ms is None:
        return None
    return max(0, (deadline_ns - time.monotonic_ns()) // 1_000_000)


async def _release_quietly(lease: AsyncLease) -> None:
    """Release ``lease``; a failure is logged, not raised: the lease ends by its TTL anyway (its keepalive
    has stopped), and the caller's own outcome stays the one it reports."""
    try:
        await lease.release()
    except StockadeError as exc:
        log.warning("release failed", extra={"scope": lease.scope, "error": repr(exc)})


class AsyncReadLease:
    """A reader's hold: a read slot's lease, and the gate token the reader checked in with.

    Attributes:
        scope: the gate scope (the resource's scope the lock's tokens are for).
        token: the reader's `FencingToken`, of the gate's sequence; it raised the scope's mark.
        lease: the read slot's `AsyncLease` (kept alive in the background).
    """

    def __init__(self, rwlock: AsyncReadWriteLock, token: FencingToken, lease: AsyncLease) -> None:
        self.scope = rwlock.scope
        self.token = token
        self.lease = lease
        self._store = rwlock._store

    def __repr__(self) -> str:
        return f"<ReadLease scope={self.scope!r} token={self.token.value} lost={self.lost}>"

    @property
    def lost(self) -> bool:
        """True once the read slot's lease is known to be lost (K2). Never turns back."""
        return bool(self.lease.lost)

    async def validate(self) -> None:
        """Refuse what was read so far if a writer newer than this reader has checked in.

        Call it after reading: if it returns, no writer with a token above this reader's had
        checked in when it looked, so no such writer's write was in what the reader read before
        (a writer checks in before it writes). A read lease whose slot lapsed is refused here once
        the writer that got in after it has checked in, whatever the lease's clock says.

        Raises:
            StaleToken: a newer writer checked in; ``high_water`` is its token's value.
            BackendUnavailable: the store failed.
        """
        item = await self._store.get(self.scope, WRITER_KEY)
        if item is not None and item.token_value > self.token.value:
            raise StaleToken(self.token, item.token_value)

    async def release(self) -> None:
        """Give the read slot back. Idempotent."""
        await self.lease.release()

    async def __aenter__(self) -> AsyncReadLease:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.release()


class AsyncReadWriteLock:
    """Many readers (up to ``readers``) or one writer, over ``coord``, fenced at ``store``.

    Attributes:
        name: the lock's name.
        scope: the gate scope ``rw.<name>``: the scope of every token of the lock, and the scope
            of the resource the lock protects in ``store``.
        readers: how many readers it admits at once (1 .. `READERS_MAX`).
    """

    def __init__(self, coord: AsyncCoordinator, store: AsyncFencedStore, name: str, *, readers: int) -> None:
        if not isinstance(coord, AsyncCoordinator):
            raise InvalidArgument("coord", f"must be a coordinator (connect_async), got {type(coord).__name__}")
        if not isinstance(store, AsyncFencedStore):
            raise InvalidArgument("store", f"must be a fenced store (open_store_async), got {type(store).__name__}")
        validate_int("readers", readers, 1, READERS_MAX)
        self.name = validate_scope(name, "name")
        self.scope = validate_scope(f"rw.{name}", "name")
        self.readers = readers
        self._slots = AsyncSemaphore(coord, self.scope, slots=readers)  # validates the scopes it names
        self._coord = coord
        self._store = store

    def __repr__(self) -> str:
        return f"<ReadWriteLock {self.name!r} readers={self.readers}>"

    async def acquire_read(self, *, ttl_ms: int, wait_ms: int | None = 0, holder: str | None = None) -> AsyncReadLease:
        """Take the gate, check in at the store, take a read slot, give the gate back.

        ``wait_ms`` bounds the whole acquisition (``None``: until granted, or the caller cancels).

        Raises:
            InvalidArgument: a bad ``ttl_ms``, ``wait_ms`` or ``holder`` (before any I/O).
            LockTimeout: the gate or a read slot stayed held for ``wait_ms``.
            LeaseLost: the gate's lease was lost before the slot was taken (nothing is held).
            StaleToken: the check-in was refused: this reader's gate lease lapsed and a newer
                holder checked in (nothing is held).
            BackendUnavailable: the coordinator or the store failed.
        """
        gate, holder, deadline_ns = await self._gate(ttl_ms, wait_ms, holder)
        slot: AsyncLease | None = None
        try:
            await self._check_in(READER_KEY, gate, holder)
            try:
                slot = await self._slots.acquire(ttl_ms=ttl_ms, wait_ms=_remaining_ms(deadline_ns, wait_ms),
                                                 holder=holder)
            except LockTimeout:
                raise LockTimeout(self.scope, int(wait_ms or 0)) from None
            gate.raise_if_lost()  # paused past the gate's lease: a writer may be in, so give the slot back
        except BaseException:
            if slot is not None:
                await _release_quietly(slot)
            await _release_quietly(gate)
            raise
        await _release_quietly(gate)
        return AsyncReadLease(self, gate.token, slot)

    async def _gate(self, ttl_ms: int, wait_ms: int | None, holder: str | None) -> tuple[AsyncLease, str, int]:
        """Check the arguments (before any I/O), then take the gate: its lease, the holder name, the deadline."""
        validate_ttl_ms(ttl_ms)
        validate_wait(wait_ms)
        holder = validate_holder(holder) if holder is not None else default_holder()
        deadline_ns = wait_deadline_ns(time.monotonic_ns(), wait_ms)
        return await self._coord.acquire(self.scope, ttl_ms=ttl_ms, wait_ms=wait_ms, holder=holder), holder, deadline_ns

    async def acquire_write(self, *, ttl_ms: int, wait_ms: int | None = 0, holder: str | None = None) -> AsyncLease:
        """Take the gate, wait until no reader holds a slot, check in; return the gate's lease.

        The lease's ``token`` goes with every write to `scope` (R1). ``wait_ms`` bounds the whole
        acquisition (``None``: until granted, or the caller cancels). Release the lease
        (``await lease.release()``) or use `write`.

        Raises:
            InvalidArgument: a bad ``ttl_ms``, ``wait_ms`` or ``holder`` (before any I/O).
            LockTimeout: the gate stayed held, or readers kept a slot, for ``wait_ms``.
            StaleToken: the check-in was refused (the gate lease lapsed meanwhile; nothing is held).
            LeaseLost: the gate's lease was known lost by the end (nothing is held).
            BackendUnavailable: the coordinator or the store failed.
        """
        gate, holder, deadline_ns = await self._gate(ttl_ms, wait_ms, holder)
        try:
            await self._drain(deadline_ns, wait_ms, ttl_ms, holder)
            await self._check_in(WRITER_KEY, gate, holder)
            gate.raise_if_lost()  # known lost already: do not hand out a lease that is not held
        except BaseException:
            await _release_quietly(gate)
            raise
        return gate

    async def _drain(self, deadline_ns: int, wait_ms: int | None, ttl_ms: int, holder: str) -> None:
        """Wait until every read slot was free once while the gate is held: take each one (queued
        behind its reader, first in, first out) and give it back at once."""
        for slot in range(self.readers):
            scope = self._slots.scope_of(slot)
            try:
                lease = await self._coord.acquire(scope, ttl_ms=ttl_ms, wait_ms=_remaining_ms(deadline_ns, wait_ms),
                                                  holder=holder, keepalive=False)
            except LockTimeout:
                raise LockTimeout(self.scope, int(wait_ms or 0)) from None
            await lease.release()

    async def _check_in(self, key: str, gate: AsyncLease, holder: str) -> None:
        """A fenced write of the gate's token at ``key``: raises the scope's mark to it (R1)."""
        await self._store.put(self.scope, key, holder, token=gate.token)

    @asynccontextmanager
    async def read(self, *, ttl_ms: int, wait_ms: int | None = 0,
                   holder: str | None = None) -> AsyncIterator[AsyncReadLease]:
        """``async with rw.read(ttl_ms=...) as reader:`` — `acquire_read`, then release at the end."""
        reader = await self.acquire_read(ttl_ms=ttl_ms, wait_ms=wait_ms, holder=holder)
        try:
            yield reader
        finally:
            await _release_quietly(reader.lease)

    @asynccontextmanager
    async def write(self, *, ttl_ms: int, wait_ms: int | None = 0,
                    holder: str | None = None) -> AsyncIterator[AsyncLease]:
        """``async with rw.write(ttl_ms=...) as lease:`` — `acquire_write`; inside, store writes to
        `scope` without ``token=`` carry the lease's token (K1); released at the end.

        Raises:
            LeaseLost: the lease was lost while the body ran (the body's own exception, if any,
                stays the one raised).
            and what `acquire_write` raises.
        """
        lease = await self.acquire_write(ttl_ms=ttl_ms, wait_ms=wait_ms, holder=holder)
        lease._enclosing = CURRENT_LEASE.get()
        context_token = CURRENT_LEASE.set(lease)
        try:
            yield lease
            if lease.lost:
                raise LeaseLost(lease.scope, lease.token, lease.lost_cause)
        finally:
            CURRENT_LEASE.reset(context_token)
            await _release_quietly(lease)

    async def readers_now(self) -> dict[int, str]:
        """The read slots held now and each reader's holder label (a snapshot)."""
        return await self._slots.holders()
