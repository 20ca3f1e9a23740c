"""Snowflake ids with leased worker numbers: uncoordinated on the hot path, safe across handoffs.

    coord = stockade.connect("sqlite:////var/lib/stockade/coord.db")
    with IdGenerator(coord, "orders") as ids:
        order_id = ids.next_id()

At startup the generator leases one worker number from the coordinator (the
scope ``ids.<name>.<n>``) and keeps the lease alive in the background. Ids are
then made in this process alone: no coordinator call per id. The generator
stops issuing once its lease may be lost (K2), handles a wall clock that goes
backwards (wait up to a bound, or refuse), and does not issue with a worker
number it just took over until no id of the previous holder can equal one of
its own. The guarantee and its assumptions are in docs/ids.md.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from stockade.client import Coordinator, FencedStore, Lease
from stockade.core.errors import InvalidArgument, LeaseLost, LimitExceeded, LockTimeout, StaleToken
from stockade.core.leases import ScopeState
from stockade.core.limits import LIST_PAGE_MAX, validate_int, validate_scope, validate_ttl_ms
from stockade.recipes._ids_layout import DEFAULT_EPOCH_MS, ClockBehind, IdParts, Layout

__all__ = ["IdGenerator", "Layout", "IdParts", "ClockBehind", "DEFAULT_EPOCH_MS", "RESERVED_KEY"]

log = logging.getLogger("stockade.recipes.ids")

#: The store key (in the worker number's scope) of the holder's reservation: "<layout> <timestamp>".
RESERVED_KEY = "reserved"
CLAIM_KEY = "claim"
RANDOM_PROBES = 4  # numbers tried at random before the coordinator's scopes are listed
LISTED_PROBES = 16  # free numbers from the listing tried before giving up
BLOCK_MAX = 1 << 30
NEXT_IDS_MAX = 10_000_000
WAIT_STEP_S = 0.001


class IdGenerator:
    """Makes unique 63-bit ids under one leased worker number.

    Args:
        coord: a `stockade.Coordinator` (any backend).
        name: the id space; worker numbers are the scopes ``ids.<name>.<n>``.
        layout: the bit layout (`Layout`); every generator of ``name`` must use the same.
        store: optional `stockade.FencedStore` (any url). With it, each holder
            records in the store, under its lease's token, the greatest timestamp
            it may use (``reserve_ms`` ahead of its clock), and the next holder
            of the number starts above it: safe whatever the old holder's clock
            did. Without it, the next holder starts above its own clock at the
            grant plus ``max_clock_skew_ms`` (docs/ids.md says when each is safe).
        ttl_ms: the worker number's lease TTL (renewed at about TTL/3).
        max_clock_skew_ms: the most any generator's wall clock may be ahead of
            another's, steps included (0 .. 1 h); a new holder waits this long.
        reserve_ms: with a store, how far ahead of the clock a reservation
            reaches (100 ms .. 1 h); renewed in the background at a quarter of it.
        on_clock_behind: ``"wait"`` (up to ``max_behind_ms``, then `ClockBehind`)
            or ``"refuse"`` (`ClockBehind` at once) when the clock went backwards.
        max_behind_ms: the longest wait for a clock that went backwards (0 .. 1 h).
        max_handoff_wait_ms: the longest wait at startup for the clock to pass
            the previous holder's last timestamp (0 .. 1 h), else `ClockBehind`.
        holder: the lease's holder label (default ``host:pid``).
        wall_ns: the wall clock in Unix nanoseconds (default `time.time_ns`).

    Raises:
        InvalidArgument: a bad argument, or the store's record has another layout.
        LimitExceeded: no free worker number was found.
        ClockBehind: the clock did not pass the handoff floor in time.
        LeaseLost: the worker number's lease was lost during the start-up
            hand-over: this process paused past ``ttl_ms`` (or the store
            refused its claim because a newer holder had taken the number
            over). No id was issued and nothing stays held; make a new
            generator, which leases a worker number afresh.
        BackendUnavailable: the coordinator or the store failed.

    Not for use from several threads at once without your own lock; use one
    generator per thread (each has its own worker number) or guard it.
    """

    # Private seams for the tests' controls (tests/test_ids.py): with False, a
    # generator keeps issuing after its lease is lost, or ignores the previous
    # holder's timestamps when it takes a worker number over.
    _check_lease = True
    _handoff_floor = True

    def __init__(
        self,
        coord: Coordinator,
        name: str,
        *,
        layout: Layout | None = None,
        store: FencedStore | None = None,
        ttl_ms: int = 10_000,
        max_clock_skew_ms: int = 1_000,
        reserve_ms: int = 2_000,
        on_clock_behind: str = "wait",
        max_behind_ms: int = 5_000,
        max_handoff_wait_ms: int = 30_000,
        holder: str | None = None,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.layout = Layout() if layout is None else layout
        if not isinstance(self.layout, Layout):
            raise InvalidArgument("layout", f"must be a Layout, got {type(layout).__name__}")
        if not isinstance(name, str):
            raise InvalidArgument("name", f"must be a str, got {type(name).__name__}")
        if not isinstance(coord, Coordinator):
            raise InvalidArgument("coord", "must be a coordinator (stockade.connect)")
        self.name = name
        self._prefix = f"ids.{name}."
        self._width = len(str(self.layout.workers - 1))
        validate_scope(self._prefix + "0" * self._width)
        validate_ttl_ms(ttl_ms)
        validate_int("max_clock_skew_ms", max_clock_skew_ms, 0, 3_600_000)
        validate_int("reserve_ms", reserve_ms, 100, 3_600_000)
        validate_int("max_behind_ms", max_behind_ms, 0, 3_600_000)
        validate_int("max_handoff_wait_ms", max_handoff_wait_ms, 0, 3_600_000)
        if on_clock_behind not in ("wait", "refuse"):
            raise InvalidArgument("on_clock_behind", f"must be 'wait' or 'refuse', got {on_clock_behind!r}")
        if not callable(wall_ns):
            raise InvalidArgument("wall_ns", "must be callable")
        if self.layout.timestamp_at(wall_ns()) < 0:  # ids would be negative
            raise InvalidArgument("layout", f"epoch_ms {self.layout.epoch_ms} is later than the clock")
        self._coord = coord
        self._store = store
        self._wall = wall_ns
        self._unit_ns = self.layout.time_unit_ms * 1_000_000
        self._epoch_ns = self.layout.epoch_ms * 1_000_000
        self._skew_ns = max_clock_skew_ms * 1_000_000
        self._reserve_units = -(-reserve_ms // self.layout.time_unit_ms)
        self._behind_ns = 0 if on_clock_behind == "refuse" else max_behind_ms * 1_000_000
        self._handoff_wait_ns = max_handoff_wait_ms * 1_000_000
        self._seq_max = self.layout.sequence_max
        self._shift = self.layout.timestamp_shift
        self._lock = threading.Lock()  # the slow path and the reservation
        self._reserve_lock = threading.Lock()
        self._stop = threading.Event()
        self._pause = threading.Event()  # never set: waits (Event.wait, not time.sleep) of the slow path
        self._closed = False
        self._failure: BaseException | None = None
        self._reserved = self.layout.timestamp_max if store is None else -1  # greatest usable timestamp
        self._attempted = -1  # greatest reservation ever sent (its outcome may be unknown)
        self._reserver: threading.Thread | None = None
        # The current tick: ids are (_ts << shift) | worker bits | _seq. _ts = -1: no tick.
        self._ts = -1
        self._seq = self._seq_max
        self._base = 0
        self.lease = self._lease_worker(ttl_ms, holder)
        try:
            self.worker = int(self.lease.scope[len(self._prefix):])
            self._worker_bits = self.worker << self.layout.sequence_bits
            self.floor = self._handoff()
            if store is not None:
                self._reserver = threading.Thread(target=self._keep_reserving, args=(reserve_ms,), daemon=True,
                                                  name=f"stockade-ids-reserve-{self.lease.scope}")
                self._reserver.start()
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"<IdGenerator {self.name!r} worker={getattr(self, 'worker', None)} closed={self._closed}>"

    def __enter__(self) -> IdGenerator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def scope(self) -> str:
        """The scope of the worker number's lease, ``ids.<name>.<n>``."""
        return str(self.lease.scope)

    def _now_ts(self) -> int:
        return (self._wall() - self._epoch_ns) // self._unit_ns

    # -- the hot path ------------------------------------------------------------------

    def next_id(self) -> int:
        """A new id, greater than every id this generator made before.

        Raises:
            LeaseLost: the worker number's lease is (or may be) lost, or the
                generator is closed; it never issues again.
            ClockBehind: the clock went backwards further or longer than allowed.
            LimitExceeded: the timestamp no longer fits ``timestamp_bits``.
            BackendUnavailable: with a store, the reservation could not be extended.
        """
        ts = (self._wall() - self._epoch_ns) // self._unit_ns
        if ts == self._ts:
            seq = self._seq + 1
            if seq <= self._seq_max:
                self._seq = seq
                return self._base | seq
        with self._lock:
            return self._slow(ts)

    def next_block(self, max_n: int) -> range:
        """Up to ``max_n`` consecutive ids (at least one) from the current time step, as a range.

        The cheapest way to many ids: a block is made with one clock reading and
        one check. Raises as `next_id`.
        """
        if type(max_n) is not int or not 1 <= max_n <= BLOCK_MAX:
            raise InvalidArgument("max_n", f"must be an int in 1..{BLOCK_MAX}, got {max_n!r}")
        first = self.next_id()
        with self._lock:
            if self._ts != first >> self._shift or (self._seq & self._seq_max) != (first & self._seq_max):
                return range(first, first + 1)  # the tick moved on under another thread
            extra = min(max_n - 1, self._seq_max - self._seq)
            self._seq += extra
        return range(first, first + extra + 1)

    def next_ids(self, n: int) -> list[int]:
        """``n`` new ids, ascending (1 .. 10_000_000). Raises as `next_id`; the ids made so far are lost then."""
        validate_int("n", n, 1, NEXT_IDS_MAX)
        out: list[int] = []
        while len(out) < n:
            out.extend(self.next_block(n - len(out)))
        return out

    def _slow(self, ts: int) -> int:
        """A new tick, an exhausted sequence, or a clock that went backwards (under the lock)."""
        started_ns: int | None = None
        while True:
            if self._failure is not None:
                raise self._failure
            if ts > self._ts:
                return self._new_tick(ts)
            if ts == self._ts and self._seq < self._seq_max:
                self._seq += 1
                return self._base | self._seq
            # The sequence of this step is used up (ts == _ts), or the clock is behind.
            behind_ns = (self._ts - ts) * self._unit_ns
            now_ns = time.monotonic_ns()
            started_ns = now_ns if started_ns is None else started_ns
            if behind_ns > 0 and now_ns - started_ns >= self._behind_ns:
                raise ClockBehind(behind_ns // 1_000_000, (now_ns - started_ns) // 1_000_000)
            if behind_ns > 0:
                self._pause.wait(WAIT_STEP_S)
            else:  # the step's sequence is used up: sleep until the next step begins
                next_step_ns = self._epoch_ns + (self._ts + 1) * self._unit_ns
                self._pause.wait(min(WAIT_STEP_S * 50, max(0.0, (next_step_ns - self._wall()) / 1e9)))
            ts = self._now_ts()

    def _new_tick(self, ts: int) -> int:
        # The timestamp was read before these checks: every id carries a timestamp
        # no later than the clock at a moment the lease was still valid (docs/ids.md).
        if ts > self.layout.timestamp_max:
            raise LimitExceeded("timestamp_bits", self.layout.timestamp_bits, "the timestamp no longer fits")
        if ts < 0:  # the clock stepped back before the layout's epoch
            raise ClockBehind(-ts * self.layout.time_unit_ms, 0)
        if ts > self._reserved:
            self._extend(ts)
        if self._check_lease and self.lease.lost:
            self._fail(LeaseLost(self.scope, self.lease.token, self.lease.lost_cause))
        if self._failure is not None:
            raise self._failure
        self._ts = ts
        self._seq = 0
        self._base = (ts << self._shift) | self._worker_bits
        return self._base

    def _fail(self, error: BaseException) -> None:
        """Stop issuing for good: every later call raises ``error``."""
        if self._failure is None:
            self._failure = error
        self._ts = -1  # the fast path misses from now on
        raise self._failure

    def _on_lost(self, lease: Lease) -> None:
        if self._check_lease and self._failure is None:
            self._failure = LeaseLost(lease.scope, lease.token, lease.lost_cause)
            self._ts = -1

    # -- leasing a worker number ---------------------------------------------------------

    def _scope_of(self, number: int) -> str:
        return f"{self._prefix}{number:0{self._width}d}"

    def _lease_worker(self, ttl_ms: int, holder: str | None) -> Lease:
        workers = self.layout.workers
        tried: set[int] = set()
        for number in random.sample(range(workers), min(RANDOM_PROBES, workers)):
            lease = self._try(number, ttl_ms, holder)
            if lease is not None:
                return lease
            tried.add(number)
        free = sorted(set(range(workers)) - self._held_numbers() - tried)
        for number in random.sample(free, min(LISTED_PROBES, len(free))):
            lease = self._try(number, ttl_ms, holder)
            if lease is not None:
                return lease
        raise LimitExceeded("worker_bits", self.layout.worker_bits, f"no free worker number for {self.name!r}")

    def _try(self, number: int, ttl_ms: int, holder: str | None) -> Lease | None:
        try:
            return self._coord.acquire(self._scope_of(number), ttl_ms=ttl_ms, wait_ms=0, holder=holder,
                                       on_lost=self._on_lost)
        except LockTimeout:
            return None

    def _held_numbers(self) -> set[int]:
        """The worker numbers the coordinator shows held (or delayed), a page at a time."""
        held: set[int] = set()
        after = self._prefix
        for _ in range(self.layout.workers // LIST_PAGE_MAX + 2):
            page = self._coord.scopes(after=after, limit=LIST_PAGE_MAX)
            for info in page:
                if not info.scope.startswith(self._prefix):
                    return held
                suffix = info.scope[len(self._prefix):]
                if info.state is not ScopeState.FREE and suffix.isdigit() and len(suffix) == self._width:
                    held.add(int(suffix))
            if len(page) < LIST_PAGE_MAX:
                break
            after = page[-1].scope
        return held

    # -- the handoff ---------------------------------------------------------------------

    def _handoff(self) -> int:
        """The greatest timestamp a previous holder of this number may have used; wait until past it."""
        # Read after the grant: the previous holder checked its lease before the grant,
        # with a clock at most max_clock_skew_ms ahead of this one.
        floor = (self._wall() + self._skew_ns - self._epoch_ns) // self._unit_ns
        if self._store is not None:
            token = self.lease.token
            try:  # fences the old holder out: its reservations from now on are refused
                self._store.put(self.scope, CLAIM_KEY, str(self.lease.holder), token=token)
            except StaleToken as exc:  # a newer holder already took the number over
                raise LeaseLost(self.scope, token, f"claim refused: {exc}") from exc
            item = self._store.get(self.scope, RESERVED_KEY)
            if item is not None:
                layout, _, value = bytes(item.value).decode().partition(" ")
                if layout != self.layout.fingerprint():
                    raise InvalidArgument("layout", f"{self.scope} was used with layout {layout}")
                floor = max(floor, int(value))
            self._attempted = max(self._attempted, floor)
        if not self._handoff_floor:
            floor = -1
        started_ns = time.monotonic_ns()
        while (now_ts := self._now_ts()) <= floor:
            waited_ns = time.monotonic_ns() - started_ns
            if waited_ns >= self._handoff_wait_ns:
                raise ClockBehind((floor - now_ts + 1) * self.layout.time_unit_ms, waited_ns // 1_000_000)
            self._pause.wait(min(0.05, max(WAIT_STEP_S, (floor - now_ts) * self._unit_ns / 1e9)))
        self._ts = floor
        self._seq = self._seq_max  # the first id starts a new tick above the floor
        if self._store is not None:
            self._extend(now_ts)
        return floor

    def _extend(self, ts: int) -> None:
        """Record, under the lease's token, that this holder may use timestamps up to ts + reserve."""
        store = self._store
        if store is None:  # without a store every timestamp of the layout is usable
            return
        with self._reserve_lock:
            if self._failure is not None:
                raise self._failure
            if ts <= self._reserved - self._reserve_units // 2:
                return
            # Never lower the record: a reservation whose outcome was unknown may be in the store.
            target = max(ts + self._reserve_units, self._attempted)
            self._attempted = target
            try:
                store.put(self.scope, RESERVED_KEY, f"{self.layout.fingerprint()} {target}", token=self.lease.token)
            except StaleToken as exc:
                self._fail(LeaseLost(self.scope, self.lease.token, f"reservation refused: {exc}"))
            self._reserved = max(self._reserved, target)

    def _keep_reserving(self, reserve_ms: int) -> None:
        while not self._stop.wait(reserve_ms / 4 / 1000):
            try:
                self._extend(self._now_ts())
            except LeaseLost:
                return
            except Exception as exc:  # noqa: BLE001 - backend trouble: the hot path extends itself if it must
                log.info("reservation failed, retrying", extra={"scope": self.scope, "error": repr(exc)})

    def close(self) -> None:
        """Stop issuing and release the worker number. Idempotent."""
        self._closed = True
        if self._failure is None:
            lease = getattr(self, "lease", None)
            self._failure = LeaseLost(self._prefix if lease is None else lease.scope, None, "generator closed")
        self._ts = -1
        self._stop.set()
        if self._reserver is not None and self._reserver is not threading.current_thread():
            self._reserver.join()
        lease = getattr(self, "lease", None)
        if lease is not None:
            try:
                lease.release()
            except Exception as exc:  # noqa: BLE001 - the lease expires by its TTL anyway
                log.warning("release failed", extra={"scope": lease.scope, "error": repr(exc)})
