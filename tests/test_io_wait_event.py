"""`AsyncIO.wait_event` keeps a cancellation that arrives in the step its event is set.

The keepalive waits on its stop event with it: a cancellation lost there would
leave a cancelled keepalive renewing. ``asyncio.wait_for`` on Python 3.11 loses
it (it returns the inner result instead); the control shows that it does here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from stockade.transport.io import AsyncIO

Waiter = Callable[[asyncio.Event, float], Awaitable[bool]]


async def _wait_for(event: asyncio.Event, timeout_s: float) -> bool:
    """The old body (the control)."""
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        pass
    return event.is_set()


async def _cancel_as_it_is_set(wait: Waiter) -> str:
    event = asyncio.Event()
    task = asyncio.ensure_future(wait(event, 10.0))
    for _ in range(3):  # the task is waiting on the event
        await asyncio.sleep(0)
    event.set()
    task.cancel()  # in the same step: neither has run yet
    try:
        await task
    except asyncio.CancelledError:
        return "cancelled"
    return "lost"


def test_a_cancel_arriving_with_the_event_is_kept() -> None:
    outcomes = [asyncio.run(_cancel_as_it_is_set(AsyncIO.wait_event)) for _ in range(20)]
    assert outcomes.count("cancelled") == 20, outcomes


def test_control_wait_for_loses_it() -> None:
    outcomes = [asyncio.run(_cancel_as_it_is_set(_wait_for)) for _ in range(20)]
    assert outcomes.count("lost") == 20, outcomes


def test_it_still_times_out_and_sees_a_set_event() -> None:
    async def run() -> tuple[bool, bool]:
        event = asyncio.Event()
        late = await AsyncIO.wait_event(event, 0.01)
        asyncio.get_running_loop().call_soon(event.set)
        return late, await AsyncIO.wait_event(event, 10.0)

    assert asyncio.run(run()) == (False, True)
