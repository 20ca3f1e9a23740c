"""Fence harnesses over stockade's own store (`MemoryStore`, `SQLiteStore`): the suite's reference targets.

It checks the suite itself: the store already passes its own conformance
suite, so a failure here is the fence suite's bug, not the store's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stockade.keys import FixedKeys
from stockade.resources.memory import MemoryStore
from stockade.resources.store.sqlite_store import SQLiteStore
from stockade.testing.mutants import CheckThenWrite, fencing_off, strict_greater

SCOPES = ("a", "b")


class StoreUnit:
    def __init__(self, tx: Any) -> None:
        self._tx = tx

    def write(self, key: str, value: bytes) -> None:
        self._tx.put(key, value)

    def read(self, key: str) -> bytes | None:
        item = self._tx.get(key)
        return None if item is None else item.value


class StoreHarness:
    value_bytes_max = 4096
    between_check_and_write: Callable[[], None] | None = None

    def __init__(self, store: Any, checked: CheckThenWrite | None = None) -> None:
        self.store = store
        self._checked = checked
        if checked is not None:
            checked.between_check_and_write = lambda scope, token: self._pause()

    def _pause(self) -> None:
        if self.between_check_and_write is not None:
            self.between_check_and_write()

    @contextmanager
    def fenced(self, scope: str, token: Any) -> Iterator[StoreUnit]:
        with self.store.transaction(scope, token=token) as tx:
            yield StoreUnit(tx)

    def read(self, scope: str, key: str) -> bytes | None:
        item = self.store.get(scope, key)
        return None if item is None else item.value

    def high_water(self, scope: str) -> int:
        return self.store.high_water(scope)

    def raise_high_waters(self, floors: Mapping[str, int], *, default: int = 0) -> dict[str, int]:
        adapter = self.store.adapter if isinstance(self.store, CheckThenWrite) else self.store
        return adapter.raise_high_waters(floors, default=default)

    def state(self) -> Any:
        return (self.store.high_waters(),
                {s: [(i.key, i.value) for i in self.store.list(s)] for s in SCOPES})

    def clone(self) -> StoreHarness:
        return self  # one store object is safe to share between threads

    def close(self) -> None:
        pass


def make_memory_harness(cluster_id: str, keys: FixedKeys, mutant: str | None) -> StoreHarness:
    store = MemoryStore(cluster_id=cluster_id, keys=keys, value_bytes_max=StoreHarness.value_bytes_max)
    return _with_control(store, mutant)


def make_sqlite_store_harness(path: Path, cluster_id: str, keys: FixedKeys, mutant: str | None) -> StoreHarness:
    path.mkdir(parents=True, exist_ok=True)
    store = SQLiteStore(path / "store.db", cluster_id=cluster_id, keys=keys,
                        value_bytes_max=StoreHarness.value_bytes_max)
    return _with_control(store, mutant)


def _with_control(store: Any, mutant: str | None) -> StoreHarness:
    if mutant == "fencing-off":
        return StoreHarness(fencing_off(store))
    if mutant == "strict-greater":
        return StoreHarness(strict_greater(store))
    if mutant == "check-then-write":
        checked = CheckThenWrite(store)
        return StoreHarness(checked, checked)
    assert mutant is None, mutant
    return StoreHarness(store)
