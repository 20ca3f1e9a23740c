"""The coordinator suite's reads of the coordinator's state: inspect, scopes, last issued, contenders.

``inspect`` and ``scopes`` show a held scope and a free one; ``last_issued`` is the scope's last
token, the floor a fence restores (R4); a lease's repr hides its id; ``contenders`` lists the
holder first, then the waiters in serving order (C4), one that gave up gone, and its ``limit``
is bounded and checked. Part of `stockade.testing.conformance.coordinator`, which runs it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import stockade
from stockade import InvalidArgument
from stockade.core.limits import CONTENDERS_MAX
from stockade.testing.conformance.coordinator_helpers import (
    _WAIT_S,
    _acquiring,
    _await_waiters,
    _close,
    _follows,
    _fresh_scope,
    _in_background,
    _interrupted_when_queued,
)
from stockade.testing.conformance.coordinator_waits import FOREVER_GONE_S


def test_inspect_and_scopes_while_held(client, coord_url):
    coord = client.connect(coord_url)
    lease = client.run(coord.acquire("seen", ttl_ms=5000, holder="worker-1"))
    info = client.run(coord.inspect("seen"))
    assert info.state is stockade.ScopeState.HELD and info.holder == "worker-1"
    assert info.token == lease.token and info.last_token == lease.token.value
    assert 0 < info.remaining_ms <= 5000 and info.waiters == 0
    free = client.run(coord.inspect("never-used"))
    assert free.state is stockade.ScopeState.FREE and free.token is None and free.last_token == 0
    names = [i.scope for i in client.run(coord.scopes())]
    assert "seen" in names
    client.run(lease.release())
    assert client.run(coord.inspect("seen")).state is stockade.ScopeState.FREE


def test_lease_repr_does_not_leak_lease_id(coord_url):
    coord = stockade.connect(coord_url)
    lease = coord.acquire("k", ttl_ms=1000)
    assert lease.lease_id not in repr(lease)
    lease.release()


def test_last_issued_is_the_fence_floor(client, coord_url):
    coord = client.connect(coord_url)
    assert client.run(coord.last_issued("floors")) == 0
    values = []
    for _ in range(3):
        lease = client.run(coord.acquire("floors", ttl_ms=1000))
        values.append(lease.token.value)
        client.run(lease.release())
    assert client.run(coord.last_issued("floors")) == values[-1]
    assert _follows(coord, values[1], values[0]) and _follows(coord, values[2], values[1])
    client.run(coord.aclose() if client.mode == "async" else coord.close())


#: The contenders test's waiters, in the order they queue: not the order of their names (so that a line
#: sorted by name, or reversed, is not the line in arrival order). The second gives up while queued.
CONTENDER_NAMES = ("w-delta", "w-alpha", "w-charlie", "w-bravo")
_QUITTER = 1


def _contenders_line(client, coord, scope: str) -> list[tuple[str, bool]]:
    return [(c.holder, c.holding) for c in client.run(coord.contenders(scope))]


def _await_line(client, coord, scope: str, expected: list[tuple[str, bool]], seen: list[bool],
                settle_s: float = 0.0) -> None:
    """Read the scope's contenders until the line is ``expected``, at most ``settle_s`` (a served coordinator
    learns of a cancelled wait when its client's connection closes; else one read); note whether it was."""
    deadline = time.monotonic() + settle_s
    while (line := _contenders_line(client, coord, scope)) != expected and time.monotonic() < deadline:
        if client.mode == "sync":
            time.sleep(0.005)
    seen.append(line == expected)
    assert line == expected, f"contenders of {scope!r}: {line}, expected {expected}"


def _give_up_in_line(client, coord, scope: str, wait: Callable[[], Any], place: int,
                     queue_rest: Callable[[], None]) -> None:
    """Start ``wait`` (a wait until granted), let it take queue place ``place`` (1 = first waiter), queue the
    rest behind it (``queue_rest``), then cancel it: async, its task; sync, a KeyboardInterrupt in this thread."""
    if client.mode == "async":
        task = client.loop.create_task(wait())
        _await_waiters(client, coord, scope, place)  # queued before the rest start
        queue_rest()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            client.run(asyncio.wait_for(task, _WAIT_S))
        return
    failed: list[BaseException] = []

    def queued() -> bool:  # in the interrupting thread: the rest queue behind the quitter, then SIGINT
        if client.run(coord.inspect(scope)).waiters < place:
            return False
        try:
            queue_rest()
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread below
            failed.append(exc)
        return True

    with pytest.raises(KeyboardInterrupt):
        _interrupted_when_queued(wait, queued)
    if failed:
        raise failed[0]


