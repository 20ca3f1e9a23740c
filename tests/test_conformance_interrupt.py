"""The conformance suite's SIGINT helper never hangs: a wait until granted that a hanging read or a lost
signal would leave running forever fails the test in bounded time, saying which."""

from __future__ import annotations

import threading
import time

import pytest

from stockade.testing.conformance import coordinator_helpers as suite  # the helper and the bounds it reads


@pytest.fixture
def short_bounds(monkeypatch):
    monkeypatch.setattr(suite, "_WAIT_S", 1.0)
    # Long enough for a loaded host to run the main thread's handler (0.5 s was not, once at load 18); the
    # control that swallows the first signal waits it out once.
    monkeypatch.setattr(suite, "SIGINT_GRACE_S", 3.0)


def _wait_forever() -> None:
    # In slices, as the sync client waits: CPython can miss a signal that lands just before a blocking lock
    # acquire starts (its handler has run, the acquire then blocks), so a wait with no timeout may not see the
    # first SIGINT until a second one (twice in whole runs, even with 3 s of grace); a sliced wait sees it
    # at the end of its slice.
    while True:
        threading.Event().wait(0.2)


def test_a_queued_wait_gets_its_keyboard_interrupt(short_bounds):
    with pytest.raises(KeyboardInterrupt):
        suite._interrupted_when_queued(_wait_forever, lambda: True)


def test_a_read_that_hangs_still_sends_the_signal_and_fails(short_bounds):
    hang = threading.Event()
    started = time.monotonic()
    with pytest.raises(AssertionError, match="did not confirm the wait") as raised:
        suite._interrupted_when_queued(_wait_forever, lambda: hang.wait() or False)
    hang.set()
    assert "still running" in str(raised.value)
    assert time.monotonic() - started < 10


def test_control_a_call_that_swallows_the_first_interrupt_fails_after_the_resend(short_bounds):
    def deaf_once() -> None:
        try:
            _wait_forever()
        except KeyboardInterrupt:
            pass  # what a client that swallows Ctrl-C would do
        _wait_forever()

    with pytest.raises(AssertionError, match="SIGINT 1 of 3 had not ended the call"):
        suite._interrupted_when_queued(deaf_once, lambda: True)


def test_a_call_that_returns_sends_nothing(short_bounds):
    assert suite._interrupted_when_queued(lambda: 7, lambda: False) == 7
