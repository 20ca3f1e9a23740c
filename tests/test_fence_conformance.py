"""The fence-adapter conformance suite (`stockade.testing.conformance.fence`) over every adapter.

A new adapter adds one entry to `TARGETS`: a factory ``(tmp_path, cluster_id,
keys, mutant) -> harness`` on a fresh resource. `test_the_suite_catches_every_control`
runs the suite's own tests against each control on each adapter and requires
a failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.fence_files import make_files_harness
from helpers.fence_keyed import KEYED
from helpers.fence_postgres import make_postgres_harness
from helpers.fence_redis import make_async_redis_harness, make_redis_harness
from helpers.fence_sqlite_db import make_sqlite_db_harness, make_sqlite_db_sqlalchemy_harness
from helpers.fence_store import make_memory_harness, make_sqlite_store_harness

import stockade.testing.conformance.fence as suite
import stockade.testing.conformance.fence_keys as l2_suite
from stockade.keys import FixedKeys
from stockade.testing.conformance.fence import *  # noqa: F403 - the suite's tests and its `fence` fixture
from stockade.testing.conformance.fence_keys import *  # noqa: F403 - the L2 suite (a missing or ambiguous keyring)

Factory = Callable[[Path, str, FixedKeys, "str | None"], Any]

TARGETS: dict[str, Factory] = {
    "store-memory": lambda tmp_path, cluster_id, keys, mutant: make_memory_harness(cluster_id, keys, mutant),
    "store-sqlite": make_sqlite_store_harness,
    "sqlite-db": make_sqlite_db_harness,
    "sqlite-db-sqlalchemy": make_sqlite_db_sqlalchemy_harness,
    "files": make_files_harness,
    **{kind: make_postgres_harness(kind) for kind in ("postgres", "postgres-async", "postgres-sqlalchemy")},
    "redis": make_redis_harness,
    "redis-async": make_async_redis_harness,
}


# Second front ends over an adapter core that another target already runs at full size (the
# async and SQLAlchemy paths share the check, the lock and the mark with their plain twin), and
# the reference store: S05, S19 and S20 run them at a fifth of their size by default, in full with
# STOCKADE_LONG=1.
SHARED_CORE = {"postgres-async", "postgres-sqlalchemy", "sqlite-db-sqlalchemy", "redis-async", "store-sqlite"}


@pytest.fixture(params=sorted(TARGETS))
def make_harness(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Any]]:
    opened: list[Any] = []
    if request.param in SHARED_CORE and os.environ.get("STOCKADE_LONG") != "1":
        for name in ("SAME_TOKEN_WRITES", "RACES", "DELAYED_WRITES"):
            monkeypatch.setattr(suite, name, getattr(suite, name) // 5)

    def make(cluster_id: str, keys: FixedKeys, mutant: str | None) -> Any:
        opened.append(TARGETS[request.param](tmp_path / f"r{len(opened)}", cluster_id, keys, mutant))
        return opened[-1]

    yield make
    for harness in opened:
        harness.close()


# Which of the suite's tests each control must fail. The suite's numbers are cut down here so
# that a control fails fast; the full-size runs above are the figures.
CAUGHT_BY = {
    "fencing-off": [
        "test_r1_equal_accepted_higher_raises_lower_rejected",
        "test_s05_delayed_writes_are_refused_and_apply_nothing",
    ],
    "strict-greater": [
        "test_r1_equal_accepted_higher_raises_lower_rejected",
        "test_s19_one_token_from_eight_threads_is_never_falsely_rejected",
    ],
    "check-then-write": ["test_s20_a_higher_token_never_interleaves_with_an_open_lower_unit"],
}


@pytest.mark.parametrize("mutant", sorted(CAUGHT_BY))
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_suite_catches_every_control(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, mutant: str
) -> None:
    monkeypatch.setattr(suite, "RACES", 40)
    monkeypatch.setattr(suite, "DELAYED_WRITES", 20)
    monkeypatch.setattr(suite, "SAME_TOKEN_WRITES", 400)
    for name in CAUGHT_BY[mutant]:
        harness = TARGETS[target](tmp_path / name, suite.CLUSTER, suite.KEYS, mutant)
        try:
            getattr(suite, name)(harness)
        except (Exception, pytest.fail.Exception):  # noqa: BLE001 - any failure of the test counts
            continue
        finally:
            harness.close()
        pytest.fail(f"{name} passed on {target} with {mutant}")



# -- L2: a missing or ambiguous keyring (stockade.testing.conformance.fence_keys) ---------------------

assert set(KEYED) == set(TARGETS), "every adapter runs the L2 suite too"


@pytest.fixture(params=sorted(KEYED))
def open_keyed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    with KEYED[request.param](tmp_path / "keyed", f"{tmp_path.name}-{request.param}") as opener:
        yield opener


# Before L2 every adapter but PostgreSQL (whose install always refused keys=None) had the hole.
HAD_THE_HOLE = sorted(set(KEYED) - {"postgres", "postgres-async", "postgres-sqlalchemy"})


@pytest.mark.parametrize("target", sorted(KEYED))
def test_the_l2_suite_catches_the_legacy_control(tmp_path: Path, target: str) -> None:
    """Under `legacy_keys` (keys=None meant unsigned; discovery gave up into unsigned) the L2 tests fail on
    every adapter that had the hole, and pass on PostgreSQL, which refused None before too."""
    failed = []
    with l2_suite.legacy_keys():
        for name in l2_suite.L2_TESTS:
            with KEYED[target](tmp_path / name, f"{tmp_path.name}-{target}-{name}") as opener:
                try:
                    getattr(l2_suite, name)(opener)
                except (Exception, pytest.fail.Exception):  # noqa: BLE001 - any failure of the test counts
                    failed.append(name)
    assert failed == (l2_suite.L2_TESTS if target in HAD_THE_HOLE else []), failed
