"""A process holding thousands of leases keeps a bounded number of threads, and loses none of them.

Before, the sync client gave every lease held past its first renewal two threads of its own (a
keepalive and a deadline watcher): 2,000 leases ran 4,001 threads, and at 10,000 the threads
thrashed until every lease was lost. Now the deadlines and the next renewals are entries on the
process's one timer thread, and a renewal due runs on a pool of at most `KEEPALIVE_THREADS_MAX`
threads (`stockade.transport.workers`), plus one thread for loss callbacks.

The test holds `LEASES` leases through a real `stockade serve` for `ROUNDS` renewal rounds
(counted: every lease renewed at least `ROUNDS` times), reads `threading.active_count()` at every
renewal, and checks it never exceeded the threads the test process had before plus the bound; and
that no lease was lost. The keepalives start together after the leases are acquired, so that every
round is one burst of `LEASES` renewals due within a few milliseconds: far more than one thread
renews in that time. The control lifts the pool's bound to one thread per lease (a thread then
starts for every renewal due while the others are busy, up to one a lease, as with a thread per
lease) and must exceed the bound.
"""

from __future__ import annotations

import threading
import time

import stockade
from stockade.client import Hooks
from stockade.transport import workers

LEASES = 2000
#: Renewed every 5 s, each round a burst of LEASES renewals (about 0.7 s of the client's and the server's CPU on an
#: idle host) with 8.5 s before a late one is lost (the deadline is the TTL less a tenth): enough on a machine that
#: runs the whole suite at once. At a TTL of 6 s (1.7 s of slack for 3,000) a busy CI run lost all of them once.
TTL_MS = 15_000
ROUNDS = 2
#: The timer's thread, the keepalive pool, the callback thread: every thread the keepalive of any number of leases runs.
STOCKADE_THREADS_MAX = 1 + workers.KEEPALIVE_THREADS_MAX + 1
WAIT_S_MAX = 120  # a guard against a hang, not a measure: the rounds take ROUNDS * TTL/3 on an idle machine


