"""A fenced key-value store in this process's memory: the second adapter, proving the seam.

Same contract as `stockade.resources.store.sqlite_store.SQLiteStore`, minus
durability: the check order is `stockade.core.fence.check_write`, rejections
go through `stockade.resources._observe.reject` (R5), the bounds are those of
`stockade.core.limits`, and both stores pass the same conformance suite
(``stockade.testing.conformance``). Useful in tests and in the simulator's
place; never where the marks must survive a restart (R4 needs a disk).

One lock per store serialises every operation. A write holds it from the
fence check to its last change; a transaction holds it from admission to the
end of its block, so a higher token's write waits for the whole transaction
(R6) for up to ``busy_timeout_ms``. A transaction's steps are staged and
applied when its block ends normally, so an exception leaves nothing behind.

Stores are private to their object, or shared by name (``memory://name``
through `stockade.resources.registry`): every `MemoryStore` opened with one
name is a handle on the same data, as two `SQLiteStore` objects on one file are.
"""

from __future__ import annotations

import builtins
import threading
from bisect import bisect_right, insort
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from stockade.core.errors import BackendUnavailable, InvalidArgument, LimitExceeded, invariant
from stockade.core.fence import FenceRule, Recorded, Replay, decide
from stockade.core.limits import (
    AUDIT_RECORDS_MAX,
    IDEMPOTENCY_KEYS_MAX,
    LIST_PAGE_MAX,
    VALUE_BYTES_MAX,
    validate_key,
    validate_scope,
)
from stockade.core.limits import (
    STORE_SCOPES_MAX as SCOPES_MAX,
)
from stockade.core.tokens import FencingToken, validate_cluster_id
from stockade.core.values import AuditRecord, FenceFloors, Item, Write, WriteResult
from stockade.resources._admit import admit, admit_mark
from stockade.resources._inputs import (
    BUSY_TIMEOUT_MS_DEFAULT,
    BUSY_TIMEOUT_MS_MAX,
    check_audit_page,
    check_bounds,
    check_floors_and_default,
    check_page,
    coerce_token,
    make_write,
)
from stockade.resources._tx import Tx
from stockade.resources._verify import Verification, refuse_unsigned_after_signed

if TYPE_CHECKING:  # type-only: the registry names this module, not the other way
    from stockade.resources.registry import StoreOptions

__all__ = ["MemoryStore", "NAMED_STORES_MAX", "BUSY_TIMEOUT_MS_DEFAULT", "BUSY_TIMEOUT_MS_MAX", "open_store"]

NAMED_STORES_MAX = 1_000  # named stores (memory://name) per process


class _State:
    """The data of one store, shared by its handles; guarded by ``lock``."""

    def __init__(self, cluster_id: str) -> None:
        self.cluster_id = cluster_id
        self.lock = threading.Lock()
        self.owner: int | None = None  # thread id holding lock (detects re-entry from an open transaction)
        self.high_waters: dict[str, int] = {}
        self.default_floor = 0  # the mark of every scope without one of its own (R4: raised by a floor)
        self.items: dict[str, dict[str, Item]] = {}
        self.keys: dict[str, list[str]] = {}  # per scope, sorted: code-point order is UTF-8 byte order
        self.audit: list[AuditRecord] = []  # by commit_seq
        self.idempotency: dict[tuple[str, str], Recorded] = {}  # insertion order is commit order
        self.commit_seq = 0
        self.verified = False  # opened once with keys: it keeps verifying (L2)


_named: dict[str, _State] = {}
_named_lock = threading.Lock()


