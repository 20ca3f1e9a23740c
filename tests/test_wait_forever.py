"""Waiting until granted (``wait_ms=None``): the controls of the conformance suite's two tests, a served
coordinator's restart under a waiter, and bad input (docs/leases.md, "Waiting until granted").

The suite's tests (`stockade.testing.conformance.coordinator`) run on every backend in
tests/test_coordinator_conformance.py; here the same tests run against broken client ports
(`stockade.testing.mutants`), and each must fail.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from conftest import HELPERS, WAIT_CAP_MS, AsyncRunner, CappedWait, ServeProcess, SyncRunner

import stockade
from stockade import InvalidArgument
from stockade.testing.conformance import coordinator as suite
from stockade.testing.conformance import coordinator_waits
from stockade.testing.mutants import MUTANTS

#: Runs of the FIFO test against the control. The control's waiter is out of the queue for one round trip
#: per cap (seen by a look at the queue that lands then, or by a release that does: the second is served
#: first); the control must be caught in at least one run.
CONTROL_RUNS = 3


def _broken(runner_class: type, name: str) -> object:
    class Broken(runner_class):  # type: ignore[misc, valid-type]
        handles: list[Any]  # what it opened, closed by `_close_handles` after a failed (control) run

        def connect(self, url, **options):
            handle = super().connect(url, **options)
            MUTANTS[name].wrap(handle._port)
            self.handles.append(handle)
            return handle

    broken = Broken()
    broken.handles = []
    return broken


def _close_handles(runner) -> None:
    """Close the handles a failed (control) run left open: their leases, and the keepalives renewing them."""
    while runner.handles:
        handle = runner.handles.pop()
        runner.run(handle.aclose() if runner.mode == "async" else handle.close())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_fifo_test_catches_a_wait_that_queues_again_at_each_cap(capped_server, mode):
    """Control: the suite's FIFO-across-caps test, on a served coordinator (``--wait-ms-cap 100``), with each
    cap's renewal sent as a new acquire (``wait-requeued-at-cap``): the second waiter is served first."""
    caught = 0
    for _ in range(CONTROL_RUNS):
        runner = _broken(SyncRunner if mode == "sync" else AsyncRunner, "wait-requeued-at-cap")
        try:
            suite.test_c4_a_wait_until_granted_keeps_its_place_across_caps(
                runner, CappedWait(capped_server.url, WAIT_CAP_MS, None))
        except AssertionError as exc:
            caught += 1
            assert any(why in str(exc) for why in ("out of arrival order", "queued again", "left the queue")), exc
        finally:
            if mode == "async":
                _close_loop(runner)
            else:
                _close_handles(runner)
    print(f"wait-requeued-at-cap caught in {caught} of {CONTROL_RUNS} runs ({mode})")
    assert caught >= 1


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("where", ["in-process", "served"])
def test_the_cancel_test_catches_a_wait_that_outlives_its_caller(capped_server, tmp_path, monkeypatch, mode, where):
    """Control: the suite's cancel test with the wait run where the caller's cancellation does not reach it
    (``wait-outlives-cancel``): the first cancelled wait stays queued (looked at for 1 s, not 10)."""
    monkeypatch.setattr(coordinator_waits, "FOREVER_GONE_S", 1)  # where the cancel test reads it
    runner = _broken(SyncRunner if mode == "sync" else AsyncRunner, "wait-outlives-cancel")
    url = capped_server.url if where == "served" else f"memory://{tmp_path.name}"
    try:
        with pytest.raises(AssertionError, match=r"of \d+ cancelled waits left a waiter behind") as failed:
            suite.test_cancelling_a_wait_until_granted_leaves_no_waiter(runner, CappedWait(url, None, "control"))
        print(f"wait-outlives-cancel ({where}, {mode}): {failed.value}")
    finally:
        if mode == "async":
            _close_loop(runner)
        else:
            _close_handles(runner)


def _close_loop(runner) -> None:
    """End what a failed (control) run left on the runner's loop, then close it."""
    pending = asyncio.all_tasks(runner.loop)
    for task in pending:
        task.cancel()
    if pending:
        runner.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    runner.close()


class _Answer:
    """A kazoo async result whose answer the test hands over when it chooses."""

    def rawlink(self, callback):
        self.callback = callback

    def get_nowait(self):
        return 42