class _Rounds:
    """Counts renewals per lease and the most threads seen at any renewal (read on the renewing thread)."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self.lock = threading.Condition()
        self.renewals: dict[int, int] = {}
        self.complete = 0  # leases renewed `rounds` times
        self.lost = 0
        self.threads_max = 0

    def renewed(self, lease: object) -> None:
        threads = threading.active_count()
        with self.lock:
            self.threads_max = max(self.threads_max, threads)
            key = id(lease)
            count = self.renewals.get(key, 0) + 1
            self.renewals[key] = count
            if count == self.rounds:
                self.complete += 1
                if self.complete == LEASES:
                    self.lock.notify_all()

    def lost_one(self, lease: object) -> None:
        with self.lock:
            self.lost += 1
            self.lock.notify_all()


def _hold_many(url: str, renewals: int) -> tuple[int, _Rounds, int]:
    """Hold LEASES leases until each was renewed ``renewals`` times; returns (threads before, the rounds, leases
    lost)."""
    rounds = _Rounds(renewals)
    before = threading.active_count()
    coord = stockade.connect(url, hooks=Hooks(on_renew=rounds.renewed, on_lost=rounds.lost_one))
    try:
        leases = [coord.acquire(f"many-{i}", ttl_ms=TTL_MS, keepalive=False) for i in range(LEASES)]
        for lease in leases:  # as `stockade lock` does: every first renewal due within a few ms, the worst burst
            lease._schedule_keepalive()
        end_s = time.monotonic() + WAIT_S_MAX
        with rounds.lock:
            while rounds.complete < LEASES and rounds.lost == 0 and time.monotonic() < end_s:
                rounds.lock.wait(1.0)
        lost = sum(lease.lost for lease in leases)
        for lease in leases:
            lease.release()
    finally:
        coord.close()
    return before, rounds, lost


def test_thousands_of_leases_run_a_bounded_number_of_threads_and_lose_none(serve):
    server = serve()
    before, rounds, lost = _hold_many(server.url, ROUNDS)
    assert rounds.complete == LEASES, f"{rounds.complete} of {LEASES} leases renewed {ROUNDS} times"
    assert lost == 0 and rounds.lost == 0
    assert rounds.threads_max <= before + STOCKADE_THREADS_MAX, (rounds.threads_max, before)


def test_control_a_thread_per_lease_exceeds_the_bound(serve, monkeypatch):
    monkeypatch.setattr(workers.keepalives(), "threads_max", LEASES)
    server = serve()
    before, rounds, _ = _hold_many(server.url, 1)  # the first round starts the threads
    assert rounds.threads_max > before + STOCKADE_THREADS_MAX, (rounds.threads_max, before)



# -- renewals that hang: the deadlines do not wait for them -----------------------------------------

HUNG_LEASES = 3 * workers.KEEPALIVE_THREADS_MAX  # more renewals hang than the pool has threads
HUNG_TTL_MS = 1000  # the renewals hang for the request timeout (10 s): far past every deadline


def _lost_while_frozen(server, wait_s: float) -> list[tuple[str, str]]:
    """Hold HUNG_LEASES leases, freeze the server before their first renewal, and collect the losses
    reported while it is frozen: (the cause, the thread that ran ``on_lost``)."""
    import os
    import signal

    seen: list[tuple[str, str]] = []
    told = threading.Condition()

    def on_lost(lease) -> None:  # type: ignore[no-untyped-def]
        with told:
            seen.append((lease.lost_cause, threading.current_thread().name))
            told.notify_all()

    coord = stockade.connect(server.url)
    leases = [coord.acquire(f"hung-{i}", ttl_ms=HUNG_TTL_MS, on_lost=on_lost) for i in range(HUNG_LEASES)]
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        end_s = time.monotonic() + wait_s
        with told:  # nothing here reads `lease.lost`: only the keepalive's own marking is seen
            while len(seen) < HUNG_LEASES and time.monotonic() < end_s:
                told.wait(0.1)
            reported = list(seen)
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    for lease in leases:
        lease.release()
    coord.close()
    return reported


def test_deadlines_mark_the_loss_while_renewals_hang(serve):
    reported = _lost_while_frozen(serve(), wait_s=WAIT_S_MAX)
    assert len(reported) == HUNG_LEASES
    assert {cause for cause, _ in reported} == {"local deadline passed without a successful renewal"}
    assert {thread for _, thread in reported} == {"stockade-callbacks"}  # handed off by the timer


def test_control_without_the_deadline_entry_no_loss_is_marked_while_renewals_hang(serve, monkeypatch):
    from stockade.client._sync.coordinator import Lease

    monkeypatch.setattr(Lease, "_on_deadline", lambda self: None)
    assert _lost_while_frozen(serve(), wait_s=3.0) == []


# -- the pool itself ----------------------------------------------------------------------------------


def _running_at_most(threads_max: int, jobs: int) -> tuple[int, int]:
    """A pool of its own, ``jobs`` jobs that each block until let go: (threads started, jobs running once every
    thread took one). A pool starts its threads inside `submit`, so the count is read at once, not waited for."""
    pool = workers._Pool("test-pool", threads_max)
    gate = threading.Event()
    running = threading.Semaphore(0)
    started = [pool.submit(lambda: (running.release(), gate.wait()), withdrawable=True) for _ in range(jobs)]
    threads = pool.threads()
    for _ in range(threads):  # every thread has taken a job
        assert running.acquire(timeout=WAIT_S_MAX)
    at_once = sum(job.state == "running" for job in started)
    gate.set()
    for job in started:
        job.join()
    return threads, at_once


def test_the_pool_runs_at_most_its_bound_of_threads():
    assert _running_at_most(4, 50) == (4, 4)


def test_control_a_pool_bound_by_its_jobs_runs_a_thread_each():
    assert _running_at_most(50, 50) == (50, 50)


def test_a_renewal_joined_before_it_starts_never_runs_and_a_callback_always_runs_once():
    pool = workers._Pool("test-pool", 1)
    gate = threading.Event()
    ran: list[str] = []
    blocker = pool.submit(gate.wait, withdrawable=True)  # holds the pool's one thread
    renewal = pool.submit(lambda: ran.append("renewal"), withdrawable=True)
    callback = pool.submit(lambda: ran.append("callback"), withdrawable=False)
    renewal.join()  # queued: withdrawn, returns at once although the thread is busy
    assert renewal.state == "withdrawn"
    gate.set()
    callback.join()  # queued too, but a callback is waited for
    blocker.join()
    assert ran == ["callback"]


def _joined_from_the_callback_thread(monkeypatch, run_here: bool, wait_s: float) -> list[str]:
    """On a pool of one thread, a callback joins a callback queued behind it, as an ``on_lost`` that releases
    another lease lost at the same deadline does (the release waits for that lease's callbacks)."""
    monkeypatch.setattr(workers._Pool, "_run_joined_here", run_here)
    pool = workers._Pool("test-callbacks", 1)
    ran: list[str] = []
    behind: list[workers.Job] = []
    finished = threading.Event()

    def first() -> None:
        ran.append("first")
        behind[0].join()
        finished.set()

    gate = threading.Event()
    pool.submit(gate.wait, withdrawable=False)  # holds the thread until both callbacks are queued
    pool.submit(first, withdrawable=False)
    behind.append(pool.submit(lambda: ran.append("behind"), withdrawable=False))
    gate.set()
    if finished.wait(wait_s):
        return ran
    with pool._work:  # the control's deadlock: let the stuck thread go, so that it ends with the test
        behind[0].state = "done"
        pool._ended.notify_all()
    return [*ran, "deadlocked"]


def test_a_callback_that_joins_one_queued_behind_it_runs_it_there(monkeypatch):
    assert _joined_from_the_callback_thread(monkeypatch, True, wait_s=WAIT_S_MAX) == ["first", "behind"]


def test_control_a_callback_that_waits_for_one_queued_behind_it_deadlocks(monkeypatch):
    assert _joined_from_the_callback_thread(monkeypatch, False, wait_s=1.0) == ["first", "deadlocked"]


def _joined_behind_a_blocked_callback(monkeypatch, run_here: bool, wait_s: float) -> list[str]:
    """On a pool of one thread held by a callback that blocks (a user's ``on_lost`` that never returns), another
    callback queued behind it is joined from outside the pool, as a release of that other lease joins its own
    callbacks: what ran, and on which thread."""
    monkeypatch.setattr(workers._Pool, "_run_joined_here", run_here)
    pool = workers._Pool("test-callbacks", 1)
    gate = threading.Event()
    ran: list[str] = []
    blocked = pool.submit(gate.wait, withdrawable=False)
    queued = pool.submit(lambda: ran.append(threading.current_thread().name), withdrawable=False)
    joiner = threading.Thread(target=queued.join, name="releasing")
    joiner.start()
    joiner.join(wait_s)
    if joiner.is_alive():
        ran.append("waiting")
    gate.set()
    joiner.join(WAIT_S_MAX)
    blocked.join()
    return ran


def test_a_release_never_waits_behind_another_leases_blocked_callback(monkeypatch):
    assert _joined_behind_a_blocked_callback(monkeypatch, True, wait_s=WAIT_S_MAX) == ["releasing"]


def test_control_a_release_that_waits_for_the_callback_thread_waits_as_long_as_it_blocks(monkeypatch):
    assert _joined_behind_a_blocked_callback(monkeypatch, False, wait_s=1.0) == ["waiting", "test-callbacks"]
