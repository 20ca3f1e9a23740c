"""``await stockade.connect_async(url)`` and ``async with``; no blocking request on the event loop.

The loop test freezes a real `stockade serve` with SIGSTOP, so that the
cluster id request hangs until its timeout, and counts the ticks another task
makes meanwhile. The control makes the old blocking request on the loop:
no tick can happen during it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

import stockade
from stockade import BackendUnavailable, InvalidArgument
from stockade.client import AsyncCoordinator
from stockade.client._shared import http_endpoint
from stockade.coordinators.http._async.open import remote_cluster_id

TICK_S = 0.01
TIMEOUT_MS = 1000


def _urls(tmp_path, server):
    return [server.url, f"sqlite:///{tmp_path / 'coord.db'}?process=embedded", f"memory://{tmp_path.name}"]


def test_await_and_async_with(tmp_path, serve):
    server = serve()
    for url in _urls(tmp_path, server):
        with stockade.connect(url) as sync_coord:
            expected = sync_coord.cluster_id

        async def main(url=url, expected=expected):
            coord = await stockade.connect_async(url)
            assert isinstance(coord, AsyncCoordinator) and coord.cluster_id == expected
            assert await coord is coord  # awaiting again is harmless
            async with coord.lock("s", ttl_ms=1000) as lease:
                assert lease.token.cluster == expected
            await coord.aclose()
            async with stockade.connect_async(url) as coord:
                assert coord.cluster_id == expected
                assert (await coord.inspect("s")).last_token >= 1

        asyncio.run(main())


def test_inside_a_loop_the_cluster_id_comes_with_the_first_await(serve):
    server = serve()

    async def main():
        coord = stockade.connect_async(server.url)  # no I/O yet
        with pytest.raises(InvalidArgument, match="await"):
            _ = coord.cluster_id
        lease = await coord.acquire("s", ttl_ms=1000)  # a first use opens it too
        assert coord.cluster_id == lease.token.cluster
        await lease.release()
        await coord.aclose()

    asyncio.run(main())


async def _ticks_during(call) -> tuple[int, BaseException | None]:
    ticks = 0
    running = True

    async def ticker():
        nonlocal ticks
        while running:
            await asyncio.sleep(TICK_S)
            ticks += 1

    task = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)  # the ticker is waiting on its first sleep
    before = ticks
    error = None
    try:
        await call()
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        error = exc
    during = ticks - before
    running = False
    await task
    return during, error


def test_connect_async_does_not_block_the_loop_on_a_frozen_server(serve):
    server = serve()
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        async def connect():
            await stockade.connect_async(server.url, timeout_ms=TIMEOUT_MS)

        async def blocking_control():
            # What connect_async did before: one blocking round trip on the loop's thread.
            remote_cluster_id(http_endpoint(server.url, timeout_ms=TIMEOUT_MS))

        async def main():
            t0 = time.monotonic()
            ticks, error = await _ticks_during(connect)
            elapsed_s = time.monotonic() - t0
            control_ticks, control_error = await _ticks_during(blocking_control)
            return ticks, error, elapsed_s, control_ticks, control_error

        ticks, error, elapsed_s, control_ticks, control_error = asyncio.run(main())
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    print(f"\n[figure] ticks of another task during a {TIMEOUT_MS} ms connect to a frozen server: "
          f"{ticks} (async connect) vs {control_ticks} (control: blocking request on the loop)")
    assert isinstance(error, BackendUnavailable) and isinstance(control_error, BackendUnavailable)
    assert elapsed_s >= TIMEOUT_MS / 1000 * 0.9
    assert control_ticks == 0  # the control must fail the property
    assert ticks >= 10  # ~100 on an idle machine; a busy one still ticks


def test_open_store_async_inside_a_loop(serve):
    server = serve()
    with stockade.connect(server.url) as coord:
        cluster_id = coord.cluster_id

    async def main():
        store = stockade.open_store_async(server.url)  # no I/O yet
        with pytest.raises(InvalidArgument, match="await"):
            _ = store.cluster_id
        assert (await store).cluster_id == cluster_id
        await store.aclose()
        async with stockade.open_store_async(server.url, cluster_id=cluster_id) as store:
            assert await store.high_water("s") == 0
        with pytest.raises(InvalidArgument, match="differs"):
            await stockade.open_store_async(server.url, cluster_id="fedcba9876543210")
        wrong = stockade.open_store_async(server.url, cluster_id="fedcba9876543210")
        with pytest.raises(InvalidArgument, match="differs"):
            await wrong.high_water("s")  # a first use checks it too
        await wrong.aclose()

    asyncio.run(main())


def test_outside_a_loop_connect_async_still_opens_at_once(serve):
    # No loop to block: the cluster id is fetched by the call, as before.
    server = serve()
    coord = stockade.connect_async(server.url)
    with stockade.connect(server.url) as sync_coord:
        assert coord.cluster_id == sync_coord.cluster_id
    asyncio.run(coord.aclose())
