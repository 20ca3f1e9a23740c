"""The read/write lock (`stockade.ReadWriteLock`, docs/rwlock.md) on every coordinator backend.

- Exclusion, sync and async: readers and writers count themselves in while they hold the lock and
  look at the counts at every step: never a writer beside a reader or another writer, never more
  readers than the cap. Every writer writes with its token and every reader validates its read:
  none of them may be refused (false rejections). First the readers meet: as many readers as the cap
  hold the lock at once by construction (each, once granted, waits until all are in; a lock that never
  lets them in together fails the test, saying so, after a bounded wait), and while they hold, one more
  reader and a writer ask without waiting: each let in is a violation. Then readers and writers contend.
  Controls: a writer that skips draining the readers (let in beside them); a lock that admits one reader
  at a time (the readers never meet).
- Zombies: a writer whose lease lapsed (its handle closed: no keepalive) writes after a reader got in,
  and again after a newer writer wrote: refused both times. Control: readers that skip their check-in
  (the zombie's write after the reader got in is accepted). A reader whose lease lapsed validates
  after a newer writer wrote: refused. Control: a writer that skips its check-in (accepted).
  Where several processes share the coordinator, the zombie writer is a real process frozen with
  SIGSTOP past its lease, beside the same control. The lapsed writer runs through the async client too.
- Starvation: a writer arrives while a stream of readers keeps the lock read-held; it gets in after
  at most the readers queued before it. Control: a writer that waits for the readers to drain
  before it takes the gate (readers-preferring), which the stream starves.

``STOCKADE_LONG=1``: 20 times the cycles, and 20 lapsed and 20 frozen writer rounds per backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import random
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from conftest import HELPERS, PYTHON, python_env

import stockade
from stockade.client import AsyncReadWriteLock, ReadWriteLock
from stockade.client._sync.rwlock import READER_KEY, WRITER_KEY
from stockade.coordinators.registry import COORDINATORS

LONG = os.environ.get("STOCKADE_LONG") == "1"
READERS, WRITERS, CAP = 5, 2, 3  # contenders, and the readers the lock admits at once
CYCLES = 60 if LONG else 3  # per contender
HOLD_S = {False: 0.1, True: 0.03}  # a reader's hold, a writer's
LOOKS = 3  # the fewest looks at the counts in one hold, however slow the host
MEET_S = 60  # the bounded wait for the readers' meeting (a grant of the lock, then all CAP readers in)
ZOMBIE_ROUNDS = 20 if LONG else 1
STREAM = 4  # readers in the starvation stream
CONTROL_ATTEMPTS = 3  # the starvation control's: it must be caught in one
ZK_SESSION_MS = 1000  # the frozen writer's ZooKeeper session: its lease lapses with it

T = TypeVar("T")
SHORT_TRIES = 5


def _short(acquire: Callable[[], T]) -> T:
    """A lease of 300 ms. On a loaded host its grant can come back already lapsed (`LeaseLost` from
    the acquire's own renewal): such a round shows nothing, so it is taken again (at most 5 times)."""
    for attempt in range(SHORT_TRIES):
        try:
            return acquire()
        except stockade.LeaseLost:
            if attempt == SHORT_TRIES - 1:
                raise
    raise AssertionError("unreachable")


async def _short_async(acquire: Callable[[], Awaitable[T]]) -> T:
    """`_short` through the async client."""
    for attempt in range(SHORT_TRIES):
        try:
            return await acquire()
        except stockade.LeaseLost:
            if attempt == SHORT_TRIES - 1:
                raise
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _opened(coord_url: str):
    """One coordinator handle opened (and used) before the contenders start theirs, kept open until they
    end: a ``memory://`` coordinator's keys are made on its first open, which contenders must not race."""
    with stockade.connect(coord_url) as coord:
        coord.scopes(limit=1)
        yield


class _Count:
    """Readers and writers counted in and out; ``checks`` counts every look, ``violations`` the bad ones."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.readers = self.writers = self.most_readers = self.checks = self.violations = 0
        self.false_rejections = self.unavailable = 0

    def step(self, readers: int = 0, writers: int = 0) -> None:
        with self.lock:
            self.readers += readers
            self.writers += writers
            self.most_readers = max(self.most_readers, self.readers)
            self.checks += 1
            self.violations += self.writers > 1 or (self.writers > 0 and self.readers > 0) or self.readers > CAP

    def hold(self, writer: bool) -> None:
        """Look at the counts at least LOOKS times and until HOLD_S passed, or until a violation showed
        (the honest run never sees one)."""
        end, looks = time.monotonic() + HOLD_S[writer], 0
        while not self.violations and (looks < LOOKS or time.monotonic() < end):
            self.step()
            looks += 1
            time.sleep(0.001)

    async def hold_async(self, writer: bool) -> None:
        end, looks = time.monotonic() + HOLD_S[writer], 0
        while not self.violations and (looks < LOOKS or time.monotonic() < end):
            self.step()
            looks += 1
            await asyncio.sleep(0.001)


class _NoDrainLock(ReadWriteLock):
    """Control: a writer that does not wait for the readers to leave."""

    def _drain(self, deadline_ns, wait_ms, ttl_ms, holder):  # type: ignore[no-untyped-def]
        return None


class _UncheckedReadLock(ReadWriteLock):
    """Control: readers that skip their check-in (they never raise the resource's mark)."""

    def _check_in(self, key, gate, holder):  # type: ignore[no-untyped-def]
        if key != READER_KEY:
            super()._check_in(key, gate, holder)


class _OneReaderLock(ReadWriteLock):
    """Control: a lock that admits one reader at a time, whatever its ``readers`` says."""

    def __init__(self, coord, store, name, *, readers):  # type: ignore[no-untyped-def]
        super().__init__(coord, store, name, readers=1)


class _SilentWriterLock(ReadWriteLock):
    """Control: writers that skip their check-in (readers cannot see them)."""

    def _check_in(self, key, gate, holder):  # type: ignore[no-untyped-def]
        if key != WRITER_KEY:
            super()._check_in(key, gate, holder)


class _ReaderPreferringLock(ReadWriteLock):
    """Control: a writer that waits until no reader holds a slot before it takes the gate."""

    def acquire_write(self, *, ttl_ms, wait_ms=0, holder=None):  # type: ignore[no-untyped-def]
        end = time.monotonic() + wait_ms / 1000
        while self.readers_now():
            if time.monotonic() > end:
                raise stockade.LockTimeout(self.scope, wait_ms)
            time.sleep(0.005)
        return super().acquire_write(ttl_ms=ttl_ms, wait_ms=max(0, int((end - time.monotonic()) * 1000)),
                                     holder=holder)


# -- exclusion ---------------------------------------------------------------------------------------


def _cycle(rw: ReadWriteLock, store: stockade.FencedStore, count: _Count, writer: bool) -> None:
    if writer:
        with rw.write(ttl_ms=10_000, wait_ms=60_000) as lease:
            count.step(writers=+1)
            try:
                store.put(rw.scope, "data", f"by {lease.token.value}", token=lease.token)
                count.hold(writer)
            except stockade.StaleToken:
                count.false_rejections += 1
            finally:
                count.step(writers=-1)
        return
    with rw.read(ttl_ms=10_000, wait_ms=60_000) as reader:
        count.step(readers=+1)
        try:
            store.get(rw.scope, "data")
            count.hold(writer)
        finally:
            count.step(readers=-1)
        try:
            reader.validate()
        except stockade.StaleToken:
            count.false_rejections += 1


class _Meeting:
    """CAP readers meet: each, once granted, counts itself in and waits until ``leave`` is set."""

    def __init__(self) -> None:
        self.granted = 0
        self.all_in = threading.Event()
        self.leave = threading.Event()

    def arrived(self, count: _Count) -> None:
        with count.lock:
            self.granted += 1
            if self.granted == CAP:
                self.all_in.set()

    def verdict(self, wait_s: float) -> str:
        """Taken when the wait for all of them ends, before they are let go."""
        return "" if self.all_in.is_set() else (
            f"the readers never held the lock together: {self.granted} of {CAP} held it at once after {wait_s} s "
            f"(the rest waited)")


def _probe(rw: ReadWriteLock, count: _Count) -> None:
    """While CAP readers hold: one more reader and a writer ask without waiting; each let in is a violation."""
    for writer in (False, True):
        try:
            with (rw.write if writer else rw.read)(ttl_ms=10_000, wait_ms=0):
                count.step(readers=int(not writer), writers=int(writer))
                count.step(readers=-int(not writer), writers=-int(writer))
        except stockade.LockTimeout:
            pass


def _meet(coord_url: str, store_url: str, lock_class: type[ReadWriteLock], count: _Count,
          wait_s: float = MEET_S) -> str:
    """The readers' meeting (threads); returns "" if all CAP readers held at once, else what went wrong."""
    meeting, errors = _Meeting(), []

    def reader() -> None:
        try:
            with stockade.connect(coord_url) as coord, \
                    stockade.open_store(store_url, cluster_id=coord.cluster_id) as store:
                rw = lock_class(coord, store, "catalog", readers=CAP)
                with rw.read(ttl_ms=10_000, wait_ms=int(wait_s * 1000)) as held:
                    count.step(readers=+1)
                    meeting.arrived(count)
                    meeting.leave.wait(wait_s)
                    count.step(readers=-1)
                try:
                    held.validate()
                except stockade.StaleToken:
                    count.false_rejections += 1
        except stockade.LockTimeout:
            pass  # never granted: the verdict says so
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(CAP)]
    for thread in threads:
        thread.start()
    try:
        failed = meeting.verdict(wait_s) if not meeting.all_in.wait(wait_s) else ""
        if not failed:
            with stockade.connect(coord_url) as coord, \
                    stockade.open_store(store_url, cluster_id=coord.cluster_id) as store:
                _probe(lock_class(coord, store, "catalog", readers=CAP), count)
    finally:
        meeting.leave.set()
        for thread in threads:
            thread.join(wait_s + 60)
    assert not errors, errors
    return failed


def _run_threads(coord_url: str, store_url: str, lock_class: type[ReadWriteLock]) -> _Count:
    count, errors = _Count(), []

    def contend(writer: bool) -> None:
        try:
            with stockade.connect(coord_url) as coord, \
                    stockade.open_store(store_url, cluster_id=coord.cluster_id) as store:
                rw = lock_class(coord, store, "catalog", readers=CAP)
                for _ in range(CYCLES):
                    try:
                        _cycle(rw, store, count, writer)
                    except stockade.BackendUnavailable:  # outcome unknown (a loaded host): counted, next cycle
                        count.unavailable += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=contend, args=(i < WRITERS,)) for i in range(READERS + WRITERS)]
    with _opened(coord_url):
        failed = _meet(coord_url, store_url, lock_class, count)
        assert not failed, failed
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    assert not errors, errors
    return count


