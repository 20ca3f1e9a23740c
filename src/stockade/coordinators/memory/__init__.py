"""Scope records in memory: the record store of the server and the simulator, and the ``memory://`` backend.

`MemoryRecords` is the `stockade.core.engine.RecordStore` port over plain
dictionaries. It is not durable by itself: whoever needs durability hangs a
hook on it (``on_commit``) that receives every committed unit's changes in
order. ``stockade serve`` hands them to its group committer and answers only
once they are on disk; the simulator copies them into the node's "disk" (or,
as a control, forgets to).

`MemoryCoordinator` is the lease engine over it with the host's clock: a
coordinator that lives as long as its process. ``connect("memory://NAME")``
opens the process's coordinator called NAME; it exists to prove that a new
backend is one module, one registry entry and one conformance parameter, and
for tests of code that uses stockade. Its tokens do not survive the process
(C1 holds only within it): never use it to protect durable data.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from stockade.clock import SystemClock
from stockade.coordinators._mint import new_cluster_id
from stockade.coordinators.journal import HistoryEvent, Journaled, MemoryJournal, events_of
from stockade.core.clock import Clock
from stockade.core.engine import LeaseEngine
from stockade.core.errors import InvalidArgument, LimitExceeded, invariant
from stockade.core.leases import LeasePolicy, ScopeRecord
from stockade.core.tokens import EPOCH_TICK_NS, epoch_ready, next_epoch

#: Longest a new epoch waits for the wall clock to leave its tick (more: the clock is behind the file).
EPOCH_WAIT_MAX_NS = 10 * EPOCH_TICK_NS


def wait_for_epoch(after: int, wall_ns: Callable[[], int]) -> int:
    """A new epoch above ``after``, once the wall clock has left its tick (at most ``EPOCH_WAIT_MAX_NS``).

    When the wall clock is behind ``after`` by more than that (it was set
    back), the epoch is ``after + 1`` at once: tokens stay unique in the file,
    but an older copy brought back later is covered only once the clock passes
    the epoch again (docs/coordinator-files.md).
    """
    epoch = next_epoch(after, wall_ns())
    give_up_ns = wall_ns() + EPOCH_WAIT_MAX_NS
    while not epoch_ready(epoch, now_ns := wall_ns()) and now_ns < give_up_ns:
        time.sleep(EPOCH_TICK_NS / 1e9 / 4)
    return epoch

__all__ = ["MemoryRecords", "MemoryCoordinator", "Change", "SCOPES_MAX_DEFAULT", "wait_for_epoch"]

#: Scopes kept in memory; a change that would add one more raises `LimitExceeded`.
SCOPES_MAX_DEFAULT = 100_000

#: One committed change of a scope: ``(old, new)``; ``new`` is None when the scope was forgotten.
Change = tuple[ScopeRecord, ScopeRecord | None]


class MemoryRecords(Journaled):
    """Scope records in dictionaries, with the indexes the engine asks for.

    Args:
        records: records to start from (e.g. loaded from disk).
        scopes_max: bound on stored scopes.
        on_commit: called with the ``(old, new)`` changes of each committed
            unit, in order, before the unit's operation returns (``new`` is
            None for a forgotten scope).
        epoch_floor: a floor every grant counts above (the epoch of the
            coordinator file these records were loaded from; 0: none).
        forgotten_floor: the greatest last token of scopes forgotten before.
        wall_ns: the wall clock, when the records' tokens carry epochs (a
            scope whose counter runs out moves to a new epoch); None: no epochs.
        journal: keep the history in memory (`MemoryJournal`). ``stockade serve``
            turns it off: its coordinator file journals every change it commits,
            and its history is read from there (what has committed).

    Thread-safe: a unit holds a lock from start to commit. Scope names are kept
    in the order they last changed, so the least recently changed come first
    when the engine looks for idle scopes to forget.
    """

    def __init__(
        self,
        records: dict[str, ScopeRecord] | None = None,
        *,
        scopes_max: int = SCOPES_MAX_DEFAULT,
        on_commit: Callable[[Sequence[Change]], object] | None = None,
        epoch_floor: int = 0,
        forgotten_floor: int = 0,
        wall_ns: Callable[[], int] | None = None,
        journal: bool = True,
    ) -> None:
        self.scopes_max = scopes_max
        self.on_commit = on_commit
        self.epoch_floor = epoch_floor
        self.forgotten_floor = forgotten_floor
        self.wall_ns = wall_ns
        self._recency: dict[str, None] = {}  # scope names, least recently changed first
        self._records: dict[str, ScopeRecord] = {}
        self._names: list[str] = []
        self._scope_of_lease: dict[str, str] = {}
        self._lock = threading.RLock()
        # The history, added to at each unit's commit (docs/history.md); None: kept elsewhere.
        self.journal: MemoryJournal | None = MemoryJournal() if journal else None
        for record in (records or {}).values():
            self._put(record.scope, None, record)

    # -- the port ------------------------------------------------------------------------------

    def write(self) -> _MemoryTx:
        return _MemoryTx(self, writing=True)

    def read(self) -> _MemoryTx:
        return _MemoryTx(self, writing=False)

    def close(self) -> None:
        """Nothing to release: the records live as long as the object."""

    def history(self, scope: str, limit: int) -> list[HistoryEvent]:
        """The scope's last ``limit`` events, oldest first.

        Raises:
            InvalidArgument: these records keep no journal (their owner's file does).
        """
        if self.journal is None:
            raise InvalidArgument("url", "these records keep no lease history: their coordinator file does")
        return self.journal.history(scope, limit)

    # -- direct reads (no unit needed: one dictionary lookup) ----------------------------------

    # (Here and in `_MemoryTx`, a lookup is ``in`` then ``[]``: ``dict.get`` is a call, on every request.)

    def peek(self, scope: str) -> ScopeRecord | None:
        """The stored record of ``scope``, or None."""
        return self._records[scope] if scope in self._records else None

    def scope_of_lease(self, lease_id: str) -> str | None:
        """The scope whose lease has this id, or None."""
        return self._scope_of_lease[lease_id] if lease_id in self._scope_of_lease else None

    @property
    def records(self) -> Mapping[str, ScopeRecord]:
        """The stored records (a live, read-only view)."""
        return MappingProxyType(self._records)

    @property
    def names(self) -> Sequence[str]:
        """The stored scope names in order (a live view; do not modify)."""
        return self._names

    def snapshot(self) -> dict[str, ScopeRecord]:
        """A copy of every stored record."""
        with self._lock:
            return dict(self._records)

    @property
    def lease_count(self) -> int:
        return len(self._scope_of_lease)

    def __len__(self) -> int:
        return len(self._records)

    # -- changes ---------------------------------------------------------------------------------

    def _put(self, scope: str, old: ScopeRecord | None, new: ScopeRecord | None) -> None:
        """Make ``new`` the stored record of ``scope`` (None: forget it), keeping the indexes."""
        old_lease = old.lease if old is not None else None
        new_lease = new.lease if new is not None else None
        # (Membership, then ``del``: no call, where ``dict.pop`` is one, on every change.)
        if old_lease is not None and (new_lease is None or new_lease.lease_id != old_lease.lease_id) \
                and old_lease.lease_id in self._scope_of_lease:
            del self._scope_of_lease[old_lease.lease_id]
        if new_lease is not None and (old_lease is None or old_lease.lease_id != new_lease.lease_id):
            self._scope_of_lease[new_lease.lease_id] = scope
        if scope in self._recency:
            del self._recency[scope]
        if new is None:
            del self._records[scope]
            del self._names[bisect.bisect_left(self._names, scope)]
            return
        if old is None:
            bisect.insort(self._names, scope)
        self._records[scope] = new
        self._recency[scope] = None


class _MemoryTx:
    """One unit of `MemoryRecords`, its own context manager (the server runs one per request).

    Changes apply at once and are undone if the unit fails; a write unit hands
    its changes to ``on_commit`` when it ends without an error.
    """

    __slots__ = ("_store", "_writing", "changes", "_floors")

    def __init__(self, store: MemoryRecords, *, writing: bool) -> None:
        self._store = store
        self._writing = writing
        self.changes: list[Change] = []
        self._floors: list[int] = []  # forgotten floors before each forget of this unit (for undo)

    def __enter__(self) -> _MemoryTx:
        self._store._lock.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        store = self._store
        try:
            if exc_type is not None:
                self.undo()
            elif self.changes:
                if store.on_commit is not None:
                    store.on_commit(self.changes)
                journal = store.journal
                if journal is not None:
                    at_ms = time.time_ns() // 1_000_000
                    for old, new in self.changes:
                        for kind, holder, token in events_of(old, new):
                            journal.add(old.scope, kind, holder, token, at_ms)
        finally:
            store._lock.release()

    def load(self, scope: str) -> ScopeRecord:
        records = self._store._records
        return records[scope] if scope in records else ScopeRecord(scope)

    def scope_of_lease(self, lease_id: str) -> str | None:
        scopes = self._store._scope_of_lease
        return scopes[lease_id] if lease_id in scopes else None

    def leases_at_least(self, n: int) -> bool:
        return len(self._store._scope_of_lease) >= n

    def lapsed_scopes(self, now_ns: int) -> list[str]:
        records = self._store._records
        return [scope for scope in self._store._scope_of_lease.values()
                if (lease := records[scope].lease) is not None and now_ns >= lease.expires_ns]

    def names(self, *, after: str, limit: int) -> list[str]:
        names = self._store._names
        start = bisect.bisect_right(names, after) if after else 0
        return names[start:start + limit]

    def save(self, old: ScopeRecord, new: ScopeRecord) -> None:
        if not self._writing:
            invariant(False, "save in a read unit")
        if new is old:
            return
        # A grant moves ``last_token`` and a release or an expiry drops the lease: a change for sure, not
        # compared field by field (a dataclass's ``==``, and its lease's, on every grant and release).
        if new.last_token == old.last_token and (new.lease is None) == (old.lease is None) and new == old:
            return
        store = self._store
        scope = new.scope
        current = store._records[scope] if scope in store._records else None
        if current is not old:
            invariant((current or ScopeRecord(scope)) == old, f"record of {scope!r} changed underneath this unit")
        if new.last_token < old.last_token:  # the message is built only then (every change runs this)
            invariant(False, f"last_token went back in {scope!r}")
        if current is None and len(store._records) >= store.scopes_max:
            raise LimitExceeded("scopes_max", store.scopes_max, "scopes kept in memory")
        store._put(scope, current, new)
        self.changes.append((old, new))

    def token_floor(self) -> int:
        store = self._store
        return max(store.epoch_floor, store.forgotten_floor)

    def new_epoch(self, after: int) -> int | None:
        wall_ns = self._store.wall_ns
        if wall_ns is None:
            return None
        return wait_for_epoch(after, wall_ns)

    def forgotten_floor(self) -> int:
        return self._store.forgotten_floor

    def forget(self, record: ScopeRecord) -> None:
        invariant(self._writing, "forget in a read unit")
        store = self._store
        scope = record.scope
        current = store._records.get(scope)
        if current is None:
            return
        invariant(current == record, f"record of {scope!r} changed underneath this unit")
        invariant(record.lease is None and not record.waiters, f"forgetting {scope!r}, which is not idle")
        self.changes.append((current, None))
        self._floors.append(store.forgotten_floor)
        store.forgotten_floor = max(store.forgotten_floor, current.last_token)
        store._put(scope, current, None)

    def oldest(self, limit: int) -> list[str]:
        return list(itertools.islice(self._store._recency, limit))

    def full(self) -> bool:
        return len(self._store._records) >= self._store.scopes_max

    def undo(self) -> None:
        store = self._store
        for old, new in reversed(self.changes):
            if new is None:  # a forgotten scope comes back, and the floor with it
                store._put(old.scope, None, old)
                store.forgotten_floor = self._floors.pop()
                continue
            before = None if old == ScopeRecord(old.scope) else old
            store._put(new.scope, new, before)
        self.changes.clear()


class MemoryCoordinator(LeaseEngine):
    """The lease engine over `MemoryRecords`: a coordinator that lives as long as its process.

    Args:
        cluster_id: the id its tokens carry (default: a new random one).
        clock: monotonic clock; defaults to the host's.
        policy: lock-delay and queue settings.
    """

    records: MemoryRecords

    def __init__(
        self, *, cluster_id: str | None = None, clock: Clock | None = None, policy: LeasePolicy | None = None
    ) -> None:
        super().__init__(
            MemoryRecords(), cluster_id=cluster_id or new_cluster_id(),
            clock=clock or SystemClock(), policy=policy,
        )


_NAMED: dict[str, MemoryCoordinator] = {}
_NAMED_LOCK = threading.Lock()
NAMED_MAX = 1_000


def find_named(name: str) -> MemoryCoordinator | None:
    """The process's coordinator called ``name`` if one was opened (never creates one)."""
    with _NAMED_LOCK:
        return _NAMED.get(name)


def named(name: str, *, policy: LeasePolicy | None = None) -> MemoryCoordinator:
    """The process's coordinator called ``name`` (created on first use).

    Raises:
        InvalidArgument: it exists already with another policy.
        LimitExceeded: ``NAMED_MAX`` coordinators exist already.
    """
    with _NAMED_LOCK:
        coordinator = _NAMED.get(name)
        if coordinator is not None and policy is not None and policy != coordinator.policy:
            raise InvalidArgument("lock_delay_ms", f"memory://{name} is open already with {coordinator.policy}")
        if coordinator is None:
            if len(_NAMED) >= NAMED_MAX:
                raise LimitExceeded("NAMED_MAX", NAMED_MAX, "in-memory coordinators in this process")
            coordinator = _NAMED[name] = MemoryCoordinator(policy=policy)
        return coordinator


def open_engine(location: str, policy: LeasePolicy) -> MemoryCoordinator:
    """The ``memory://`` entry of `stockade.coordinators.registry`: the process's coordinator called ``location``.

    Its keys live and die with it (`stockade.keys.ephemeral_keyring`).

    Raises:
        InvalidArgument: no name, or not 1..200 printable ASCII characters; or as `named`.
    """
    if not location or not location.isascii() or not location.isprintable() or len(location) > 200:
        raise InvalidArgument("url", "memory url needs a name: memory://NAME (1..200 printable ASCII)")
    from stockade.keys import FixedKeys, ephemeral_keyring

    coordinator = named(location, policy=policy)
    with _NAMED_LOCK:  # threads opening one name at once: one keyring, not one each (a store saw "forged")
        if coordinator.signer is None:  # in-process keys: they live and die with the coordinator
            coordinator.signer = FixedKeys(ephemeral_keyring(coordinator.cluster_id))
    return coordinator