class MemoryStore(Verification):
    """A fenced key-value store in memory. Thread-safe.

    Args:
        name: share the store of this name in this process (created if missing);
            None for a store of this object alone.
        cluster_id: the coordinator cluster whose tokens this store trusts (R2).
            Required to create a store; checked against a named one.
        value_bytes_max, audit_records_max, idempotency_keys_max, keys, issued: as `SQLiteStore`.
        busy_timeout_ms: how long an operation waits for the store's lock
            before failing with `BackendUnavailable` (``certain_no_effect=True``).

    Raises:
        InvalidArgument: a bad argument; a new store without ``cluster_id``; a
            ``cluster_id`` that differs from the named store's.
        LimitExceeded: `NAMED_STORES_MAX` named stores exist already.
    """

    # The comparison handed to check_write; a control in stockade.testing.mutants may swap it.
    fence_rule: FenceRule = staticmethod(decide)

    def __init__(
        self,
        name: str | None = None,
        *,
        cluster_id: str | None = None,
        value_bytes_max: int = VALUE_BYTES_MAX,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS_DEFAULT,
        audit_records_max: int = AUDIT_RECORDS_MAX,
        idempotency_keys_max: int = IDEMPOTENCY_KEYS_MAX,
        keys: object = None,
        issued: Callable[[str], int] | None = None,
    ) -> None:
        if name is not None:
            validate_scope(name, "name")
        if cluster_id is not None:
            validate_cluster_id(cluster_id, "cluster_id")
        self.value_bytes_max, self.busy_timeout_ms, self.audit_records_max, self.idempotency_keys_max = check_bounds(
            value_bytes_max, busy_timeout_ms, audit_records_max, idempotency_keys_max
        )
        self.name = name
        self._state = self._open_state(name, cluster_id)
        self.cluster_id: str = self._state.cluster_id
        refuse_unsigned_after_signed(f"memory store {name!r}", self._state.verified, keys)
        self.use_keys(keys, self.cluster_id, issued)
        self._state.verified = self._state.verified or self.verifies
        self.resource = f"memory-store:{name if name is not None else hex(id(self._state))}"
        self._closed = False

    @staticmethod
    def _open_state(name: str | None, cluster_id: str | None) -> _State:
        if name is None:
            if cluster_id is None:
                raise InvalidArgument("cluster_id", "required to create a memory store")
            return _State(cluster_id)
        with _named_lock:
            state = _named.get(name)
            if state is None:
                if cluster_id is None:
                    raise InvalidArgument("cluster_id", f"required to create the memory store {name!r}")
                if len(_named) >= NAMED_STORES_MAX:
                    raise LimitExceeded("NAMED_STORES_MAX", NAMED_STORES_MAX)
                state = _named[name] = _State(cluster_id)
            elif cluster_id is not None and cluster_id != state.cluster_id:
                raise InvalidArgument(
                    "cluster_id", f"{cluster_id!r} differs from the store's cluster {state.cluster_id!r}"
                )
            return state

    @staticmethod
    def discard(name: str) -> None:
        """Forget the named store (its handles keep their data; a new open starts empty)."""
        with _named_lock:
            _named.pop(validate_scope(name, "name"), None)

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Close this handle. Idempotent. The data stays with the other handles of a named store."""
        self._closed = True

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _hold(self) -> Iterator[_State]:
        """Hold the store's lock (bounded wait) and hand out its state."""
        state = self._state
        me = threading.get_ident()
        if state.owner == me:
            # Only this thread can have set owner to its own id, so this read is race-free.
            raise InvalidArgument("store", "this thread has a transaction open on this store; use its Tx object")
        if self._closed:
            raise BackendUnavailable("store is closed", certain_no_effect=True)
        if not state.lock.acquire(timeout=self.busy_timeout_ms / 1000):
            raise BackendUnavailable(f"store busy: lock not free within {self.busy_timeout_ms} ms",
                                     certain_no_effect=True)
        state.owner = me
        try:
            yield state
        finally:
            state.owner = None
            state.lock.release()

    # -- the fence-adapter port (stockade.resources.port.FenceAdapterPort) -------------------

    def _admission(self, state: _State, scope: str, old: int | None, new: int) -> None:
        # Whatever the fence decided, a mark that would go down means the rule is broken: stop (R4).
        invariant(new >= (old or 0), f"high-water mark of {scope!r} would go down from {old} to {new}")
        if old is None and len(state.high_waters) >= SCOPES_MAX:
            raise LimitExceeded("SCOPES_MAX", SCOPES_MAX, f"store holds {SCOPES_MAX} scopes")

    def write_once(self, write: Write, token: FencingToken, *, rule: FenceRule | None = None) -> WriteResult:
        """Judge (R2 -> R3 -> R1) and apply one validated write under the lock (see `FenceAdapterPort`)."""
        with self._hold() as state:
            old = state.high_waters.get(write.scope)
            decision = admit(
                token, forged=self.forged(token), scope=write.scope, cluster=self.cluster_id,
                high_water=state.default_floor if old is None else old, resource=self.resource,
                fingerprint=None if write.idempotency_key is None else write.fingerprint(),
                recorded=None if write.idempotency_key is None
                else state.idempotency.get((write.scope, write.idempotency_key)),
                rule=self.fence_rule if rule is None else rule, key=write.key,
            )
            if isinstance(decision, Replay):
                return decision.result
            self._admission(state, write.scope, old, decision.new_high_water)
            unit = _MemoryUnit(self, state, write.scope, decision.new_high_water)
            result = unit.apply(write, token_value=token.value)
            unit.commit()
            return result

    @contextmanager
    def admitted(self, token: FencingToken, scope: str, *, rule: FenceRule | None = None) -> Iterator[_MemoryUnit]:
        """Admit ``token`` for ``scope`` and hold the lock until the block ends (R6; see `FenceAdapterPort`)."""
        with self._hold() as state:
            old = state.high_waters.get(scope)
            new_mark = admit_mark(
                token, forged=self.forged(token), scope=scope, cluster=self.cluster_id,
                high_water=state.default_floor if old is None else old, resource=self.resource,
                rule=self.fence_rule if rule is None else rule,
            )
            self._admission(state, scope, old, new_mark)
            unit = _MemoryUnit(self, state, scope, new_mark)
            yield unit
            unit.commit()  # only when the block ended normally: an exception skips this

    def raise_high_waters(self, floors: Mapping[str, int] | FenceFloors, *, default: int = 0) -> dict[str, int]:
        """Raise each named scope's mark, and every other's to ``default``, all or none (R4)."""
        checked, default = check_floors_and_default(floors, default)
        with self._hold() as state:
            if default > state.default_floor:
                state.default_floor = default
                for scope, mark in state.high_waters.items():
                    state.high_waters[scope] = max(mark, default)
            new_scopes = sum(1 for s, f in checked.items() if f > 0 and s not in state.high_waters)
            if new_scopes and len(state.high_waters) + new_scopes > SCOPES_MAX:
                raise LimitExceeded("SCOPES_MAX", SCOPES_MAX, f"store holds {SCOPES_MAX} scopes")
            marks: dict[str, int] = {}
            for scope, floor in sorted(checked.items()):
                old = state.high_waters.get(scope, state.default_floor)
                if floor > old:
                    state.high_waters[scope] = floor
                marks[scope] = max(old, floor)
            return marks

    # -- public operations (as SQLiteStore's) --------------------------------------------

    def put(
        self, scope: str, key: str, value: bytes | str, *, token: FencingToken | str, idempotency_key: str | None = None
    ) -> WriteResult:
        """Store ``value`` under ``(scope, key)`` if ``token`` passes the fence.

        Args, Returns, Raises: as `SQLiteStore.put`.
        """
        write = make_write(scope, key, "put", value, idempotency_key, value_bytes_max=self.value_bytes_max)
        return self.write_once(write, coerce_token(token))

    def delete(
        self, scope: str, key: str, *, token: FencingToken | str, idempotency_key: str | None = None
    ) -> WriteResult:
        """Remove ``(scope, key)`` if ``token`` passes the fence. As `SQLiteStore.delete`."""
        write = make_write(scope, key, "delete", b"", idempotency_key, value_bytes_max=self.value_bytes_max)
        return self.write_once(write, coerce_token(token))

    @contextmanager
    def transaction(self, scope: str, *, token: FencingToken | str) -> Iterator[Tx]:
        """A multi-step write on one scope, fenced once and atomic as a whole (R6). As `SQLiteStore.transaction`."""
        scope = validate_scope(scope)
        fencing_token = coerce_token(token)
        with self.admitted(fencing_token, scope) as unit:
            tx = Tx(unit, fencing_token, value_bytes_max=self.value_bytes_max)
            try:
                yield tx
            finally:
                tx.close()

    def get(self, scope: str, key: str) -> Item | None:
        """The item at ``(scope, key)``, or None."""
        scope, key = validate_scope(scope), validate_key(key)
        with self._hold() as state:
            return state.items.get(scope, {}).get(key)

    def list(self, scope: str, *, after: str = "", limit: int = LIST_PAGE_MAX) -> builtins.list[Item]:
        """Items of ``scope`` with keys after ``after``, in key order (UTF-8 bytes), at most ``limit``."""
        scope, after, limit = check_page(scope, after, limit)
        with self._hold() as state:
            keys = state.keys.get(scope, [])
            start = bisect_right(keys, after)
            items = state.items.get(scope, {})
            return [items[k] for k in keys[start:start + limit]]

    def high_water(self, scope: str) -> int:
        """The scope's high-water mark; 0 if it was never written."""
        scope = validate_scope(scope)
        with self._hold() as state:
            return state.high_waters.get(scope, state.default_floor)

    def high_waters(self) -> dict[str, int]:
        """Every scope's high-water mark (at most `SCOPES_MAX` entries)."""
        with self._hold() as state:
            return dict(sorted(state.high_waters.items()))

    def audit(
        self, scope: str | None = None, *, after_seq: int = 0, limit: int = LIST_PAGE_MAX
    ) -> builtins.list[AuditRecord]:
        """Retained audit records after ``after_seq``, oldest first. As `SQLiteStore.audit`."""
        scope, after_seq, limit = check_audit_page(scope, after_seq, limit)
        with self._hold() as state:
            start = bisect_right(state.audit, after_seq, key=lambda r: r.commit_seq)
            page: builtins.list[AuditRecord] = []
            for record in state.audit[start:]:
                if len(page) >= limit:
                    break
                if scope is None or record.scope == scope:
                    page.append(record)
            return page

    def commit_seq(self) -> int:
        """The ``commit_seq`` of the last accepted write (0 if none)."""
        with self._hold() as state:
            return state.commit_seq