async def _cycle_async(rw: AsyncReadWriteLock, store: stockade.AsyncFencedStore, count: _Count,
                       writer: bool) -> None:
    if writer:
        async with rw.write(ttl_ms=10_000, wait_ms=60_000) as lease:
            count.step(writers=+1)
            try:
                await store.put(rw.scope, "data", f"by {lease.token.value}")  # the block's lease (K1)
                await count.hold_async(writer)
            finally:
                count.step(writers=-1)
        return
    async with rw.read(ttl_ms=10_000, wait_ms=60_000) as reader:
        count.step(readers=+1)
        try:
            await store.get(rw.scope, "data")
            await count.hold_async(writer)
        finally:
            count.step(readers=-1)
        try:
            await reader.validate()
        except stockade.StaleToken:
            count.false_rejections += 1


async def _probe_async(rw: AsyncReadWriteLock, count: _Count) -> None:
    """`_probe` through the async client."""
    for writer in (False, True):
        try:
            async with (rw.write if writer else rw.read)(ttl_ms=10_000, wait_ms=0):
                count.step(readers=int(not writer), writers=int(writer))
                count.step(readers=-int(not writer), writers=-int(writer))
        except stockade.LockTimeout:
            pass


async def _meet_async(coord_url: str, store_url: str, count: _Count) -> str:
    """`_meet` through the async client: CAP reader tasks, each on its own handle."""
    meeting, all_in, leave, failed = _Meeting(), asyncio.Event(), asyncio.Event(), [""]

    async def reader() -> None:
        async with stockade.connect_async(coord_url) as coord:
            async with await stockade.open_store_async(store_url, cluster_id=coord.cluster_id) as store:
                rw = AsyncReadWriteLock(coord, store, "catalog", readers=CAP)
                with contextlib.suppress(stockade.LockTimeout):  # never granted: the verdict says so
                    async with rw.read(ttl_ms=10_000, wait_ms=MEET_S * 1000) as held:
                        count.step(readers=+1)
                        meeting.arrived(count)
                        if meeting.all_in.is_set():
                            all_in.set()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(leave.wait(), MEET_S)
                        count.step(readers=-1)
                    try:
                        await held.validate()
                    except stockade.StaleToken:
                        count.false_rejections += 1

    async def probe() -> None:
        try:
            try:
                await asyncio.wait_for(all_in.wait(), MEET_S)
            except TimeoutError:
                failed[0] = meeting.verdict(MEET_S)
                return
            async with stockade.connect_async(coord_url) as coord:
                async with await stockade.open_store_async(store_url, cluster_id=coord.cluster_id) as store:
                    await _probe_async(AsyncReadWriteLock(coord, store, "catalog", readers=CAP), count)
        finally:
            leave.set()

    await asyncio.gather(probe(), *(reader() for _ in range(CAP)))
    return failed[0]


