"""A counting semaphore of N slots, each slot a lease with its own fencing token (docs/semaphore.md).

``AsyncSemaphore(coord, "exports", slots=3)`` names N scopes, ``sem.exports.0`` ..
``sem.exports.<N-1>``. `acquire` returns an `AsyncLease` on one free slot: at most N
holders at once, because each slot is an ordinary lease (one holder per scope, C4 and C5
hold per slot). The lease's ``token`` fences *that slot's* resource: write to scope
``lease.scope`` (or a resource keyed by the slot, `slot_of`), and a holder paused past its
lease is refused there once the slot's next holder has written (R1), exactly as with a lock.

Waiting: a free slot is taken at once. When all N are held, the waiter queues on one
slot (first in, first out within that slot) for at most `WAIT_SLICE_MS`, then looks at
every slot again, turn by turn, until ``wait_ms`` runs out. So a slot that frees is
taken within one slice, but the semaphore as a whole is not first in, first out: a
waiter queued on a slot that stays held may be passed by a later one that found
another slot free.

The semaphore is a recipe over the public client: it works on every coordinator backend,
sync (`Semaphore`) and async alike, and needs nothing more of them than leases.
"""

from __future__ import annotations

import random
import time

from stockade.client._async.coordinator import AsyncCoordinator, AsyncLease
from stockade.core.errors import InvalidArgument, LockTimeout
from stockade.core.leases import Contender, ScopeInfo, ScopeState
from stockade.core.limits import (
    CONTENDERS_MAX,
    LIST_PAGE_MAX,
    validate_int,
    validate_scope,
    validate_ttl_ms,
    validate_wait,
    wait_deadline_ns,
)

__all__ = ["AsyncSemaphore", "SLOTS_MAX", "WAIT_SLICE_MS"]

#: The most slots a semaphore may have (a full look at its slots is one acquire per slot).
SLOTS_MAX = 1_000
#: How long a waiter stays queued on one slot before it looks at every slot again.
WAIT_SLICE_MS = 100


