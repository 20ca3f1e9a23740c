"""The semaphore (`stockade.Semaphore`, docs/semaphore.md) on every coordinator backend, sync and async.

Eight contenders share three slots. Each counts itself in while it holds a slot and out before
it releases, and every contender checks the count at each step: it must never exceed 3. First
three holders meet: each, once granted, waits until all three hold (a bounded wait that fails
saying so), so the slots are all used at once by construction, and while they hold a fourth asks
without waiting: let in, it is counted over the limit. An acquire the embedded coordinator answers
"busy" with nothing done (`BackendUnavailable` with ``certain_no_effect``: its file stayed locked
past the store wait, which a loaded host brings) is counted and asked again, up to BUSY_TRIES times. The
slots' fenced resources (a fenced store, one scope per slot) must refuse every stale slot
token: each round, the slot's previous holder writes again with its old token after the
next holder wrote. The control is a semaphore that miscounts its slots (it spreads holders
over one slot more than it admits): the same check must see 4 holders.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time

import pytest

import stockade
from stockade.client import AsyncSemaphore, Semaphore

LONG = os.environ.get("STOCKADE_LONG") == "1"
CONTENDERS = 8
SLOTS = 3
CYCLES = 60 if LONG else 8  # per contender
HOLD_S = 0.05
STALE_ROUNDS = 200 if LONG else 20
MEET_S = 60  # the bounded wait for the holders' meeting
BUSY_TRIES = 10  # acquires answered "busy, nothing done" asked again, per acquire


class _Count:
    """Holders counted in and out; ``checks`` counts every look at the count, ``over`` those above SLOTS."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = self.checks = self.over = self.busy = 0

    def step(self, delta: int) -> None:
        with self.lock:
            self.now += delta
            self.most = max(self.most, self.now)
            self.checks += 1
            self.over += self.now > SLOTS

    def look(self) -> None:
        self.step(0)


class _MiscountedSemaphore(Semaphore):
    """The control: holders spread over one slot more than the semaphore admits."""

    def scope_of(self, slot: int) -> str:
        return f"{self._prefix}{slot}" if slot < self.slots else super().scope_of(slot)

    def _sweep(self, first, ttl_ms, holder):  # type: ignore[no-untyped-def]
        for step in range(self.slots + 1):
            try:
                return self._coord.acquire(f"{self._prefix}{(first + step) % (self.slots + 1)}", ttl_ms=ttl_ms,
                                           wait_ms=0, holder=holder)
            except stockade.LockTimeout:
                continue
        return None


def _acquire(semaphore: Semaphore, count: _Count, wait_ms: int = 60_000) -> stockade.Lease:
    """``semaphore.acquire``, asked again when the answer was "busy, nothing done" (counted in ``busy``)."""
    for attempt in range(BUSY_TRIES):
        try:
            return semaphore.acquire(ttl_ms=10_000, wait_ms=wait_ms)
        except stockade.BackendUnavailable as exc:
            if not exc.certain_no_effect or attempt == BUSY_TRIES - 1:
                raise
            with count.lock:
                count.busy += 1
    raise AssertionError("unreachable")


async def _acquire_async(semaphore: AsyncSemaphore, count: _Count, wait_ms: int = 60_000) -> stockade.AsyncLease:
    """`_acquire` through the async client."""
    for attempt in range(BUSY_TRIES):
        try:
            return await semaphore.acquire(ttl_ms=10_000, wait_ms=wait_ms)
        except stockade.BackendUnavailable as exc:
            if not exc.certain_no_effect or attempt == BUSY_TRIES - 1:
                raise
            count.busy += 1
    raise AssertionError("unreachable")


def _probe(semaphore: Semaphore, count: _Count) -> None:
    """While SLOTS holders hold: one more asks without waiting; let in, it is counted over the limit."""
    try:
        lease = _acquire(semaphore, count, wait_ms=0)
    except stockade.LockTimeout:
        return
    count.step(+1)
    count.step(-1)
    lease.release()