def _run_tasks(coord_url: str, store_url: str) -> _Count:
    count = _Count()

    async def contend(writer: bool) -> None:
        async with stockade.connect_async(coord_url) as coord:
            async with await stockade.open_store_async(store_url, cluster_id=coord.cluster_id) as store:
                rw = AsyncReadWriteLock(coord, store, "catalog", readers=CAP)
                for _ in range(CYCLES):
                    try:
                        await _cycle_async(rw, store, count, writer)
                    except stockade.BackendUnavailable:
                        count.unavailable += 1

    async def body() -> None:
        failed = await _meet_async(coord_url, store_url, count)
        assert not failed, failed
        await asyncio.gather(*(contend(i < WRITERS) for i in range(READERS + WRITERS)))

    with _opened(coord_url):
        asyncio.run(body())
    return count


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_never_a_writer_beside_anyone_nor_more_readers_than_the_cap(coord_url, store_url, backend, twin):
    count = _run_threads(coord_url, store_url, ReadWriteLock) if twin == "sync" else _run_tasks(coord_url, store_url)
    print(f"\nrwlock [{backend} {twin}]: violations {count.violations} of {count.checks} checks; "
          f"most readers at once {count.most_readers} (cap {CAP}); false rejections {count.false_rejections} "
          f"of {(READERS + WRITERS) * CYCLES} holds; cycles that met BackendUnavailable {count.unavailable}")
    assert count.violations == 0 and count.false_rejections == 0
    assert count.checks >= (READERS + WRITERS) * CYCLES * 4 and count.most_readers >= CAP  # readers did share


