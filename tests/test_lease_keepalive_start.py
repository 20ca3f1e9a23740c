"""A lease's keepalive starts when its first renewal is due, not at the grant.

Most leases are released before TTL/3 (a lock held for one write); for them no
renewal runs and no thread (sync) or task (async) is started at all. Before, every grant started two
threads and every release joined them: about 270 µs of the sync client's CPU per
lock cycle, more than the rest of the client. Each test counts what was started,
never how long something took; the control starts the background at the grant,
as before, and must be seen.

The timer the sync client schedules on (`stockade.transport.timer`) is checked
here too: order, cancellation, a failing callback, and the bound on its heap.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import stockade
from stockade.client import Hooks
from stockade.client._async.coordinator import AsyncLease
from stockade.client._sync.coordinator import Lease
from stockade.transport import timer as _timer


def _background_threads(before: frozenset[threading.Thread] = frozenset()) -> int:
    """Keepalive and callback threads alive now that were not in ``before`` (another test's may still run)."""
    prefixes = ("stockade-keepalive", "stockade-callbacks")
    return sum(t.name.startswith(prefixes) and t not in before for t in threading.enumerate())


def _started(monkeypatch, lease_class) -> list[str]:
    """The scopes whose background was started (recorded, then started as usual)."""
    seen: list[str] = []
    start = lease_class._start_keepalive

    def record(self, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(self.scope)
        start(self, **kwargs)

    monkeypatch.setattr(lease_class, "_start_keepalive", record)
    return seen


def _cycles(coord, n: int, ttl_ms: int) -> None:
    for i in range(n):
        with coord.lock(f"short-{i % 4}", ttl_ms=ttl_ms):
            pass


def test_a_short_lock_starts_no_thread(monkeypatch):
    started = _started(monkeypatch, Lease)
    before = frozenset(threading.enumerate())
    with stockade.connect("memory://keepalive-start") as coord:
        _cycles(coord, 200, ttl_ms=30_000)
        assert started == [] and _background_threads(before) == 0


def test_control_starting_at_the_grant_starts_the_keepalive_of_every_lease(monkeypatch):
    started = _started(monkeypatch, Lease)
    monkeypatch.setattr(Lease, "_schedule_keepalive", lambda self: self._start_keepalive(first_wait_s=10.0))
    with stockade.connect("memory://keepalive-start") as coord:
        _cycles(coord, 20, ttl_ms=30_000)
    assert len(started) == 20


def test_a_lease_held_past_its_first_renewal_is_renewed(monkeypatch):
    started = _started(monkeypatch, Lease)
    renewed = threading.Event()
    with stockade.connect("memory://keepalive-start", hooks=Hooks(on_renew=lambda lease: renewed.set())) as coord:
        with coord.lock("long", ttl_ms=3000) as lease:  # renewed at 1 s; 300 ms could lapse at load
            assert renewed.wait(10), "no renewal"
            assert not lease.lost and started == ["long"]


def test_a_short_max_hold_is_lost_by_its_deadline_before_any_renewal():
    """max_hold_ms below TTL/3: the keepalive starts at that deadline and its timer entry marks the loss, unasked."""
    lost = threading.Event()
    with stockade.connect("memory://keepalive-start") as coord:
        lease = coord.acquire("held", ttl_ms=30_000, max_hold_ms=100, on_lost=lambda lease: lost.set())
        assert lost.wait(10), "the loss was not marked"
        assert lease.lost_cause == "max_hold_ms=100 reached"
        lease.release()


def test_async_a_short_lock_starts_no_task(monkeypatch):
    started = _started(monkeypatch, AsyncLease)

    async def main() -> None:
        async with stockade.connect_async("memory://keepalive-start") as coord:
            for i in range(100):
                async with coord.lock(f"a-{i % 4}", ttl_ms=30_000):
                    pass
            names = [t.get_name() for t in asyncio.all_tasks()]
            assert not [n for n in names if n.startswith(("stockade-keepalive-", "stockade-deadline-"))]

    asyncio.run(main())
    assert started == []


def test_async_a_lease_held_past_its_first_renewal_is_renewed(monkeypatch):
    started = _started(monkeypatch, AsyncLease)

    async def main() -> None:
        renewed = asyncio.Event()
        hooks = Hooks(on_renew=lambda lease: renewed.set())
        async with stockade.connect_async("memory://keepalive-start", hooks=hooks) as coord:
            async with coord.lock("long", ttl_ms=3000) as lease:  # renewed at 1 s; 300 ms could lapse at load
                await asyncio.wait_for(renewed.wait(), 10)
                assert not lease.lost

    asyncio.run(main())
    assert started == ["long"]


# -- the sync client's timer --------------------------------------------------------------------


class _HeldClock:
    """The timer module's clock, held at one reading while the test schedules (a busy host may pause the test
    between two calls for longer than their delays differ), the real one otherwise."""

    def __init__(self) -> None:
        self.held: float | None = None

    def monotonic(self) -> float:
        return self.held if self.held is not None else time.monotonic()


def test_the_timer_runs_callbacks_in_time_order_and_skips_cancelled_ones(monkeypatch):
    clock = _HeldClock()
    monkeypatch.setattr(_timer, "time", clock)
    timer = _timer._Timer()
    done = threading.Event()
    ran: list[str] = []
    clock.held = time.monotonic()  # every delay below counts from the same instant
    timer.call_later(0.06, lambda: (ran.append("c"), done.set()))
    timer.call_later(0.04, lambda: ran.append("b"))
    timer.call_later(0.02, lambda: ran.append("a"))
    timer.call_later(0.03, lambda: ran.append("x")).cancel()
    clock.held = None
    assert done.wait(10)
    assert ran == ["a", "b", "c"]


def test_a_failing_callback_is_logged_and_later_ones_run(caplog):
    done = threading.Event()
    with caplog.at_level(logging.ERROR, logger="stockade.client"):
        _timer.call_later(0.0, lambda: 1 / 0)
        _timer.call_later(0.01, done.set)
        assert done.wait(10)
    assert "a timer callback failed" in caplog.text


def _pending_after_cancels(count: int) -> int:
    """A timer of its own: one live entry due first (its thread sleeps on it), then ``count`` scheduled and cancelled.

    Scheduled far ahead and cancelled at once, as a short lock does; the live entry
    keeps every cancelled one off the top, so only the rebuild can remove them.
    """
    timer = _timer._Timer()
    live = timer.call_later(3000, lambda: None)
    for _ in range(count):
        timer.call_later(3600, lambda: None).cancel()
    pending = timer.pending()
    live.cancel()
    return pending


def test_cancelled_entries_do_not_pile_up():
    assert _pending_after_cancels(20_000) <= 2 + _timer.COMPACT_AT + 1


def test_control_without_the_rebuild_cancelled_entries_pile_up(monkeypatch):
    monkeypatch.setattr(_timer, "COMPACT_AT", 10**9)
    assert _pending_after_cancels(5_000) == 5_001


def _runs_after_idle(idle_exit_s: float, monkeypatch, look_s: float) -> tuple[bool, _timer._Timer]:
    """A timer of its own runs one callback; is its thread still there once nothing is scheduled for a while?"""
    import time

    monkeypatch.setattr(_timer, "IDLE_EXIT_S", idle_exit_s)
    timer = _timer._Timer()
    done = threading.Event()
    timer.call_later(0.0, done.set)
    assert done.wait(10)
    deadline = time.monotonic() + look_s
    while timer.running() and time.monotonic() < deadline:
        time.sleep(0.02)
    return timer.running(), timer


def test_the_timer_thread_ends_when_nothing_is_scheduled(monkeypatch):
    """A process that holds no lease keeps no thread of stockade's (fork, preexec_fn); the next call starts one."""
    running, timer = _runs_after_idle(0.05, monkeypatch, look_s=10)
    assert not running
    again = threading.Event()
    timer.call_later(0.0, again.set)
    assert again.wait(10)  # a new thread ran it


def test_control_a_timer_that_never_idles_out_keeps_its_thread(monkeypatch):
    assert _runs_after_idle(3600.0, monkeypatch, look_s=0.5)[0]


def _child_cancels_an_inherited_entry(guarded: bool, monkeypatch, wait_s: float) -> bool:
    """Fork while the timer's lock is held (its thread was in the heap); does the child's cancel return?"""
    import os
    import time

    entry = _timer.call_later(3600, lambda: None)
    if not guarded:  # the control: cancel goes to the timer it was made on, as without the guard
        monkeypatch.setattr(_timer.TimerEntry, "cancel", lambda self: self._timer.cancel(self))
    lock = _timer.timer()._cond
    with lock:
        pid = os.fork()
        if pid == 0:  # the child: the lock is held here for ever (no thread of the parent's runs)
            entry.cancel()
            os._exit(0)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            entry.cancel()
            return True
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    entry.cancel()
    return False


def test_a_child_cancels_an_entry_inherited_over_fork_without_blocking(monkeypatch):
    assert _child_cancels_an_inherited_entry(True, monkeypatch, wait_s=60)


def test_control_a_cancel_on_the_parents_timer_blocks_the_child(monkeypatch):
    assert not _child_cancels_an_inherited_entry(False, monkeypatch, wait_s=1)