def _meet(semaphores: list[Semaphore], count: _Count) -> None:
    """SLOTS holders (``semaphores[:SLOTS]``) hold at once, each waiting until all are in (at most MEET_S);
    meanwhile ``semaphores[SLOTS]`` probes."""
    granted, all_in, leave, errors = [0], threading.Event(), threading.Event(), []

    def holder(semaphore: Semaphore) -> None:
        try:
            lease = _acquire(semaphore, count, wait_ms=MEET_S * 1000)
            count.step(+1)
            with count.lock:
                granted[0] += 1
                if granted[0] == SLOTS:
                    all_in.set()
            leave.wait(MEET_S)
            count.step(-1)
            lease.release()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=holder, args=(semaphore,)) for semaphore in semaphores[:SLOTS]]
    for thread in threads:
        thread.start()
    try:
        met = all_in.wait(MEET_S)
        together = granted[0]
        if met:
            _probe(semaphores[SLOTS], count)
    finally:
        leave.set()
        for thread in threads:
            thread.join(MEET_S + 60)
    assert not errors, errors
    assert met, f"the holders never held the slots together: {together} of {SLOTS} held at once after {MEET_S} s"


def _contend(semaphore: Semaphore, count: _Count, errors: list[BaseException]) -> None:
    try:
        for _ in range(CYCLES):
            lease = _acquire(semaphore, count)
            try:
                count.step(+1)
                # Hold until one more holder than the slots came in, or HOLD_S passed: the honest run never
                # sees it, so holders overlap as much as they can; the control's extra holder shows at once.
                end = time.monotonic() + HOLD_S
                while count.now <= SLOTS and time.monotonic() < end:
                    count.look()
                    time.sleep(0.001)
            finally:
                count.step(-1)
                lease.release()
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


def _run_threads(coord_url: str, semaphore_class: type[Semaphore]) -> _Count:
    count, errors = _Count(), []
    coords = [stockade.connect(coord_url) for _ in range(CONTENDERS)]
    try:
        semaphores = [semaphore_class(coord, "exports", slots=SLOTS) for coord in coords]
        _meet(semaphores, count)
        threads = [threading.Thread(target=_contend, args=(semaphore, count, errors)) for semaphore in semaphores]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    finally:
        for coord in coords:
            coord.close()
    assert not errors, errors
    return count


async def _meet_async(semaphores: list[AsyncSemaphore], count: _Count) -> None:
    """`_meet` through the async client."""
    granted, all_in, leave = [0], asyncio.Event(), asyncio.Event()

    async def holder(semaphore: AsyncSemaphore) -> None:
        lease = await _acquire_async(semaphore, count, wait_ms=MEET_S * 1000)
        count.step(+1)
        granted[0] += 1
        if granted[0] == SLOTS:
            all_in.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(leave.wait(), MEET_S)
        count.step(-1)
        await lease.release()

    async def probe() -> int:
        try:
            try:
                await asyncio.wait_for(all_in.wait(), MEET_S)
            except TimeoutError:
                return granted[0]
            try:
                lease = await _acquire_async(semaphores[SLOTS], count, wait_ms=0)
            except stockade.LockTimeout:
                return SLOTS
            count.step(+1)
            count.step(-1)
            await lease.release()
            return SLOTS
        finally:
            leave.set()

    together, *_ = await asyncio.gather(probe(), *(holder(semaphore) for semaphore in semaphores[:SLOTS]))
    assert together == SLOTS, f"the holders never held the slots together: {together} of {SLOTS} held at once " \
        f"after {MEET_S} s"


async def _contend_async(semaphore: AsyncSemaphore, count: _Count) -> None:
    for _ in range(CYCLES):
        lease = await _acquire_async(semaphore, count)
        try:
            count.step(+1)
            end = time.monotonic() + HOLD_S
            while count.now <= SLOTS and time.monotonic() < end:
                count.look()
                await asyncio.sleep(0.001)
        finally:
            count.step(-1)
            await lease.release()


def _run_tasks(coord_url: str) -> _Count:
    count = _Count()

    async def body() -> None:
        coords = [stockade.connect_async(coord_url) for _ in range(CONTENDERS)]
        try:
            semaphores = [AsyncSemaphore(coord, "exports", slots=SLOTS) for coord in coords]
            await _meet_async(semaphores, count)
            await asyncio.gather(*(_contend_async(semaphore, count) for semaphore in semaphores))
        finally:
            for coord in coords:
                await coord.aclose()

    asyncio.run(body())
    return count


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_never_more_holders_than_slots(coord_url, twin):
    count = _run_threads(coord_url, Semaphore) if twin == "sync" else _run_tasks(coord_url)
    print(f"semaphore: more than {SLOTS} holders in {count.over} of {count.checks} checks; most {count.most}; "
          f"acquires answered busy (nothing done) and asked again {count.busy}")
    assert count.over == 0 and count.most == SLOTS and count.checks >= CONTENDERS * CYCLES * 2