@pytest.mark.parametrize("backend", ["memory"])
def test_control_a_writer_that_skips_draining_the_readers_is_caught(coord_url, store_url):
    count = _run_threads(coord_url, store_url, _NoDrainLock)
    print(f"\nrwlock control (no drain): violations {count.violations} of {count.checks} checks")
    assert count.violations > 0


@pytest.mark.parametrize("backend", ["memory"])
def test_control_readers_that_cannot_share_fail_the_meeting(coord_url, store_url):
    count = _Count()
    with _opened(coord_url):
        failed = _meet(coord_url, store_url, _OneReaderLock, count, wait_s=2)
    print(f"\nrwlock control (one reader at a time): {failed or 'the readers met'}; most readers at once "
          f"{count.most_readers}")
    assert failed and count.most_readers == 1


# -- zombies, in process: a lease that lapsed (its handle closed, so no keepalive) ---------------------


def _lapsed_writer(coord_url: str, store_url: str) -> stockade.FencingToken:
    """A writer that took the lock and wrote, then stopped renewing: its handle is closed, its lease lapses."""
    with stockade.connect(coord_url) as coord, stockade.open_store(store_url, cluster_id=coord.cluster_id) as store:
        rw = ReadWriteLock(coord, store, "catalog", readers=CAP)
        lease = _short(lambda: rw.acquire_write(ttl_ms=300))
        store.put(rw.scope, "data", "zombie", token=lease.token)
        return lease.token


