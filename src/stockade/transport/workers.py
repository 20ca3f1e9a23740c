"""The sync client's workers: a few daemon threads run what the timer hands them.

A lease held past its first renewal needs work that blocks: each renewal is a
request to the coordinator, which may hang for its whole timeout. A thread per
lease does that simply, and a process holding thousands of leases then runs
thousands of threads, which thrash until every lease is lost. So the timer
(`stockade.transport.timer`) keeps each lease's deadline and its next renewal
as entries, and when a renewal is due it becomes a `Job` on a pool of at most
`KEEPALIVE_THREADS_MAX` threads, however many leases the process holds. The
deadline itself never waits for a job: it is the timer's entry.

- Two pools per process: the keepalive's (renewals, `keepalives`) and one thread
  that runs the callbacks told of a loss (``on_lost`` and the hooks,
  `callbacks`), so that a slow callback delays neither a renewal nor a
  deadline, only the callbacks queued behind it.
- A pool starts a thread when a job is queued and more jobs wait than threads
  are idle, up to its bound; a thread ends after `IDLE_EXIT_S` without a job,
  so that a process that holds no lease has no thread of stockade's.
- Jobs run in the order they were queued. A renewal still queued when it is
  joined is withdrawn instead (a released lease is renewed no more, and its
  release must not wait behind other leases' renewals); a callback is always
  run, once: joined while still queued, it runs there and then, on the joining
  thread (a release does not wait behind another lease's callback that blocks,
  and a callback that releases another lease does not wait for itself);
  joined while running, joining waits for it.
- After ``fork`` the child gets pools of its own; joining a job inherited from
  the parent returns at once (the parent's lock may have been held at the fork).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from collections.abc import Callable

__all__ = ["Job", "KEEPALIVE_THREADS_MAX", "IDLE_EXIT_S", "keepalives", "callbacks"]

log = logging.getLogger("stockade.client")

#: The most threads that renew leases in one process; a renewal that hangs holds one, the others go on.
KEEPALIVE_THREADS_MAX = 8
#: A pool's thread ends after this long without a job (the next job starts one).
IDLE_EXIT_S = 1.0


class Job:
    """One piece of work queued on a pool; `join` waits for it, or withdraws it if it has not started."""

    __slots__ = ("function", "withdrawable", "state", "thread", "joiners", "_pool")

    def __init__(self, function: Callable[[], None], pool: _Pool, withdrawable: bool) -> None:
        self.function = function
        self.withdrawable = withdrawable
        self.state = "queued"  # then "running" and "done", or "withdrawn"
        self.thread: threading.Thread | None = None
        self.joiners = 0
        self._pool = pool

    def join(self) -> None:
        """Return once the job has ended, or will never start if it is ``withdrawable`` (a no-op on its own thread)."""
        if self._pool.pid == os.getpid():  # inherited over fork: no thread of the parent's runs it here
            self._pool.join(self)


class _Pool:
    def __init__(self, name: str, threads_max: int) -> None:
        self.name = name
        self.threads_max = threads_max
        lock = threading.Lock()
        self._work = threading.Condition(lock)  # a job was queued
        self._ended = threading.Condition(lock)  # a job that somebody joins ended
        self._queue: collections.deque[Job] = collections.deque()
        self._threads = 0
        self._idle = 0  # threads waiting for a job
        self.pid = os.getpid()

    def submit(self, function: Callable[[], None], *, withdrawable: bool) -> Job:
        job = Job(function, self, withdrawable)
        with self._work:
            self._queue.append(job)
            if self._idle:
                self._work.notify()
            if len(self._queue) > self._idle and self._threads < self.threads_max:
                thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                thread.start()
                self._threads += 1
        return job

    # A private seam for the tests' controls: with False, whoever joins a queued job waits for one of the pool's
    # threads to run it (tests/test_keepalive_many_leases.py).
    _run_joined_here = True

    def join(self, job: Job) -> None:
        here = threading.current_thread()
        with self._work:
            if job.state == "queued" and job.withdrawable:
                job.state = "withdrawn"
                return
            if job.thread is here:
                return
            if job.state == "queued" and self._run_joined_here:
                # Still queued: the joiner runs it now. A release never waits behind other leases' callbacks
                # (one that blocks holds the callback thread for as long as it likes), and one of this pool's
                # threads joining a job queued behind it (an ``on_lost`` that releases another lease lost at
                # the same time) would otherwise wait for itself.
                job.state = "running"
                job.thread = here
            else:
                job.joiners += 1
                while job.state in ("queued", "running"):
                    self._ended.wait()
                job.joiners -= 1
                return
        self._execute(job)

    def threads(self) -> int:
        """Threads the pool runs now (for tests of the bound)."""
        with self._work:
            return self._threads

    def _next(self) -> Job | None:
        """The next queued job, marked running; None: idle for `IDLE_EXIT_S`, the thread ends. Holding the lock."""
        while True:
            while self._queue:
                job = self._queue.popleft()
                if job.state == "queued":
                    job.state = "running"
                    job.thread = threading.current_thread()
                    return job
            self._idle += 1
            woken = self._work.wait(IDLE_EXIT_S)
            self._idle -= 1
            if not woken and not self._queue:
                self._threads -= 1  # under the lock: the next submit starts another
                return None

    def _run(self) -> None:
        while True:
            with self._work:
                job = self._next()
            if job is None:
                return
            self._execute(job)

    def _execute(self, job: Job) -> None:
        """Run a job marked running by this thread, then mark it done."""
        try:
            job.function()
        except Exception:  # a job's bug must not stop every later one
            log.exception("a background job failed")
        with self._work:
            job.state = "done"
            job.thread = None
            if job.joiners:
                self._ended.notify_all()


def _new_pools() -> tuple[_Pool, _Pool]:
    return _Pool("stockade-keepalive", KEEPALIVE_THREADS_MAX), _Pool("stockade-callbacks", 1)


_keepalives, _callbacks = _new_pools()


def _after_fork_in_child() -> None:
    global _keepalives, _callbacks
    _keepalives, _callbacks = _new_pools()


os.register_at_fork(after_in_child=_after_fork_in_child)


def keepalives() -> _Pool:
    """This process's pool of keepalive threads (renewals)."""
    return _keepalives


def callbacks() -> _Pool:
    """This process's callback thread (``on_lost`` and the hooks told of a loss)."""
    return _callbacks