def check_contenders(client, connect: Callable[[], Any]) -> int:
    """The contenders line through ``connect()``'s handles: a holder and `CONTENDER_NAMES` queued one after
    another read holder first, then the waiters in arrival order; the waiter that gives up (async: its task
    cancelled; sync: a KeyboardInterrupt in the thread that waits) leaves the line; each release moves the
    next waiter to the front, holding. Returns how many lines were read in order (all, or it raised)."""
    scope = _fresh_scope("contenders")
    coord = connect()
    held = client.run(coord.acquire(scope, ttl_ms=10_000, holder="w-holder"))
    seen: list[bool] = []
    line = [("w-holder", True)]
    _await_line(client, coord, scope, line, seen)

    def waiter(name: str, wait_ms: int | None = _WAIT_S * 1000, handle: Any = coord) -> Callable[[], Any]:
        return _acquiring(client, handle, scope, ttl_ms=10_000, wait_ms=wait_ms, holder=name)

    joins: dict[str, Callable[[], Any]] = {}

    def queue(names: tuple[str, ...]) -> None:
        for name in names:
            joins[name] = _in_background(client, waiter(name))
            line.append((name, False))
            _await_waiters(client, coord, scope, len(line) - 1)  # queued before the next one starts
        _await_line(client, coord, scope, line, seen)

    queue(CONTENDER_NAMES[:_QUITTER])
    quitter = CONTENDER_NAMES[_QUITTER]
    rest = CONTENDER_NAMES[_QUITTER + 1:]
    # The quitter waits on a handle of its own: an interrupt may land anywhere in that handle's code.
    quitting = connect()
    line.append((quitter, False))
    _give_up_in_line(client, coord, scope, waiter(quitter, None, quitting), len(line) - 1, lambda: queue(rest))
    if client.mode == "sync":
        # An interrupt that lands inside an embedded SQLite handle's write may leave its connection in the
        # transaction (the file's write lock kept): the process would be ended by it; here the handle is closed.
        closing = threading.Thread(target=quitting.close, daemon=True)
        closing.start()
        closing.join(_WAIT_S)
    line.remove((quitter, False))
    _await_line(client, coord, scope, line, seen, FOREVER_GONE_S)
    lease = held
    while len(line) > 1:
        client.run(lease.release())
        name = line[1][0]
        lease, _ = joins[name]()
        line = [(name, True), *line[2:]]
        _await_line(client, coord, scope, line, seen)
    client.run(lease.release())
    _await_line(client, coord, scope, [], seen)
    _close(client, coord)
    if client.mode == "async":
        _close(client, quitting)
    return sum(seen)


def test_contenders_holder_first_then_waiters_in_arrival_order(client, coord_url):
    """`check_contenders` on the backend under test: every line read is the expected one."""
    in_order = check_contenders(client, lambda: client.connect(coord_url))
    print(f"contenders lines in serving order: {in_order} of {in_order} ({client.mode})")


def test_contenders_limit_is_bounded_and_validated(client, coord_url):
    coord = client.connect(coord_url)
    scope = _fresh_scope("contenders-limit")
    held = client.run(coord.acquire(scope, ttl_ms=10_000, holder="first"))
    join = _in_background(client, _acquiring(client, coord, scope, ttl_ms=10_000, wait_ms=_WAIT_S * 1000,
                                             holder="second"))
    _await_waiters(client, coord, scope, 1)
    assert [(c.holder, c.holding) for c in client.run(coord.contenders(scope, limit=1))] == [("first", True)]
    assert len(client.run(coord.contenders(scope, limit=2))) == 2
    for bad in (0, -1, CONTENDERS_MAX + 1, "2", True):
        with pytest.raises(InvalidArgument):
            client.run(coord.contenders(scope, limit=bad))
    with pytest.raises(InvalidArgument):
        client.run(coord.contenders("bad scope"))
    assert client.run(coord.contenders(_fresh_scope("never-used"))) == []
    client.run(held.release())
    lease, _ = join()
    client.run(lease.release())
    _close(client, coord)


__all__ = [name for name in dir() if name.startswith("test_")]