def _zombie_writes(coord_url: str, store_url: str, lock_class: type[ReadWriteLock]) -> tuple[bool, bool]:
    """Whether the lapsed writer's write was accepted (after a reader got in, after a newer writer wrote)."""
    old = _lapsed_writer(coord_url, store_url)
    with stockade.connect(coord_url) as coord, stockade.open_store(store_url, cluster_id=coord.cluster_id) as store:
        rw = lock_class(coord, store, "catalog", readers=CAP)
        accepted = []
        with rw.read(ttl_ms=10_000, wait_ms=60_000) as reader:  # granted once the zombie's lease lapsed
            assert reader.token.value > old.value
            accepted.append(_try_put(store, rw.scope, old))
            reader.validate()
        with rw.write(ttl_ms=10_000, wait_ms=60_000) as lease:
            store.put(rw.scope, "data", "newer writer", token=lease.token)
            accepted.append(_try_put(store, rw.scope, old))
        assert store.get(rw.scope, "data").value == b"newer writer"
    return accepted[0], accepted[1]


def _try_put(store: stockade.FencedStore, scope: str, token: stockade.FencingToken) -> bool:
    try:
        store.put(scope, "data", "zombie again", token=token)
        return True
    except stockade.StaleToken:
        return False


def test_a_lapsed_writer_is_refused_after_a_reader_and_after_a_newer_writer(coord_url, store_url, backend):
    rounds = [_zombie_writes(coord_url, store_url, ReadWriteLock) for _ in range(ZOMBIE_ROUNDS)]
    after_reader = sum(first for first, _ in rounds)
    after_writer = sum(second for _, second in rounds)
    control = _zombie_writes(coord_url, store_url, _UncheckedReadLock)
    print(f"\nrwlock [{backend}]: lapsed writer's writes accepted after a reader got in {after_reader} of "
          f"{len(rounds)}, after a newer writer wrote {after_writer} of {len(rounds)}; control (readers do not "
          f"check in): accepted after the reader {int(control[0])} of 1")
    assert after_reader == 0 and after_writer == 0
    assert control == (True, False)  # without the readers' check-in the zombie writes under a reader


async def _zombie_writes_async(coord_url: str, store_url: str) -> tuple[bool, bool]:
    """`_zombie_writes` through the async client (`AsyncReadWriteLock`)."""
    async with stockade.connect_async(coord_url) as zombie_coord:
        async with await stockade.open_store_async(store_url, cluster_id=zombie_coord.cluster_id) as store:
            zombie = AsyncReadWriteLock(zombie_coord, store, "catalog", readers=CAP)
            lease = await _short_async(lambda: zombie.acquire_write(ttl_ms=300))
            await store.put(lease.scope, "data", "zombie", token=lease.token)
            old = lease.token
    accepted = []
    async with stockade.connect_async(coord_url) as coord:
        async with await stockade.open_store_async(store_url, cluster_id=coord.cluster_id) as store:
            rw = AsyncReadWriteLock(coord, store, "catalog", readers=CAP)
            for step in ("reader", "writer"):
                async with (rw.read if step == "reader" else rw.write)(ttl_ms=10_000, wait_ms=60_000) as held:
                    assert held.token.value > old.value
                    if step == "writer":
                        await store.put(rw.scope, "data", "newer writer")
                    try:
                        await store.put(rw.scope, "data", "zombie again", token=old)
                        accepted.append(True)
                    except stockade.StaleToken:
                        accepted.append(False)
            assert (await store.get(rw.scope, "data")).value == b"newer writer"
    return accepted[0], accepted[1]


