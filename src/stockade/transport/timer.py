"""The sync client's timer: one daemon thread runs short callbacks at their times.

A lease's keepalive starts only when its first renewal is due (about TTL/3
after the grant), and most leases are released before that. From then on the
lease's local deadline and its next renewal are entries here; a renewal due
runs on a few shared threads (`stockade.transport.workers`), never on this one.
Asyncio has a timer of its own (``loop.call_later``); threads have none that
does not cost a thread per call, so this module is the sync twin of it
(`stockade.transport.io.SyncIO.call_later`).

- One thread per process, started by a `call_later` when none runs. It waits
  on a condition until the next entry is due, and ends after `IDLE_EXIT_S`
  with nothing scheduled, so that a process that holds no lease has no thread
  of stockade's (``fork``, ``preexec_fn``).
- After ``fork`` the child gets a timer of its own; an entry inherited from the
  parent cancels as a no-op (the parent's lock may have been held at the fork).
- A callback must be short and must not block: it runs on the shared thread,
  and every later callback waits for it. An exception in it is logged and the
  thread goes on.
- Bounded: a cancelled entry stays in the heap until it reaches the top or
  until cancelled entries are more than half of the heap (and more than
  `COMPACT_AT`); then the heap is rebuilt without them. So the heap holds at
  most about twice the live entries, plus `COMPACT_AT`.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable

__all__ = ["TimerEntry", "call_later", "COMPACT_AT", "IDLE_EXIT_S"]

log = logging.getLogger("stockade.client")

#: Cancelled entries tolerated in the heap before a rebuild is considered.
COMPACT_AT = 1024
#: The timer's thread ends after this long with nothing scheduled (the next `call_later` starts one).
IDLE_EXIT_S = 1.0


class TimerEntry:
    """One scheduled callback; `cancel` it to keep it from running (a no-op once it ran)."""

    __slots__ = ("when", "seq", "callback", "state", "_timer")

    def __init__(self, when: float, seq: int, callback: Callable[[], None], timer: _Timer) -> None:
        self.when = when
        self.seq = seq
        self.callback = callback
        self.state = "pending"  # then "cancelled" or "ran"
        self._timer = timer

    def __lt__(self, other: TimerEntry) -> bool:
        return (self.when, self.seq) < (other.when, other.seq)

    def cancel(self) -> None:
        if self._timer.pid == os.getpid():  # inherited over fork: its timer's thread (and lock) stayed behind
            self._timer.cancel(self)


class _Timer:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[TimerEntry] = []
        self._cancelled = 0  # cancelled entries still in the heap
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self.pid = os.getpid()

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> TimerEntry:
        entry = TimerEntry(time.monotonic() + max(0.0, delay_s), next(self._seq), callback, self)
        with self._cond:
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stockade-timer", daemon=True)
                self._thread.start()
            elif self._heap[0] is entry:
                self._cond.notify()  # due sooner than what the thread waits for
        return entry

    def cancel(self, entry: TimerEntry) -> None:
        with self._cond:
            if entry.state != "pending":
                return
            entry.state = "cancelled"
            self._cancelled += 1
            if self._cancelled > COMPACT_AT and 2 * self._cancelled > len(self._heap):
                self._heap = [e for e in self._heap if e.state == "pending"]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def pending(self) -> int:
        """Entries in the heap, cancelled ones included (for tests of the bound)."""
        with self._cond:
            return len(self._heap)

    def running(self) -> bool:
        """Whether the timer's thread runs (for tests)."""
        with self._cond:
            return self._thread is not None

    def _next_due(self) -> TimerEntry | None:
        """Wait for the earliest pending entry to be due and take it off the heap; None: idle, the thread ends.

        Called holding the lock.
        """
        idle = False
        while True:
            while self._heap and self._heap[0].state == "cancelled":
                heapq.heappop(self._heap)
                self._cancelled -= 1
            if not self._heap:
                if idle:
                    self._thread = None  # under the lock: the next call_later starts another
                    return None
                idle = not self._cond.wait(IDLE_EXIT_S)
                continue
            idle = False
            wait_s = self._heap[0].when - time.monotonic()
            if wait_s <= 0:
                entry = heapq.heappop(self._heap)
                entry.state = "ran"
                return entry
            self._cond.wait(wait_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                entry = self._next_due()
            if entry is None:
                return
            try:
                entry.callback()
            except Exception:  # a callback's bug must not stop every later one
                log.exception("a timer callback failed")


_timer = _Timer()


def _after_fork_in_child() -> None:
    global _timer
    _timer = _Timer()  # the parent's thread does not exist here, nor do its leases' keepalives


os.register_at_fork(after_in_child=_after_fork_in_child)


def call_later(delay_s: float, callback: Callable[[], None]) -> TimerEntry:
    """Run ``callback`` on the timer thread after ``delay_s`` seconds (unless cancelled first)."""
    return _timer.call_later(delay_s, callback)


def timer() -> _Timer:
    """This process's timer (tests read its `pending` count)."""
    return _timer