class _WaitForBridge:
    """The control: the ZooKeeper bridge's call as it was, on asyncio.wait_for."""

    def __init__(self):
        from stockade.transport.kazoo import AsyncZkBridge

        self.real = AsyncZkBridge(None, 1_000)

    async def call(self, result):
        from stockade.transport import kazoo

        loop = asyncio.get_running_loop()
        future = loop.create_future()
        result.rawlink(lambda finished: loop.call_soon_threadsafe(kazoo._settle, future, (finished.get_nowait(), None)))
        return await asyncio.wait_for(future, 1.0)


ANSWER_RACES = 20


@pytest.mark.parametrize("bridge", ["real", "control"])
def test_a_zookeeper_call_cancelled_as_its_answer_arrives_stays_cancelled(bridge):
    """The cancel test's 1 of 50 failure on ZooKeeper (async): a cancellation that arrived with a kazoo answer
    was dropped by asyncio.wait_for (Python 3.11), so the wait until granted went on. Each of `ANSWER_RACES`
    calls is cancelled in the loop turn its answer lands in: 0 swallowed now; the control (wait_for) swallows
    every one."""
    from stockade.transport.kazoo import AsyncZkBridge

    async def once() -> bool:
        answer = _Answer()
        call = AsyncZkBridge(None, 1_000).call if bridge == "real" else _WaitForBridge().call
        task = asyncio.get_running_loop().create_task(call(answer))
        await asyncio.sleep(0)
        answer.callback(answer)  # the answer is on its way to the task ...
        await asyncio.sleep(0)
        task.cancel()  # ... and so is the cancellation
        try:
            await task
        except asyncio.CancelledError:
            return False
        return True

    async def races() -> int:
        return sum([await once() for _ in range(ANSWER_RACES)])

    swallowed = asyncio.run(races())
    print(f"{bridge}: cancellations swallowed {swallowed} of {ANSWER_RACES}")
    assert swallowed == (0 if bridge == "real" else ANSWER_RACES)


def test_bad_waits_are_refused_with_a_typed_error(tmp_path):
    """``wait_ms`` is an int in 0..300000 or None: a negative one, a float, a bool or ``"forever"`` (the CLI's
    word, not Python's) raise `InvalidArgument` naming ``wait_ms``, and queue nothing."""
    with stockade.connect(f"memory://{tmp_path.name}") as coord:
        for bad in (-1, 300_001, 1.5, True, "forever", "None"):
            with pytest.raises(InvalidArgument) as refused:
                coord.acquire("bad-wait", ttl_ms=1_000, wait_ms=bad)
            assert refused.value.field == "wait_ms"
        assert coord.inspect("bad-wait").waiters == 0 and coord.inspect("bad-wait").last_token == 0


def _post(url: str, body: object) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_server_refuses_bad_waits_and_tickets(capped_server):
    """Over HTTP: ``"wait_ms": "forever"``, a negative wait, ``null`` without a ticket, a ticket with a finite
    wait, a malformed ticket: 422 with the field named; an old client's integer wait works as before."""
    url = f"{capped_server.url}/v1/locks/bad-wait-http/acquire"
    ticket = "t" * 32
    for body, field in (({"ttl_ms": 1_000, "wait_ms": "forever"}, "wait_ms"),
                        ({"ttl_ms": 1_000, "wait_ms": -1}, "wait_ms"),
                        ({"ttl_ms": 1_000, "wait_ms": None}, "ticket"),
                        ({"ttl_ms": 1_000, "wait_ms": 10, "ticket": ticket}, "ticket"),
                        ({"ttl_ms": 1_000, "wait_ms": None, "ticket": "short"}, "ticket")):
        status, problem = _post(url, body)
        assert (status, problem.get("field")) == (422, field), (body, status, problem)
    status, grant = _post(url, {"ttl_ms": 1_000, "wait_ms": 0})
    assert status == 200 and grant["token_value"] >= 1
    status, problem = _post(url, {"ttl_ms": 1_000, "wait_ms": None, "ticket": ticket})  # held: at the cap, 409
    assert (status, problem["ticket"], problem["wait_ms"] if "wait_ms" in problem else WAIT_CAP_MS) == (
        409, ticket, WAIT_CAP_MS)


