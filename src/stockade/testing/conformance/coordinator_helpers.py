"""What every part of the coordinator suite (`stockade.testing.conformance.coordinator`) uses.

A case runs one source in either client mode (``client.mode``, sync or async): these helpers
close a handle, make an acquire to run later, run a call beside the test (a thread, or a task
on the runner's loop), wait until a scope's queue or a lapse is seen, and send a SIGINT to a
wait in the main thread once it is queued. Every wait here is bounded (`_WAIT_S`).
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from stockade.coordinators.registry import Capability

#: Nanoseconds in a millisecond.
_MS = 1_000_000
#: The bound, in seconds, on each of the suite's own waits (a queue, a lapse, a call run beside the test).
_WAIT_S = 30

#: How long a SIGINT has to end a wait until granted in the sync client's thread, and how often it is sent.
SIGINT_GRACE_S = 15
SIGINT_SENDS = 3


def _close(client, coord) -> None:
    client.run(coord.aclose() if client.mode == "async" else coord.close())


def _acquiring(client, coord, scope: str, **options: Any) -> Callable[[], Any]:
    """A call that acquires ``scope`` and returns ``(lease, monotonic ns once it returned)``."""

    async def acquire_async() -> tuple[Any, int]:
        lease = await coord.acquire(scope, **options)
        return lease, time.monotonic_ns()

    def acquire_sync() -> tuple[Any, int]:
        lease = coord.acquire(scope, **options)
        return lease, time.monotonic_ns()

    return acquire_async if client.mode == "async" else acquire_sync


def _in_background(client, call: Callable[[], Any]) -> Callable[[], Any]:
    """Start ``call()`` beside the test (a thread; in async mode a task on the runner's loop, which
    runs whenever the test awaits through ``client.run``). Returns ``join()``: its result, or its error."""
    if client.mode == "async":
        task = client.loop.create_task(call())

        async def join_async() -> Any:
            return await task

        return lambda: client.run(join_async())
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to join()
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> Any:
        thread.join(2 * _WAIT_S)
        assert not thread.is_alive(), f"a waiter did not return in {2 * _WAIT_S} s"
        if "error" in box:
            raise box["error"]
        return box["value"]

    return join


def _await_waiters(client, coord, scope: str, count: int) -> None:
    deadline = time.monotonic() + _WAIT_S
    while client.run(coord.inspect(scope)).waiters < count:
        assert time.monotonic() < deadline, f"{count} waiter(s) not queued on {scope!r} in {_WAIT_S} s"
        if client.mode == "sync":
            time.sleep(0.005)


def _await_lapse(client, coord, scope: str, lapsed, start_ns: int) -> int:
    """Look at ``scope`` until ``lapsed`` holds it no more; a time before the lapse, as late as known:
    when the last look that still saw it held began (``start_ns``, sent before its grant, at first)."""
    before_ns = start_ns
    deadline = time.monotonic() + _WAIT_S
    while True:
        look_ns = time.monotonic_ns()
        token = client.run(coord.inspect(scope)).token
        if token is None or token.value != lapsed.token.value:
            return before_ns
        before_ns = look_ns
        assert time.monotonic() < deadline, f"the lease on {scope!r} did not lapse in {_WAIT_S} s"


def _follows(coord, value: int, previous: int) -> bool:
    """Is ``value`` the scope's next token after ``previous``?

    ``previous + 1`` where the backend counts per scope (`Capability.DENSE_TOKENS`);
    otherwise only greater (etcd: a create revision, which other keys advance too).
    """
    return value == previous + 1 if Capability.DENSE_TOKENS in coord.capabilities else value > previous


def _fresh_scope(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:12]}"  # the capped server may be shared by several tests


def _interrupted_when_queued(call: Callable[[], Any], queued: Callable[[], bool]) -> Any:
    """Run ``call()`` in this (main) thread; once ``queued()`` says so, SIGINT it from another thread.

    Bounded on every path (a CI run once hung here for 30 minutes with no way to tell why): ``queued()`` is
    polled from a thread of its own, so a read that hangs cannot hold the signal back past `_WAIT_S`; a SIGINT
    that has not ended ``call()`` within `SIGINT_GRACE_S` is sent again, at most `SIGINT_SENDS` times. Either
    is a failure, raised here with what was seen, in place of the call's own outcome."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("a KeyboardInterrupt is delivered to the main thread only")
    main_id = threading.main_thread().ident or 0
    ready, returned, armed = threading.Event(), threading.Event(), threading.Event()
    seen: list[str] = []
    started = time.monotonic()

    def poll() -> None:
        last: BaseException | None = None
        while not ready.is_set() and not returned.is_set() and time.monotonic() - started < _WAIT_S:
            try:
                if queued():
                    ready.set()
                    return
            except Exception as exc:  # noqa: BLE001 - retried until the deadline, then reported
                last = exc
            time.sleep(0.005)
        if last is not None:
            seen.append(f"queued() last failed with {last!r}")

    def interrupt() -> None:
        armed.wait()  # not before the call is about to start: the signal must land in it
        while not ready.is_set() and not returned.is_set() and time.monotonic() - started < _WAIT_S:
            ready.wait(0.05)
        if returned.is_set():
            return
        if not ready.is_set():
            seen.append(f"queued() did not confirm the wait within {_WAIT_S} s")
        for sent in range(1, SIGINT_SENDS + 1):
            signal.pthread_kill(main_id, signal.SIGINT)
            if returned.wait(SIGINT_GRACE_S):
                return
            seen.append(f"SIGINT {sent} of {SIGINT_SENDS} had not ended the call {SIGINT_GRACE_S} s later")

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    poller = threading.Thread(target=poll, name="stockade-test-queued", daemon=True)
    timer = threading.Thread(target=interrupt, name="stockade-test-sigint", daemon=True)
    poller.start()
    timer.start()
    try:
        armed.set()
        return call()
    finally:
        returned.set()
        timer.join()
        poller.join(1.0)  # a read that hangs is left to its daemon thread (and reported below)
        if poller.is_alive():
            seen.append(f"queued() still running {time.monotonic() - started:.1f} s after it was first called")
        signal.signal(signal.SIGINT, previous)
        if seen:
            raise AssertionError("interrupting a wait until granted: " + "; ".join(seen))
