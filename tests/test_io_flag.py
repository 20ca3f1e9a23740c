"""`stockade.transport.io.Flag`: the sync client's `threading.Event`, its condition made by the first wait.

A lazily made condition invites one bug: a ``set`` that misses a waiter which made the condition just
before. Each test here holds a waiter on the flag and judges by what ``wait`` returned and in which
order; the control, a ``set`` that never notifies, must leave the waiter to time out.
"""

from __future__ import annotations

import threading
import time

import pytest

from stockade.transport.io import Flag, SyncIO

WAIT_S = 30.0  # a bound: a woken waiter returns long before it


class _SilentSet(Flag):
    """The control: a set that raises the flag but never wakes a waiter."""

    def set(self) -> None:
        self._flag = True


def _woken(flag: Flag, timeout_s: float) -> list[object]:
    """Start a waiter, set the flag once it waits on the condition; the waiter's result, and the events in order."""
    events: list[object] = []

    def waiter() -> None:
        events.append("waiting")
        result = flag.wait(timeout_s)
        events.append(result)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    while flag._cond is None or not flag._cond._waiters:  # type: ignore[attr-defined]  # until it sleeps on it
        time.sleep(0.001)  # polling only: the test judges by the order of the events
    flag.set()
    events.append("set")
    thread.join(WAIT_S)
    return events


def test_a_set_wakes_a_waiter_that_made_the_condition() -> None:
    for _ in range(20):
        assert _woken(Flag(), WAIT_S) == ["waiting", "set", True]


def test_control_a_set_that_does_not_notify_leaves_the_waiter_to_time_out() -> None:
    assert _woken(_SilentSet(), 0.2) == ["waiting", "set", False]


def test_set_before_any_wait_makes_no_condition_and_wait_returns_at_once() -> None:
    flag = SyncIO.event()
    assert isinstance(flag, Flag) and not flag.is_set()
    flag.set()
    assert flag.is_set() and flag.wait(0) is True and flag.wait(None) is True
    assert flag._cond is None


def test_wait_times_out_unset_and_clear_lowers_the_flag() -> None:
    flag = Flag()
    assert flag.wait(0.01) is False and flag._cond is not None
    flag.set()
    assert flag.wait(0) is True
    flag.clear()
    assert not flag.is_set() and flag.wait(0.01) is False


@pytest.mark.parametrize("rounds", [200])
def test_a_set_racing_the_first_wait_is_never_missed(rounds: int) -> None:
    """A waiter and a setter started together, round after round: every wait returns True (N of N)."""
    results: list[bool] = []
    for _ in range(rounds):
        flag = Flag()
        go = threading.Barrier(2)

        def waiter(flag: Flag = flag, go: threading.Barrier = go) -> None:
            go.wait()
            results.append(flag.wait(WAIT_S))

        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        go.wait()
        flag.set()
        thread.join(WAIT_S)
    assert results.count(True) == rounds, results
