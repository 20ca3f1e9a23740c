"""An async acquire cancelled while its attempt is in flight leaves nothing granted (PostgreSQL).

The PostgreSQL port runs each attempt in a worker thread, which a cancellation
cannot stop. Its withdrawal (leave the queue, give back a grant) must run after
that attempt, not beside it; the control lets it run beside and the attempt's
grant is left behind until its TTL.
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
from helpers import postgres as pg_helper

import stockade
from stockade.core.leases import ScopeState

pytestmark = pytest.mark.skipif(
    not pg_helper.available() and os.environ.get("CI") != "true", reason="PostgreSQL 15 is not installed"
)


async def _cancel_mid_attempt(url: str, *, gate: bool) -> ScopeState:
    coord = await stockade.connect_async(url)
    port = coord._port
    entered, proceed, attempted, withdrawn = (threading.Event() for _ in range(4))
    real_attempt, real_withdraw = port.waking.attempt, port._withdraw

    def slow_attempt(scope, **arguments):
        entered.set()
        proceed.wait(60)
        try:
            return real_attempt(scope, **arguments)
        finally:
            attempted.set()

    def withdraw(*arguments):
        real_withdraw(*arguments)
        withdrawn.set()

    port.waking.attempt = slow_attempt
    port._withdraw = withdraw
    if not gate:  # control: the attempt does not take the gate the withdrawal waits on
        port._attempt = lambda _gate, scope, **arguments: port.waking.attempt(scope, **arguments)
    task = asyncio.create_task(coord.acquire("cancelled", ttl_ms=60_000, wait_ms=0))
    assert await asyncio.to_thread(entered.wait, 60)
    task.cancel()
    if not gate:
        assert await asyncio.to_thread(withdrawn.wait, 60)  # withdrew while the attempt was still pending
    proceed.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(attempted.wait, 60) and await asyncio.to_thread(withdrawn.wait, 60)
    info = await coord.inspect("cancelled")
    await coord.aclose()
    return info.state


def test_an_acquire_cancelled_mid_attempt_leaves_no_grant(pg_coord_url):
    assert asyncio.run(_cancel_mid_attempt(pg_coord_url, gate=True)) is ScopeState.FREE


def test_control_a_withdrawal_beside_the_attempt_leaves_its_grant(pg_coord_url):
    assert asyncio.run(_cancel_mid_attempt(pg_coord_url, gate=False)) is ScopeState.HELD
