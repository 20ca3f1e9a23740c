"""The coordinator suite's waits: C4, fair and bounded waiting.

A wait with a deadline ends in `LockTimeout` and takes no token; a waiter is granted when the
holder releases, not when its TTL ends; several waiters are served in arrival order. A wait until
granted (``wait_ms=None``) keeps its place across a server's per-request caps, and a cancelled one
(a cancelled task, a Ctrl-C) leaves no waiter behind. Part of
`stockade.testing.conformance.coordinator`, which runs it; its ``capped_wait`` fixture is a
`CappedWait`.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import pytest

from stockade import LockTimeout
from stockade.testing.conformance.coordinator_helpers import (
    _WAIT_S,
    _await_waiters,
    _close,
    _follows,
    _fresh_scope,
    _in_background,
    _interrupted_when_queued,
)

#: The C4 test's waiters, queued one after another.
FIFO_WAITERS = 4


def test_wait_times_out_then_fifo_grant(client, coord_url):
    coord = client.connect(coord_url)
    held = client.run(coord.acquire("q", ttl_ms=10_000))  # held until released, however late its renewals
    first = held.token.value
    t0 = time.monotonic()
    with pytest.raises(LockTimeout):
        client.run(coord.acquire("q", ttl_ms=1000, wait_ms=150))
    assert time.monotonic() - t0 >= 0.14
    client.run(held.release())
    lease = client.run(coord.acquire("q", ttl_ms=1000, wait_ms=0))
    assert _follows(coord, lease.token.value, first)  # dense: the timed-out waiter took no token
    client.run(lease.release())


def test_waiter_is_granted_when_holder_releases(client, coord_url):
    coord = client.connect(coord_url)
    held = client.run(coord.acquire("fifo", ttl_ms=5000))

    async def body_async():
        waiter = asyncio.ensure_future(coord.acquire("fifo", ttl_ms=5000, wait_ms=5000))
        await asyncio.sleep(0.2)
        assert not waiter.done()
        t0 = time.monotonic()
        await held.release()
        lease = await waiter
        return lease, time.monotonic() - t0

    def body_sync():
        got = {}
        def wait() -> None:
            got["lease"] = coord.acquire("fifo", ttl_ms=5000, wait_ms=5000)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.2)
        assert thread.is_alive()
        t0 = time.monotonic()
        held.release()
        thread.join(10)
        return got["lease"], time.monotonic() - t0

    lease, handoff_s = client.run(body_async() if client.mode == "async" else body_sync())
    assert _follows(coord, lease.token.value, held.token.value)
    assert handoff_s < 1.0  # granted on release, not by TTL
    client.run(lease.release())


def test_c4_waiters_are_served_in_arrival_order(client, coord_url):
    coord = client.connect(coord_url)
    held = client.run(coord.acquire("fifo-n", ttl_ms=5_000))
    order: list[int] = []

    def waiter(index: int) -> Callable[[], Any]:
        async def wait_async() -> int:
            lease = await coord.acquire("fifo-n", ttl_ms=5_000, wait_ms=_WAIT_S * 1000)
            order.append(index)
            await lease.release()
            return int(lease.token.value)

        def wait_sync() -> int:
            lease = coord.acquire("fifo-n", ttl_ms=5_000, wait_ms=_WAIT_S * 1000)
            order.append(index)
            lease.release()
            return int(lease.token.value)

        return wait_async if client.mode == "async" else wait_sync

    joins = []
    for index in range(FIFO_WAITERS):
        joins.append(_in_background(client, waiter(index)))
        _await_waiters(client, coord, "fifo-n", index + 1)  # queued, in this order, before the next one starts
    client.run(held.release())
    tokens = [join() for join in joins]
    assert order == list(range(FIFO_WAITERS)), order
    assert [held.token.value, *tokens] == sorted({held.token.value, *tokens})  # the tokens in the same order
    _close(client, coord)


# -- waiting until granted (wait_ms=None) ---------------------------------------------------------


class CappedWait(Protocol):
    """The backend under test as a wait until granted meets it (``capped_wait`` fixture).

    Attributes:
        url: a coordinator url of the backend; where the backend answers one request's wait at
            a per-request cap, one whose cap is small (a served coordinator: ``--wait-ms-cap``).
        cap_ms: that cap, or None.
        uncapped: None, or in words why the backend has no per-request cap to wait across (its
            client port waits in one call); the rounds are not counted there, FIFO order still is.
    """

    url: str
    cap_ms: int | None
    uncapped: str | None


#: Caps a wait until granted must outlast, keeping its place (the acceptance's "at least 3").
FOREVER_CAPS = 3
#: Waits until granted cancelled by the cancel test, per backend and client (``STOCKADE_LONG=1``: 50).
FOREVER_CANCELS = 50 if os.environ.get("STOCKADE_LONG") == "1" else 3
#: How long a cancelled wait's waiter may stay queued, in seconds: a served coordinator holds the place of a
#: wait cancelled between two of its requests for `stockade.server._tickets.TICKET_HOLD_MS` (5 s).
FOREVER_GONE_S = 10


def test_c4_a_wait_until_granted_keeps_its_place_across_caps(client, capped_wait):
    """Two waits until granted, queued one after the other behind a holder, each outlast `FOREVER_CAPS` of the
    server's per-request caps; the first queued is granted first, the second after it, and never was a
    third waiter in the queue (a renewed wait that queued again would be one, at the back)."""
    scope = _fresh_scope("forever-fifo")
    holder, first, second = (client.connect(capped_wait.url) for _ in range(3))
    held = client.run(holder.acquire(scope, ttl_ms=5_000))
    order: list[str] = []

    def waiter(coord: Any, name: str) -> Callable[[], Any]:
        async def wait_async() -> int:
            lease = await coord.acquire(scope, ttl_ms=5_000, wait_ms=None)
            order.append(name)
            await lease.release()
            return int(lease.token.value)

        def wait_sync() -> int:
            lease = coord.acquire(scope, ttl_ms=5_000, wait_ms=None)
            order.append(name)
            lease.release()
            return int(lease.token.value)

        return wait_async if client.mode == "async" else wait_sync

    join_first = _in_background(client, waiter(first, "first"))
    _await_waiters(client, holder, scope, 1)
    join_second = _in_background(client, waiter(second, "second"))
    _await_waiters(client, holder, scope, 2)
    most = least = 2
    if capped_wait.uncapped is None:
        deadline = time.monotonic() + _WAIT_S
        while min(first._port.wait_rounds, second._port.wait_rounds) < FOREVER_CAPS:
            waiters = client.run(holder.inspect(scope)).waiters
            most, least = max(most, waiters), min(least, waiters)
            assert time.monotonic() < deadline, f"{FOREVER_CAPS} caps of {capped_wait.cap_ms} ms not seen"
            if client.mode == "sync":
                time.sleep(0.005)
        # Release just after the first waiter's next cap: a wait that queued again would now be behind the second.
        seen = first._port.wait_rounds
        while first._port.wait_rounds == seen:
            waiters = client.run(holder.inspect(scope)).waiters
            most, least = max(most, waiters), min(least, waiters)
            assert time.monotonic() < deadline, f"no cap of {capped_wait.cap_ms} ms seen in {_WAIT_S} s"
            if client.mode == "sync":
                time.sleep(0.001)
    rounds = (first._port.wait_rounds, second._port.wait_rounds)
    assert most == 2, f"a renewed wait queued again: {most} waiters"
    assert least == 2, f"a renewed wait left the queue between two requests: {least} waiter(s) seen"
    client.run(held.release())
    tokens = [join_first(), join_second()]
    assert order == ["first", "second"], f"served out of arrival order: {order} after {rounds} caps"
    assert held.token.value < tokens[0] < tokens[1]
    print(f"waits until granted served in arrival order after {rounds} caps of {capped_wait.cap_ms} ms"
          if capped_wait.uncapped is None else f"waits until granted served in arrival order ({capped_wait.uncapped})")
    for coord in (holder, first, second):
        _close(client, coord)


def test_cancelling_a_wait_until_granted_leaves_no_waiter(client, capped_wait):
    """`FOREVER_CANCELS` waits until granted, each cancelled once queued (async: its task cancelled; sync: a
    KeyboardInterrupt, SIGINT from a timer thread, in the thread that waits); after each, the scope's queue is
    empty again, as the coordinator reports it (a served one: the client's disconnect ended the wait)."""
    scope = _fresh_scope("forever-cancel")
    holder, waiting = client.connect(capped_wait.url), client.connect(capped_wait.url)
    held = client.run(holder.acquire(scope, ttl_ms=10_000))
    left_behind = cancels = 0
    for _ in range(FOREVER_CANCELS):
        if client.mode == "async":
            task = client.loop.create_task(waiting.acquire(scope, ttl_ms=5_000, wait_ms=None))
            _await_waiters(client, holder, scope, 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                client.run(asyncio.wait_for(task, _WAIT_S))
        else:
            with pytest.raises(KeyboardInterrupt):
                _interrupted_when_queued(lambda: waiting.acquire(scope, ttl_ms=5_000, wait_ms=None),
                                         lambda: holder.inspect(scope).waiters >= 1)
        deadline = time.monotonic() + FOREVER_GONE_S
        while (waiters := client.run(holder.inspect(scope)).waiters) > 0 and time.monotonic() < deadline:
            if client.mode == "sync":
                time.sleep(0.005)
        left_behind += waiters > 0
        cancels += 1
        assert left_behind == 0, f"{left_behind} of {cancels} cancelled waits left a waiter behind"
    print(f"cancelled waits that left a waiter behind: {left_behind} of {FOREVER_CANCELS} ({client.mode})")
    client.run(held.release())
    _close(client, waiting)
    _close(client, holder)


__all__ = [name for name in dir() if name.startswith("test_")]