def test_a_lapsed_writer_is_refused_through_the_async_client(coord_url, store_url, backend):
    rounds = [asyncio.run(_zombie_writes_async(coord_url, store_url)) for _ in range(ZOMBIE_ROUNDS)]
    print(f"\nrwlock [{backend} async]: lapsed writer's writes accepted after a reader got in "
          f"{sum(first for first, _ in rounds)} of {len(rounds)}, after a newer writer wrote "
          f"{sum(second for _, second in rounds)} of {len(rounds)}")
    assert all(verdict == (False, False) for verdict in rounds)


def _lapsed_reader_validates(coord_url: str, store_url: str, lock_class: type[ReadWriteLock]) -> bool:
    """Whether a reader whose lease lapsed has its read accepted after a newer writer wrote."""
    with stockade.connect(coord_url) as coord, stockade.open_store(store_url, cluster_id=coord.cluster_id) as store:
        zombie_coord = stockade.connect(coord_url)
        zombie = lock_class(zombie_coord, store, "catalog", readers=CAP)
        reader = _short(lambda: zombie.acquire_read(ttl_ms=300))
        zombie_coord.close()  # no keepalive: the read slot lapses
        rw = lock_class(coord, store, "catalog", readers=CAP)
        with rw.write(ttl_ms=10_000, wait_ms=60_000) as lease:  # granted once the reader's slot lapsed
            store.put(rw.scope, "data", "newer writer", token=lease.token)
        try:
            reader.validate()
            return True
        except stockade.StaleToken:
            return False


def test_a_lapsed_readers_read_is_refused_after_a_newer_writer(coord_url, store_url, backend):
    accepted = sum(_lapsed_reader_validates(coord_url, store_url, ReadWriteLock) for _ in range(ZOMBIE_ROUNDS))
    control = _lapsed_reader_validates(coord_url, store_url, _SilentWriterLock)
    print(f"\nrwlock [{backend}]: lapsed reader's reads accepted after a newer writer {accepted} of "
          f"{ZOMBIE_ROUNDS}; control (writers do not check in) {int(control)} of 1")
    assert accepted == 0 and control


# -- zombies, a real process frozen with SIGSTOP -------------------------------------------------------


def _frozen_rounds(coord_url: str, store_url: str, child_url: str, rounds: int,
                   lock_class: type[ReadWriteLock]) -> list[tuple[str, str]]:
    """Each round: the child takes the write lock and writes, is frozen; this process reads (granted once
    the child's lease lapsed); the child is thawed and writes; this process writes as a newer writer; the
    child writes again. Returns the child's two verdicts per round."""
    child = subprocess.Popen([PYTHON, str(HELPERS / "rw_zombie.py"), child_url, store_url, "catalog", str(CAP)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=python_env(), text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.strip()) for line in child.stdout], daemon=True).start()
    assert child.stdin is not None

    def ask(line: str) -> str:
        child.stdin.write(line + "\n")
        child.stdin.flush()
        return lines.get(timeout=90)

    verdicts = []
    try:
        with stockade.connect(coord_url) as coord, \
                stockade.open_store(store_url, cluster_id=coord.cluster_id) as store:
            rw = lock_class(coord, store, "catalog", readers=CAP)
            for _ in range(rounds):
                old = int(ask("acquire").split()[1])
                child.send_signal(signal.SIGSTOP)
                with rw.read(ttl_ms=10_000, wait_ms=60_000) as reader:
                    assert reader.token.value > old
                    child.send_signal(signal.SIGCONT)
                    first = ask("write")
                with rw.write(ttl_ms=10_000, wait_ms=60_000) as lease:
                    store.put(rw.scope, "data", "newer writer", token=lease.token)
                    second = ask("write")
                child.stdin.write("done\n")
                verdicts.append((first, second))
        child.stdin.close()
        child.wait(30)
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
            child.wait(10)
    return verdicts