class _MemoryUnit:
    """The staged steps of one admitted write or transaction (a `FencedUnit`).

    Steps are kept aside and applied together by `commit`, under the lock the
    caller holds, so an abandoned unit changes nothing.
    """

    def __init__(self, store: MemoryStore, state: _State, scope: str, high_water: int) -> None:
        self.scope = scope
        self.high_water = high_water
        self._store = store
        self._state = state
        self._seq = state.commit_seq
        self._items: dict[str, Item | None] = {}
        self._audit: list[AuditRecord] = []
        self._remembered: dict[tuple[str, str], Recorded] = {}

    def apply(self, write: Write, *, token_value: int) -> WriteResult:
        self._seq += 1
        seq = self._seq
        self._items[write.key] = (
            Item(self.scope, write.key, write.value, token_value, seq) if write.op == "put" else None
        )
        self._audit.append(AuditRecord(seq, self.scope, write.key, write.op, token_value, write.idempotency_key))
        if write.idempotency_key is not None:
            self._remembered[(self.scope, write.idempotency_key)] = Recorded(
                write.fingerprint(),
                WriteResult(self.scope, write.key, token_value, self.high_water, seq, replayed=True),
            )
        return WriteResult(self.scope, write.key, token_value, self.high_water, seq, replayed=False)

    def get(self, key: str) -> Item | None:
        if key in self._items:
            return self._items[key]
        return self._state.items.get(self.scope, {}).get(key)

    def commit(self) -> None:
        """Apply the mark and every staged step (the caller holds the lock)."""
        state, store = self._state, self._store
        state.high_waters[self.scope] = max(state.high_waters.get(self.scope, 0), self.high_water)
        items = state.items.setdefault(self.scope, {})
        keys = state.keys.setdefault(self.scope, [])
        for key, item in self._items.items():
            if item is None:
                if items.pop(key, None) is not None:
                    keys.pop(bisect_right(keys, key) - 1)
            else:
                if key not in items:
                    insort(keys, key)
                items[key] = item
        state.audit.extend(self._audit)
        state.commit_seq = self._seq
        pruned_through = state.commit_seq - store.audit_records_max
        if pruned_through > 0 and state.audit and state.audit[0].commit_seq <= pruned_through:
            del state.audit[:bisect_right(state.audit, pruned_through, key=lambda r: r.commit_seq)]
        state.idempotency.update(self._remembered)
        # Keep the newest keys: R3 holds within a window of idempotency_keys_max keys.
        while len(state.idempotency) > store.idempotency_keys_max:
            del state.idempotency[next(iter(state.idempotency))]


def open_store(target: str, cluster_id: str | None, options: StoreOptions) -> MemoryStore:
    """The ``memory`` line of `stockade.resources.registry`: the store of this process called ``target``."""
    return MemoryStore(
        target, cluster_id=cluster_id, value_bytes_max=options.value_bytes_max,
        busy_timeout_ms=options.busy_timeout_ms, audit_records_max=options.audit_records_max,
        idempotency_keys_max=options.idempotency_keys_max, keys=options.keys, issued=options.issued,
    )
