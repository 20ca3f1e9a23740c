"""The fenced-store conformance suite, over every scheme of `stockade.resources.registry.SCHEMES`.

A new adapter adds one entry to `TARGETS`; `test_every_registered_scheme_is_a_target`
refuses a scheme that is registered but not tested.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stockade.resources.memory import MemoryStore
from stockade.resources.port import TransactionalStorePort
from stockade.resources.registry import SCHEMES
from stockade.resources.store.sqlite_store import SQLiteStore
from stockade.testing.conformance.store import *  # noqa: F403 - the suite's tests and its `store` fixture


def _fresh(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


TARGETS: dict[str, Callable[[Path, str], TransactionalStorePort]] = {
    "sqlite": lambda tmp_path, cluster_id: SQLiteStore(_fresh(tmp_path) / "store.db", cluster_id=cluster_id,
                                                       keys="unsigned"),
    "memory": lambda tmp_path, cluster_id: MemoryStore(cluster_id=cluster_id, keys="unsigned"),
}


@pytest.fixture(params=sorted(TARGETS))
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[str], TransactionalStorePort]]:
    opened: list[TransactionalStorePort] = []

    def make(cluster_id: str) -> TransactionalStorePort:
        opened.append(TARGETS[request.param](tmp_path, cluster_id))
        return opened[-1]

    yield make
    for store in opened:
        store.close()


def test_every_registered_scheme_is_a_target() -> None:
    assert set(SCHEMES) == set(TARGETS)


@pytest.mark.parametrize("mutant", ["fencing-off", "strict-greater"])
@pytest.mark.parametrize("scheme", sorted(TARGETS))
def test_the_suite_fails_a_broken_adapter(tmp_path: Path, scheme: str, mutant: str) -> None:
    """The control: with the fence broken, the suite's own tests fail."""
    import stockade.testing.conformance.store as suite
    from stockade.testing.mutants import MUTANTS

    failed = []
    for name in [n for n in dir(suite) if n.startswith("test_r1") or n.startswith("test_r6")]:
        broken = MUTANTS[mutant].wrap(TARGETS[scheme](tmp_path / name, suite.CLUSTER))
        try:
            getattr(suite, name)(broken)
        except (AssertionError, pytest.fail.Exception, Exception):  # noqa: BLE001 - any failure counts
            failed.append(name)
        finally:
            broken.close()
    assert failed, f"{mutant} on {scheme} passed every R1/R6 test"