def test_a_writer_frozen_with_sigstop_is_refused(coord_url, store_url, backend):
    entry = COORDINATORS[coord_url.split(":", 1)[0]]
    if not entry.served and not entry.remote:
        pytest.skip("this backend lives in one process: the lapsed-lease tests stand for the frozen one")
    child_url = f"{coord_url}?session_timeout_ms={ZK_SESSION_MS}" if backend == "zookeeper" else coord_url
    rounds = _frozen_rounds(coord_url, store_url, child_url, ZOMBIE_ROUNDS, ReadWriteLock)
    control = _frozen_rounds(coord_url, store_url, child_url, 1, _UncheckedReadLock)
    accepted = [sum(verdict[i] == "accepted" for verdict in rounds) for i in (0, 1)]
    print(f"\nrwlock [{backend}]: SIGSTOPped writer's writes accepted after a reader got in {accepted[0]} of "
          f"{len(rounds)}, after a newer writer wrote {accepted[1]} of {len(rounds)}; control (readers do not "
          f"check in): {control[0][0]} after the reader")
    assert all(verdict == ("rejected", "rejected") for verdict in rounds)
    assert control == [("accepted", "rejected")]


# -- starvation --------------------------------------------------------------------------------------


def _writer_amid_readers(coord_url: str, store_url: str, lock_class: type[ReadWriteLock],
                         wait_ms: int) -> tuple[bool, int]:
    """A stream of STREAM readers keeps the lock read-held; a writer asks for it. Returns whether it got
    in within ``wait_ms``, and how many reads were granted between its request and its grant (or timeout)."""
    granted = [0]
    stop = threading.Event()
    errors: list[BaseException] = []

    def read_stream(index: int) -> None:
        try:
            with stockade.connect(coord_url) as coord, \
                    stockade.open_store(store_url, cluster_id=coord.cluster_id) as store:
                rw = ReadWriteLock(coord, store, "catalog", readers=STREAM)
                time.sleep(index * 0.025)
                while not stop.is_set():
                    with rw.read(ttl_ms=10_000, wait_ms=60_000):
                        granted[0] += 1
                        time.sleep(random.uniform(0.08, 0.12))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=read_stream, args=(i,)) for i in range(STREAM)]
    anchor = _opened(coord_url)
    anchor.__enter__()
    for thread in threads:
        thread.start()
    try:
        with stockade.connect(coord_url) as coord, \
                stockade.open_store(store_url, cluster_id=coord.cluster_id) as store:
            rw = lock_class(coord, store, "catalog", readers=STREAM)
            while len(rw.readers_now()) < 2 and not errors:  # the stream runs
                time.sleep(0.01)
            before = granted[0]
            try:
                with rw.write(ttl_ms=10_000, wait_ms=wait_ms):
                    jumped, got_in = granted[0] - before, True
            except stockade.LockTimeout:
                jumped, got_in = granted[0] - before, False
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
        anchor.__exit__(None, None, None)
    assert not errors, errors
    return got_in, jumped


def test_a_writer_is_not_starved_by_a_stream_of_readers(coord_url, store_url, backend):
    got_in, jumped = _writer_amid_readers(coord_url, store_url, ReadWriteLock, 60_000)
    print(f"\nrwlock [{backend}]: the writer got in after {jumped} reads granted while it waited "
          f"({STREAM} readers streaming)")
    assert got_in and jumped <= 2 * STREAM  # those queued at the gate before it, one in flight per reader


