"""Waits until granted over HTTP: a queue place that outlives the request waiting in it.

An acquire with ``"wait_ms": null`` waits until granted. One HTTP request waits
at most the server's per-request cap (``WAIT_MS_MAX``, or ``--wait-ms-cap``), so
the wait runs here as a task of its own, named by the ticket the client sent
(a secret it drew), and the requests take turns watching it:

- the first request with a ticket starts the wait: an acquire with no deadline
  on the lease service, queued FIFO with every other waiter (C4);
- at the cap the request answers 409 ``lock-timeout`` with the ticket, and the
  wait goes on; the client sends the next request with the same ticket at once
  and watches the same wait: its place in the queue is the one it had;
- a grant that comes while no request watches is kept for the next one, renewed
  when it is handed over (the client's lease deadline counts from that
  request's send time, K2, and the renewal starts the TTL after it); a kept
  grant that lapsed before the next request came (its TTL shorter than the gap)
  cannot be handed over: the wait starts again, at the back of the queue (its
  place was served), and that request watches it, so an acquire never answers
  "not held" (schemathesis found that 410);
- nobody comes back within `TICKET_HOLD_MS` (the client was cancelled between
  two requests, or died): the wait is cancelled, leaving the queue, and a grant
  it got is released;
- a request cancelled while it watches (the client disconnected: a cancelled
  task, a KeyboardInterrupt, a closed handle) cancels the wait at once: no
  waiter is left behind.

Tickets live in this process only: after a restart the server knows none, and
a client that comes back with its ticket starts a new wait, at the back of the
queue (docs/leases.md, "Waiting until granted").
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Protocol

from stockade.core.errors import InvalidArgument, LimitExceeded, LockTimeout, NotHolder
from stockade.core.leases import Lease

__all__ = ["WaitTickets", "TICKET_HOLD_MS", "TICKETS_MAX", "TICKET_PATTERN", "validate_ticket"]

#: How long a wait until granted keeps its place with no request watching it (between the
#: answer at the cap and the client's next request: one round trip, normally).
TICKET_HOLD_MS = 5_000
#: Waits until granted at once in this server (429 past it).
TICKETS_MAX = 10_000
#: A queue ticket, as the OpenAPI document states it.
TICKET_PATTERN = "^[A-Za-z0-9_-]{16,64}$"
_TICKET_RE = re.compile(TICKET_PATTERN.strip("^$"))


def validate_ticket(ticket: object) -> str:
    """A queue ticket: 16..64 of ``[A-Za-z0-9_-]`` (the client draws it at random; it is a secret)."""
    if not isinstance(ticket, str) or not _TICKET_RE.fullmatch(ticket):
        raise InvalidArgument("ticket", "must be 16..64 characters of A-Z a-z 0-9 _ -")
    return ticket


class _Leases(Protocol):
    async def acquire(self, scope: str, *, holder: str, ttl_ms: int, wait_ms: int | None) -> Lease: ...

    async def renew(self, lease_id: str) -> Lease: ...

    async def release(self, lease_id: str) -> bool: ...


@dataclass(slots=True)
class _Wait:
    scope: str
    task: asyncio.Task[Lease]
    watched: bool = False
    hold: asyncio.TimerHandle | None = None


class WaitTickets:
    """The waits until granted of one server, by ticket.

    Args:
        leases: the lease service (its ``acquire`` takes ``wait_ms=None``).
        hold_ms: `TICKET_HOLD_MS`, or less for a test.
    """

    def __init__(self, leases: _Leases, *, hold_ms: int = TICKET_HOLD_MS) -> None:
        self.leases = leases
        self.hold_ms = hold_ms
        self.waits: dict[tuple[str, str], _Wait] = {}  # by (scope, ticket): a ticket is a wait of one scope
        self._cleanups: set[asyncio.Task[Any]] = set()

    async def acquire(self, scope: str, ticket: str, *, holder: str, ttl_ms: int, cap_ms: int) -> Lease:
        """Watch the wait of ``ticket`` (started now if this server does not know it) for up to ``cap_ms``.

        Raises:
            LockTimeout: (with ``ticket``) not granted within ``cap_ms``, or at once when another
                request watches the wait already; the wait goes on.
            LimitExceeded: `TICKETS_MAX` waits already.
            and what the lease service's acquire raises (the wait is over then).
        """
        key = (scope, ticket)
        wait = self.waits.get(key)
        if wait is None:
            if len(self.waits) >= TICKETS_MAX:
                raise LimitExceeded("wait_tickets_max", TICKETS_MAX)
            task = asyncio.get_running_loop().create_task(
                self.leases.acquire(scope, holder=holder, ttl_ms=ttl_ms, wait_ms=None))
            wait = self.waits[key] = _Wait(scope, task)
        elif wait.watched:
            raise LockTimeout(scope, 0, ticket=ticket)  # one request watches a wait at a time
        if wait.hold is not None:
            wait.hold.cancel()
            wait.hold = None
        granted_unwatched = wait.task.done()
        wait.watched = True
        try:
            done, _ = await asyncio.wait((wait.task,), timeout=cap_ms / 1000)
        except asyncio.CancelledError:
            self._drop(key)  # the client went away: no waiter stays behind
            raise
        finally:
            wait.watched = False
        if not done:
            wait.hold = asyncio.get_running_loop().call_later(self.hold_ms / 1000, self._drop, key)
            raise LockTimeout(scope, cap_ms, ticket=ticket)
        del self.waits[key]
        lease = wait.task.result()
        if granted_unwatched:
            # Granted while nobody watched: its TTL began before this request was sent.
            try:
                lease = await self._renewed(lease)
            except NotHolder:  # it lapsed meanwhile: wait again, at the back (this request starts it)
                return await self.acquire(scope, ticket, holder=holder, ttl_ms=ttl_ms, cap_ms=cap_ms)
        return lease

    async def _renewed(self, lease: Lease) -> Lease:
        try:
            return await self.leases.renew(lease.lease_id)
        except asyncio.CancelledError:
            self._background(self.leases.release(lease.lease_id))
            raise

    def _drop(self, key: tuple[str, str]) -> None:
        """End the wait of ``key`` (scope, ticket): cancelled if still queued; its grant released if it got one."""
        wait = self.waits.pop(key, None)
        if wait is None:
            return
        if wait.hold is not None:
            wait.hold.cancel()
        if not wait.task.done():
            wait.task.cancel()  # the lease service leaves the queue (and gives back a grant that raced it)
        elif not wait.task.cancelled() and wait.task.exception() is None:
            self._background(self.leases.release(wait.task.result().lease_id))

    def _background(self, call: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(call)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def aclose(self) -> None:
        """Cancel every wait (the server stops)."""
        for key in list(self.waits):
            self._drop(key)
        if self._cleanups:
            await asyncio.gather(*self._cleanups, return_exceptions=True)

