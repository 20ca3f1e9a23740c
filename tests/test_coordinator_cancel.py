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

import stockade
from stockade.core.leases import ScopeState
from stockade.testing.servers import postgres as pg_helper

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


# -- a client paused inside a coordinator transaction (PostgreSQL) ----------------------------------

PAUSED_INSIDE = r"""
import os, signal, sys
import stockade
from stockade.coordinators import postgres
from stockade.coordinators.postgres import _tx as tx
url, idle_ms = sys.argv[1], int(sys.argv[2])
postgres.PostgresRecords.idle_in_transaction_ms = idle_ms
real_commit = tx.PgTx.commit
frozen = []
def commit(self):  # frozen (once) between the unit's reads (its scope lock taken) and its COMMIT
    if not frozen:
        frozen.append(1)
        print("inside", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    real_commit(self)
tx.PgTx.commit = commit
coord = stockade.connect(url)
try:
    coord.acquire("frozen", ttl_ms=30_000, wait_ms=0)
except stockade.StockadeError as exc:
    print(type(exc).__name__, flush=True)
"""


def _release_beside_a_paused_unit(url: str, idle_ms: int) -> str:
    import signal
    import subprocess
    import sys

    from conftest import python_env

    coord = stockade.connect(url)
    held = coord.acquire("frozen", ttl_ms=30_000, keepalive=False)  # so the paused acquire takes the engine path
    paused = subprocess.Popen([sys.executable, "-c", PAUSED_INSIDE, url, str(idle_ms)], stdout=subprocess.PIPE,
                              text=True, env=python_env())
    try:
        assert paused.stdout is not None and paused.stdout.readline().strip() == "inside"
        try:
            held.release()  # needs the scope's lock, which the paused unit holds
            outcome = "released"
        except stockade.BackendUnavailable:
            outcome = "unavailable"
    finally:
        os.kill(paused.pid, signal.SIGCONT)
        paused.communicate(timeout=120)
        coord.close()
    return outcome


def test_a_client_paused_inside_its_transaction_frees_the_scope(pg_coord_url):
    """The server ends the paused unit's transaction after 2 s, within the 5 s lock wait of the others."""
    assert _release_beside_a_paused_unit(pg_coord_url, 2_000) == "released"


def test_control_a_long_idle_allowance_freezes_the_scope(pg_coord_url):
    assert _release_beside_a_paused_unit(pg_coord_url, 20_000) == "unavailable"