@pytest.mark.parametrize("backend", ["memory"])
def test_control_a_readers_preferring_writer_is_starved(coord_url, store_url):
    # The property's negation: more reads jumped the waiting writer than the property allows, in one of at most
    # CONTROL_ATTEMPTS attempts. Whether it got in at all within 3 s is luck: a moment with every reader out
    # lets it in (45 reads jumped it in one run; at a load of 13, 7 in another, where readers are slower to
    # come back).
    attempts = []
    while len(attempts) < CONTROL_ATTEMPTS and not any(jumped > 2 * STREAM for _, jumped in attempts):
        attempts.append(_writer_amid_readers(coord_url, store_url, _ReaderPreferringLock, 3000))
    print(f"\nrwlock control (writer waits for no reader before the gate): (got in, reads granted while it "
          f"waited 3 s) {attempts}")
    assert any(jumped > 2 * STREAM for _, jumped in attempts), attempts


# -- the API -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["embedded", "memory"])
def test_async_waits_until_granted_and_timeouts(coord_url, store_url):
    async def body() -> None:
        async with stockade.connect_async(coord_url) as coord:
            async with await stockade.open_store_async(store_url, cluster_id=coord.cluster_id) as store:
                rw = AsyncReadWriteLock(coord, store, "catalog", readers=2)
                a = await rw.acquire_read(ttl_ms=5000)
                b = await rw.acquire_read(ttl_ms=5000)
                assert set(await rw.readers_now()) == {0, 1} and b.token.value > a.token.value
                with pytest.raises(stockade.LockTimeout) as caught:
                    await rw.acquire_read(ttl_ms=5000, wait_ms=200)  # the cap
                assert caught.value.scope == rw.scope
                with pytest.raises(stockade.LockTimeout):
                    await rw.acquire_write(ttl_ms=5000, wait_ms=200)
                writer = asyncio.ensure_future(rw.acquire_write(ttl_ms=5000, wait_ms=None))  # until granted
                await asyncio.sleep(0.2)
                assert not writer.done()
                await a.release()
                await b.release()
                lease = await writer
                assert lease.token.value > b.token.value and await rw.readers_now() == {}
                with pytest.raises(stockade.StaleToken):
                    await a.validate()  # a newer writer checked in
                await lease.release()

    asyncio.run(body())


@pytest.mark.parametrize("backend", ["memory"])
def test_bad_input_is_refused_before_any_io(coord_url, store_url):
    with stockade.connect(coord_url) as coord, stockade.open_store(store_url, cluster_id=coord.cluster_id) as store:
        for readers in (0, 101, "3", True, None):
            with pytest.raises(stockade.InvalidArgument):
                ReadWriteLock(coord, store, "x", readers=readers)  # type: ignore[arg-type]
        for name in ("bad name/", "", 7, "x" * 200):
            with pytest.raises(stockade.InvalidArgument):
                ReadWriteLock(coord, store, name, readers=2)  # type: ignore[arg-type]
        with pytest.raises(stockade.InvalidArgument):
            ReadWriteLock(object(), store, "x", readers=2)  # type: ignore[arg-type]
        with pytest.raises(stockade.InvalidArgument):
            ReadWriteLock(coord, object(), "x", readers=2)  # type: ignore[arg-type]
        rw = ReadWriteLock(coord, store, "x", readers=2)
        for kwargs in ({"ttl_ms": 0}, {"ttl_ms": 1000, "wait_ms": -1}, {"ttl_ms": "1s"},
                       {"ttl_ms": 1000, "wait_ms": "forever"}, {"ttl_ms": 1000, "holder": "two words"}):
            for acquire in (rw.acquire_read, rw.acquire_write):
                with pytest.raises(stockade.InvalidArgument):
                    acquire(**kwargs)
        assert all(info.state == stockade.ScopeState.FREE for info in coord.scopes())
        assert store.high_water(rw.scope) == 0