def test_a_wait_until_granted_outlives_a_server_restart(tmp_path):
    """A served coordinator restarts (stopped, started again on its data and port) under a wait until granted:
    the client's request fails, it tries again with its ticket, the new server knows no ticket and queues it
    again (at the back; here the queue is empty), and it is granted once the lease held before the restart
    has run out (held a full TTL after the restart, C3). As docs/leases.md says."""
    data = tmp_path / "served"
    servers = [ServeProcess(data, "--wait-ms-cap", str(WAIT_CAP_MS))]

    async def scenario() -> tuple[int, int, int, int]:
        url = servers[0].url
        async with stockade.connect_async(url) as holder, stockade.connect_async(url) as waiting:
            held = await holder.acquire("restart", ttl_ms=3_000, keepalive=False)
            task = asyncio.get_running_loop().create_task(waiting.acquire("restart", ttl_ms=5_000, wait_ms=None))
            while waiting._port.wait_rounds < 2:  # queued, and past a cap
                await asyncio.sleep(0.01)
            servers[0].stop()
            restarted = await asyncio.to_thread(
                ServeProcess, data, "--wait-ms-cap", str(WAIT_CAP_MS), port=servers[0].port)
            servers.append(restarted)
            while (await holder.inspect("restart")).waiters < 1:  # the waiter came back, queued again
                assert not task.done(), "granted before it queued again"
                await asyncio.sleep(0.01)
            queued_again = (await holder.inspect("restart")).waiters
            lease = await asyncio.wait_for(task, 30)
            token = lease.token.value
            await lease.release()
            return held.token.value, token, queued_again, waiting._port.wait_rounds

    try:
        before, after, queued_again, rounds = asyncio.run(scenario())
    finally:
        for server in servers:
            server.stop()
    print(f"granted token {after} after the restart (held before: {before}), queued again once, {rounds} caps")
    assert after > before and queued_again == 1


def test_a_ticket_names_a_wait_of_one_scope(capped_server):
    """schemathesis (S23) sent one ticket to two scopes and got 400 for a schema-valid request: a ticket is now
    a wait of its scope, so the same ticket on a free scope is granted there at once."""
    ticket = "u" * 32
    held = f"{capped_server.url}/v1/locks/ticket-held/acquire"
    assert _post(held, {"ttl_ms": 1_000, "wait_ms": 0})[0] == 200
    status, problem = _post(held, {"ttl_ms": 1_000, "wait_ms": None, "ticket": ticket})
    assert (status, problem.get("ticket")) == (409, ticket)
    status, grant = _post(f"{capped_server.url}/v1/locks/ticket-free/acquire",
                          {"ttl_ms": 1_000, "wait_ms": None, "ticket": ticket})
    assert status == 200 and grant["scope"] == "ticket-free", (status, grant)


def _serve_capped(tmp_path, control: str | None) -> ServeProcess:
    """A `stockade serve --wait-ms-cap`, or its control from tests/helpers/server_controls.py."""
    entry = ("-m", "stockade", "serve") if control is None else (str(HELPERS / "server_controls.py"), control)
    return ServeProcess(tmp_path / "data", "--wait-ms-cap", str(WAIT_CAP_MS), entry=entry)


def _state(url: str, scope: str) -> dict:
    with urllib.request.urlopen(f"{url}/v1/locks/{scope}", timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.parametrize("control", [None, "hands-over-lapsed-grants"])
def test_a_grant_that_lapsed_before_its_ticket_came_back_is_waited_for_again(tmp_path, control):
    """schemathesis (S23) once got 410 "not held" from an acquire with a ticket: the grant kept for the ticket
    had a TTL shorter than the gap to the ticket's next request. Now the wait starts again (the scope is free
    then: granted at once, 200); the control hands the lapsed grant over, as before, and answers 410."""
    server = _serve_capped(tmp_path, control)
    try:
        acquire = f"{server.url}/v1/locks/lapsed/acquire"
        status, first = _post(acquire, {"ttl_ms": 60_000, "wait_ms": 0, "holder": "a"})
        assert status == 200
        ticket = "l" * 32
        body = {"ttl_ms": 100, "wait_ms": None, "ticket": ticket, "holder": "w"}
        assert _post(acquire, body)[0] == 409  # queued behind a; nobody watches the wait now
        request = urllib.request.Request(f"{server.url}/v1/leases/{first['lease_id']}", method="DELETE")
        urllib.request.urlopen(request, timeout=10).close()
        for _ in range(2_000):  # granted to w while no request watched, then lapsed (its 100 ms TTL)
            state = _state(server.url, "lapsed")
            if state["state"] != "held" and state["last_token"] > first["token_value"]:
                break
            time.sleep(0.01)
        else:
            raise AssertionError(f"the kept grant never lapsed: {state}")
        status, answer = _post(acquire, body)
    finally:
        server.stop()
    if control is None:
        assert status == 200 and answer["token_value"] > state["last_token"], (status, answer)
    else:
        assert status == 410, (status, answer)