class AsyncSemaphore:
    """N slots over ``coord``, each an ordinary lease on the scope ``sem.<name>.<k>``.

    Attributes:
        name: the semaphore's name (part of its slots' scopes).
        slots: how many holders it admits at once (1 .. `SLOTS_MAX`).
    """

    def __init__(self, coord: AsyncCoordinator, name: str, *, slots: int) -> None:
        if not isinstance(coord, AsyncCoordinator):
            raise InvalidArgument("coord", f"must be a coordinator (connect_async), got {type(coord).__name__}")
        validate_int("slots", slots, 1, SLOTS_MAX)
        if not isinstance(name, str):
            raise InvalidArgument("name", f"must be a str, got {type(name).__name__}")
        self.name = name
        self.slots = slots
        self._prefix = f"sem.{name}."
        validate_scope(self.scope_of(slots - 1), "name")
        self._coord = coord

    def __repr__(self) -> str:
        return f"<Semaphore {self.name!r} slots={self.slots}>"

    def scope_of(self, slot: int) -> str:
        """The scope of slot ``slot``: ``sem.<name>.<slot>``."""
        validate_int("slot", slot, 0, self.slots - 1)
        return f"{self._prefix}{slot}"

    def slot_of(self, lease: AsyncLease) -> int:
        """The slot a lease of this semaphore holds.

        Raises:
            InvalidArgument: the lease is not on one of this semaphore's slots.
        """
        scope = lease.scope if isinstance(lease, AsyncLease) else ""
        number = scope[len(self._prefix):] if scope.startswith(self._prefix) else ""
        if not number.isdigit() or not 0 <= int(number) < self.slots or str(int(number)) != number:
            raise InvalidArgument("lease", f"not a lease on a slot of semaphore {self.name!r}")
        return int(number)

    async def acquire(self, *, ttl_ms: int, wait_ms: int | None = 0, holder: str | None = None) -> AsyncLease:
        """A lease on one free slot, waiting up to ``wait_ms`` for one to free (``None``: until one does,
        or the caller cancels).

        The lease is kept alive in the background, as `AsyncCoordinator.acquire`'s; release
        it (``await lease.release()``) or use ``async with await sem.acquire(...)``.

        Raises:
            InvalidArgument: a bad ``ttl_ms``, ``wait_ms`` or ``holder``.
            LockTimeout: every slot stayed held (or delayed) for ``wait_ms``; its ``scope`` is
                the semaphore's first slot.
            BackendUnavailable: the coordinator cannot be reached.
        """
        validate_ttl_ms(ttl_ms)
        validate_wait(wait_ms)
        deadline_ns = wait_deadline_ns(time.monotonic_ns(), wait_ms)
        turn = random.randrange(self.slots)  # spread the contenders over the slots
        while True:
            lease = await self._sweep(turn, ttl_ms, holder)
            if lease is not None:
                return lease
            remaining_ms = (deadline_ns - time.monotonic_ns()) // 1_000_000
            if remaining_ms <= 0:
                raise LockTimeout(self.scope_of(0), int(wait_ms or 0))
            turn = (turn + 1) % self.slots
            try:  # queue on one slot for a slice, then look at all of them again
                return await self._coord.acquire(self.scope_of(turn), ttl_ms=ttl_ms,
                                                 wait_ms=min(remaining_ms, WAIT_SLICE_MS), holder=holder)
            except LockTimeout:
                continue

    async def _sweep(self, first: int, ttl_ms: int, holder: str | None) -> AsyncLease | None:
        """One look at the slots (a read), then an acquire without waiting of each that looked free,
        from ``first`` on: a full semaphore costs its waiters reads, not write transactions."""
        taken = await self._taken()
        for step in range(self.slots):
            slot = (first + step) % self.slots
            if slot in taken:
                continue
            try:
                return await self._coord.acquire(self.scope_of(slot), ttl_ms=ttl_ms, wait_ms=0, holder=holder)
            except LockTimeout:
                continue
        return None

    async def _taken(self) -> dict[int, ScopeInfo]:
        """The slots held or delayed now, read a page at a time through ``scopes`` (a snapshot)."""
        taken: dict[int, ScopeInfo] = {}
        after = self._prefix
        for _ in range(self.slots // LIST_PAGE_MAX + 2):
            page = await self._coord.scopes(after=after, limit=LIST_PAGE_MAX)
            for info in page:
                number = info.scope[len(self._prefix):]
                if not info.scope.startswith(self._prefix):
                    return taken
                if number.isdigit() and int(number) < self.slots and info.state != ScopeState.FREE:
                    taken[int(number)] = info
            if len(page) < LIST_PAGE_MAX:
                break
            after = page[-1].scope
        return taken

    async def contenders(self, *, limit: int = CONTENDERS_MAX) -> dict[int, list[Contender]]:
        """Per slot with anyone on it: its holder first, then the waiters queued on that slot, in the
        order that slot serves them (at most ``limit`` per slot; one ``contenders`` read per slot).

        A waiter queues on one slot at a time, for a slice (`WAIT_SLICE_MS`), then looks at every
        slot again: the semaphore as a whole has no single line, and a waiter between two slices is
        on none. A snapshot; holder names only.

        Raises:
            InvalidArgument: a bad limit.
        """
        validate_int("limit", limit, 1, CONTENDERS_MAX)
        found: dict[int, list[Contender]] = {}
        for slot in range(self.slots):
            line = await self._coord.contenders(self.scope_of(slot), limit=limit)
            if line:
                found[slot] = line
        return found

    async def holders(self) -> dict[int, str]:
        """The slots held now and each one's holder label (a snapshot, read through ``scopes``)."""
        return {slot: str(info.holder) for slot, info in sorted((await self._taken()).items())
                if info.state == ScopeState.HELD}
