"""Leader election: a leadership is a lease on the election's scope (docs/election.md).

``coord.elect(name, ttl_ms=...)`` waits its turn (first in, first out, C4)
and returns the leadership (`AsyncLeadership`). Its ``token`` is the lease's fencing token:
the term of this leader, greater than every earlier leader's (C1). Every write
the leader makes carries it, and the fenced resource refuses a former leader's
writes once the new one has written (R1). ``lost`` and ``wait_lost`` are the
lease's (K2): a refused renewal, or the local deadline passed.

Anyone can read the leader (`leader_of` over ``inspect``), the line of
candidates (``coord.contenders(name)``: the leader, then who waits, in order)
and wait for a change: `watch_leader` polls ``inspect`` at a bounded interval, on every
backend alike (no port offers a native watch).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from stockade.client._leader import LeaderInfo, changed, leader_of, validate_watch
from stockade.client._shared import CURRENT_LEASE
from stockade.core.leases import Contender
from stockade.core.limits import CONTENDERS_MAX
from stockade.core.tokens import FencingToken
from stockade.transport.io import AsyncIO

__all__ = ["AsyncLeadership", "watch_leader"]


class AsyncLeadership:
    """This process leads the election ``name`` until it resigns or its lease is lost.

    Believing it leads is not enough to act safely: a leader paused past its
    lease still believes it, and another leader may already write. Pass
    ``token`` with every write; the fenced resource is what decides (R1).

    ``async with leadership:`` makes the lease the context's current one (store
    writes to ``name`` without ``token=`` carry it, K1) and resigns at the end.
    The body is not interrupted on loss: check ``lost`` or `raise_if_lost`.

    Attributes:
        name: the election (the lease's scope).
        holder: the identity published with the lease (what `leader` shows).
        token: the term's `FencingToken`: attach it to every write.
        lease: the underlying `AsyncLease` (kept alive in the background).
    """

    def __init__(self, name: str, lease: Any) -> None:
        self.name = name
        self.lease = lease
        self.holder: str = lease.holder
        self.token: FencingToken = lease.token
        self._context_token: Any = None

    def __repr__(self) -> str:
        return f"<Leadership name={self.name!r} term={self.term} holder={self.holder!r} lost={self.lost}>"

    @property
    def term(self) -> int:
        """The term's number: the token's value, greater than any earlier leader's."""
        return self.token.value

    @property
    def lost(self) -> bool:
        """True once the leadership is known or presumed lost (or resigned). Never turns back."""
        return bool(self.lease.lost) or bool(self.lease._released)

    @property
    def lost_cause(self) -> str:
        return "resigned" if self.lease._released and not self.lease.lost else str(self.lease.lost_cause)

    @property
    def remaining_ms(self) -> int:
        """Milliseconds until the local deadline (0 once lost or resigned)."""
        return int(self.lease.remaining_ms)

    def raise_if_lost(self) -> None:
        """Raises `LeaseLost` if the leadership is lost or resigned."""
        self.lease.raise_if_lost()

    async def wait_lost(self, timeout_ms: int | None = None) -> bool:
        """Wait until the leadership is lost, at most ``timeout_ms``; returns `lost`."""
        await self.lease.wait_lost(timeout_ms)
        return self.lost

    async def contenders(self, *, limit: int = CONTENDERS_MAX) -> list[Contender]:
        """The election's line: this leader first while it leads (``holding=True``), then the candidates
        waiting in `elect`, in the order they will lead (C4); each by its published identity. A snapshot.
        Anyone else reads the same with ``coord.contenders(name)``."""
        return list(await self.lease.contenders(limit=limit))

    async def resign(self) -> None:
        """Step down: stop the keepalive and release the lease, so the next candidate is granted at once.

        Idempotent. Writes already sent with ``token`` stay valid until the
        next leader writes; nothing more should be sent with it.
        """
        await self.lease.release()

    async def __aenter__(self) -> AsyncLeadership:
        self.lease._enclosing = CURRENT_LEASE.get()
        self._context_token = CURRENT_LEASE.set(self.lease)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        context_token, self._context_token = self._context_token, None
        if context_token is not None:
            CURRENT_LEASE.reset(context_token)
        await self.resign()


async def watch_leader(
    inspect: Callable[[str], Any],
    name: str,
    *,
    since: LeaderInfo | None,
    timeout_ms: int,
    poll_ms: int,
) -> LeaderInfo | None:
    """Poll ``inspect(name)`` (the coordinator's) every ``poll_ms`` until the leader differs
    from ``since``, at most ``timeout_ms``.

    Returns the leader read last: another term than ``since`` (a new leader,
    or None when nobody leads any more), or, when the timeout ran out, the same.
    """
    validate_watch(since, timeout_ms, poll_ms)
    end_ns = time.monotonic_ns() + timeout_ms * 1_000_000
    while True:
        now = leader_of(await inspect(name))
        remaining_ns = end_ns - time.monotonic_ns()
        if changed(since, now) or remaining_ns <= 0:
            return now
        await AsyncIO.sleep(min(poll_ms * 1_000_000, remaining_ns) / 1e9)