@pytest.mark.parametrize("backend", ["memory"])
def test_control_a_miscounted_semaphore_is_caught(coord_url):
    count = _run_threads(coord_url, _MiscountedSemaphore)
    print(f"semaphore control: more than {SLOTS} holders in {count.over} of {count.checks} checks")
    assert count.over > 0 and count.most == SLOTS + 1


def test_a_slots_resource_refuses_its_previous_holders_token(coord_url, store_url):
    coord = stockade.connect(coord_url)
    store = stockade.open_store(store_url, cluster_id=coord.cluster_id)
    semaphore = Semaphore(coord, "exports", slots=SLOTS)
    stale_accepted = rounds = 0
    try:
        for i in range(STALE_ROUNDS):
            first = semaphore.acquire(ttl_ms=10_000)
            slot, old = semaphore.slot_of(first), first.token
            store.put(first.scope, "v", f"first {i}".encode(), token=old)
            first.release()
            others = [semaphore.acquire(ttl_ms=10_000) for _ in range(SLOTS)]  # every slot: one is `slot` again
            again = next(lease for lease in others if semaphore.slot_of(lease) == slot)
            assert again.token.value > old.value
            store.put(again.scope, "v", f"next {i}".encode(), token=again.token)
            try:
                store.put(first.scope, "v", b"stale", token=old)
                stale_accepted += 1
            except stockade.StaleToken:
                pass
            rounds += 1
            for lease in others:
                lease.release()
        assert store.get(f"sem.exports.{slot}", "v").value != b"stale"
    finally:
        store.close()
        coord.close()
    print(f"semaphore: stale slot tokens accepted {stale_accepted} of {rounds}")
    assert stale_accepted == 0 and rounds == STALE_ROUNDS


@pytest.mark.parametrize("backend", ["embedded", "memory"])
def test_async_semaphore_and_the_full_wait(coord_url):
    async def body() -> None:
        async with stockade.connect_async(coord_url) as coord:
            semaphore = AsyncSemaphore(coord, "jobs", slots=2)
            a = await semaphore.acquire(ttl_ms=5000)
            b = await semaphore.acquire(ttl_ms=5000)
            assert {semaphore.slot_of(a), semaphore.slot_of(b)} == {0, 1}
            assert set(await semaphore.holders()) == {0, 1}
            with pytest.raises(stockade.LockTimeout):
                await semaphore.acquire(ttl_ms=5000, wait_ms=250)
            waiter = asyncio.ensure_future(semaphore.acquire(ttl_ms=5000, wait_ms=None))  # until granted
            await asyncio.sleep(0)
            await a.release()
            c = await waiter
            assert semaphore.slot_of(c) == semaphore.slot_of(a) and c.token.value > a.token.value
            await b.release()
            await c.release()
            assert await semaphore.holders() == {}

    asyncio.run(body())


@pytest.mark.parametrize("backend", ["memory"])
def test_bad_input_is_refused_before_any_io(coord_url):
    with stockade.connect(coord_url) as coord:
        for kwargs in ({"slots": 0}, {"slots": 1001}, {"slots": "3"}, {"slots": True}):
            with pytest.raises(stockade.InvalidArgument):
                Semaphore(coord, "x", **kwargs)
        with pytest.raises(stockade.InvalidArgument):
            Semaphore(coord, "bad name/", slots=2)
        with pytest.raises(stockade.InvalidArgument):
            Semaphore(object(), "x", slots=2)  # type: ignore[arg-type]
        semaphore = Semaphore(coord, "x", slots=2)
        for kwargs in ({"ttl_ms": 0}, {"ttl_ms": 1000, "wait_ms": -1}, {"ttl_ms": "1s"}):
            with pytest.raises(stockade.InvalidArgument):
                semaphore.acquire(**kwargs)
        other = coord.acquire("y", ttl_ms=1000)
        with pytest.raises(stockade.InvalidArgument):
            semaphore.slot_of(other)
        other.release()
        assert coord.scopes() == [] or all(info.state == stockade.ScopeState.FREE for info in coord.scopes())
