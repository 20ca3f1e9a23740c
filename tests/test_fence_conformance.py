"""The fence-adapter conformance suite (`stockade.testing.conformance.fence`) over every adapter.

The targets are what the resource registry names (`stockade.resources.registry.FENCE_TARGETS`): one
`FenceTarget` per adapter (`stockade.testing.conformance.fence_target`), its harness opener
``(directory, cluster_id, keys, mutant) -> harness`` on a fresh resource and each optional capability,
or in words why it lacks it. A new adapter is its folder and its registry line; nothing here names it.
`test_the_suite_catches_every_control` runs the suite's own tests against each control on each adapter
and requires a failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stockade.testing.conformance.fence as suite
import stockade.testing.conformance.fence_keys as l2_suite
from stockade.keys import FixedKeys
from stockade.resources.registry import FENCE_TARGETS, FLOOR_TARGETS
from stockade.testing.conformance.fence import *  # noqa: F403 - the suite's tests and its `fence` fixture
from stockade.testing.conformance.fence_isolation import (  # noqa: F401 - the optional capabilities' tests
    check_floor_raised_mid_transaction,
    check_outsider_cannot_stall,
    test_a_floor_raised_mid_transaction_is_never_committed_below,
    test_a_role_that_may_only_connect_cannot_stall_fenced_writes,
)
from stockade.testing.conformance.fence_keys import *  # noqa: F403 - the L2 suite (a missing or ambiguous keyring)
from stockade.testing.conformance.fence_partial import *  # noqa: F403 - partial failure inside a unit
from stockade.testing.conformance.fence_partial import PartialFailures
from stockade.testing.conformance.fence_target import FenceTarget, fence_targets, uncovered_floor_schemes

Factory = Callable[[Path, str, FixedKeys, "str | None"], Any]

#: Every registered fence target, by name (the registry's lines, each descriptor imported now).
DESCRIPTORS: dict[str, FenceTarget] = fence_targets()
TARGETS: dict[str, Factory] = {name: target.open for name, target in DESCRIPTORS.items()}


def test_every_floor_target_has_a_fence_target() -> None:
    """Each scheme `stockade floor` raises (FLOOR_TARGETS) is the adapter of at least one fence target. The
    control: the same check over the targets without the Redis ones names the schemes Redis's opener serves."""
    assert uncovered_floor_schemes(FLOOR_TARGETS, DESCRIPTORS.values()) == set()
    redis_floors = DESCRIPTORS["redis"].floors
    without_redis = [t for t in DESCRIPTORS.values() if t.floors != redis_floors]
    expected = {scheme for scheme, opener in FLOOR_TARGETS.items() if opener == redis_floors}
    assert expected and uncovered_floor_schemes(FLOOR_TARGETS, without_redis) == expected
    with pytest.raises(ValueError, match="not the FenceTarget"):
        fence_targets({"files": FENCE_TARGETS["redis"]})


# Second front ends over an adapter core that another target already runs at full size (the
# async and SQLAlchemy paths share the check, the lock and the mark with their plain twin), and
# the reference store, and the plain PostgreSQL adapter again on a SQL_ASCII database (what it adds is
# how text comes back, not concurrency): S05, S19 and S20 run them at a fifth of their size by default,
# in full with STOCKADE_LONG=1.
SHARED_CORE = {name for name, target in DESCRIPTORS.items() if target.shared_core}


@pytest.fixture(params=sorted(TARGETS))
def make_harness(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Any]]:
    if request.param in SHARED_CORE and os.environ.get("STOCKADE_LONG") != "1":
        for name in ("SAME_TOKEN_WRITES", "RACES", "DELAYED_WRITES"):
            monkeypatch.setattr(suite, name, getattr(suite, name) // 5)
    yield from _opener(request.param, tmp_path)


def _one_harness(target: str, tmp_path: Path) -> Iterator[Any]:
    """One plain harness of ``target`` (the suite's cluster and keys), closed at the end."""
    harness = TARGETS[target](tmp_path / "r", suite.CLUSTER, suite.KEYS, None)
    yield harness
    harness.close()


def _opener(target: str, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """A factory of ``target``'s harnesses, each in a directory of its own, all closed at the end."""
    opened: list[Any] = []

    def make(cluster_id: str, keys: FixedKeys, mutant: str | None) -> Any:
        opened.append(TARGETS[target](tmp_path / f"r{len(opened)}", cluster_id, keys, mutant))
        return opened[-1]

    yield make
    for harness in opened:
        harness.close()


@pytest.fixture
def partial_failures(request: pytest.FixtureRequest, make_harness: Callable[..., Any]) -> PartialFailures:
    """The target's declaration for the partial-failure tests (its descriptor's ``partial_failures``)."""
    return DESCRIPTORS[request.node.callspec.params["make_harness"]].partial_failures


def test_every_target_declares_its_partial_failures() -> None:
    assert all(isinstance(target.partial_failures, PartialFailures) for target in DESCRIPTORS.values())


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



# -- the optional capabilities (stockade.testing.conformance.fence_isolation) --------------------------
# Every target either offers each one or says here why it does not apply; nothing is skipped in silence.

ISOLATION = {name for name, target in DESCRIPTORS.items() if target.isolation is True}
OUTSIDERS = {name for name, target in DESCRIPTORS.items() if target.outsiders is True}


def test_every_target_declares_the_optional_capabilities() -> None:
    for target in DESCRIPTORS.values():
        for offered in (target.isolation, target.outsiders):
            assert offered is True or (isinstance(offered, str) and offered.strip()), target.name


@pytest.fixture(params=sorted(ISOLATION))
def isolated(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    yield from _one_harness(request.param, tmp_path)


@pytest.fixture(params=sorted(OUTSIDERS))
def outsider(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    yield from _one_harness(request.param, tmp_path)


def test_the_optional_capabilities_catch_their_control(tmp_path: Path) -> None:
    """``advisory-locks``, schema 1's PostgreSQL function: it admits below a floor raised
    mid-transaction, and an outsider's advisory locks freeze the honest writes."""
    harness = TARGETS["postgres"](tmp_path / "c", suite.CLUSTER, suite.KEYS, "advisory-locks")
    try:
        admitted = check_floor_raised_mid_transaction(harness, rounds=3)
        assert admitted == {"repeatable read": 3, "serializable": 3}
        completed, tried, floor_raised, _ = check_outsider_cannot_stall(harness, write_s=2.0)
        assert (completed, tried, floor_raised) == (0, 6, True)
    finally:
        harness.close()
# -- the retry class (`stockade.testing.conformance.fence_retry`): operation ids, R3 ---------------------

import stockade.testing.conformance.fence_retry as retry_suite  # noqa: E402 - this section's own suite
from stockade.testing.conformance.fence_retry import *  # noqa: E402, F403 - its tests and `retry_fence`

#: Every adapter, with or without operation ids: True, or why not in words. No adapter is left out.
OPERATION_IDS: dict[str, bool | str] = {name: target.operation_ids for name, target in DESCRIPTORS.items()}
RETRY_TARGETS = sorted(name for name, offered in OPERATION_IDS.items() if offered is True)


def test_every_adapter_declares_whether_it_offers_operation_ids() -> None:
    assert set(OPERATION_IDS) == set(TARGETS)
    assert all(offered is True or (isinstance(offered, str) and offered) for offered in OPERATION_IDS.values())


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_declared_capability_is_the_harness_s(tmp_path: Path, target: str) -> None:
    harness = TARGETS[target](tmp_path, suite.CLUSTER, suite.KEYS, None)
    try:
        assert callable(getattr(type(harness), "fenced_once", None)) == (OPERATION_IDS[target] is True)
    finally:
        harness.close()


@pytest.fixture(params=RETRY_TARGETS)
def make_retry_harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    yield from _opener(request.param, tmp_path)


@pytest.mark.parametrize("target", RETRY_TARGETS)
def test_the_retry_suite_catches_its_control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str) -> None:
    """With the id dropped (a fence without operation ids), each retry test fails: it applies again."""
    monkeypatch.setattr(retry_suite, "RETRY_RACES", 5)
    for name in ("test_r3_a_retry_of_a_committed_operation_applies_nothing",
                 "test_r3_a_retry_answers_even_after_its_token_went_stale",
                 "test_r3_an_original_and_its_retry_at_once_apply_once"):
        harness = TARGETS[target](tmp_path / name, suite.CLUSTER, suite.KEYS, retry_suite.RETRY_CONTROL)
        try:
            getattr(retry_suite, name)(harness)
        except (Exception, pytest.fail.Exception):  # noqa: BLE001 - any failure of the test counts
            continue
        finally:
            harness.close()
        pytest.fail(f"{name} passed on {target} with {retry_suite.RETRY_CONTROL}")
# -- L2: a missing or ambiguous keyring (stockade.testing.conformance.fence_keys) ---------------------

KEYED = {name: target.keyed for name, target in DESCRIPTORS.items()}


@pytest.fixture(params=sorted(KEYED))
def open_keyed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    with KEYED[request.param](tmp_path / "keyed", f"{tmp_path.name}-{request.param}") as opener:
        yield opener


# Before L2 every adapter but PostgreSQL (whose install always refused keys=None) had the hole.
HAD_THE_HOLE = sorted(name for name, target in DESCRIPTORS.items() if not target.refused_none_before_l2)


@pytest.mark.parametrize("target", sorted(KEYED))
def test_the_l2_suite_catches_the_legacy_control(tmp_path: Path, target: str) -> None:
    """Under `legacy_keys` (keys=None meant unsigned; discovery gave up into unsigned; nothing remembered
    verifying) the L2 tests fail on every adapter that had the hole, and pass on PostgreSQL, which refused
    None before too; the memory test fails on every adapter."""
    failed = []
    with l2_suite.legacy_keys():
        for name in l2_suite.L2_TESTS + l2_suite.L2_MEMORY_TESTS:
            with KEYED[target](tmp_path / name, f"{tmp_path.name}-{target}-{name}") as opener:
                try:
                    getattr(l2_suite, name)(opener)
                except (Exception, pytest.fail.Exception):  # noqa: BLE001 - any failure of the test counts
                    failed.append(name)
    assert failed == (l2_suite.L2_TESTS if target in HAD_THE_HOLE else []) + l2_suite.L2_MEMORY_TESTS, failed
# -- a writer paused inside its unit (stockade.testing.conformance.fence_paused): L1 at the resource ----------

from stockade.testing.conformance.fence_paused import (  # noqa: E402
    STALL_MS,
    NotBounded,
    Paused,
    PausedBound,
    check_declared_stall,
    check_paused_writer,
    test_a_writer_paused_inside_its_unit_never_stalls_a_newer_token,  # noqa: F401 - run here, over every target
    test_a_writer_paused_inside_its_unit_stalls_only_as_declared,  # noqa: F401 - run here, over every target
)
from stockade.testing.fences.postgres import NO_SUPERSEDE  # noqa: E402 - the control's name (the postgres harness's)

PAUSED = {name: target.paused for name, target in DESCRIPTORS.items()}


def test_every_target_declares_its_paused_writer_bound() -> None:
    assert all(isinstance(bound, PausedBound | NotBounded) for bound in PAUSED.values())


@pytest.fixture
def paused_bound(request: pytest.FixtureRequest, make_harness: Callable[..., Any]) -> Paused:
    """The target's bound on a paused writer, or why it has none (its descriptor's ``paused``)."""
    return PAUSED[request.node.callspec.params["make_harness"]]


#: Each control round waits the bound plus the slack (7 s): one by default, five with STOCKADE_LONG=1.
CONTROL_ROUNDS = 5 if os.environ.get("STOCKADE_LONG") == "1" else 1


def test_the_paused_writer_class_catches_its_control(tmp_path: Path) -> None:
    """PostgreSQL installed without supersession (the behaviour before it): the newer unit is still waiting
    at the bound plus the slack while the lower writer is paused, and the resumed writer commits."""
    declared = PAUSED["postgres"]
    assert isinstance(declared, PausedBound)
    harness = TARGETS["postgres"](tmp_path / "c", suite.CLUSTER, suite.KEYS, NO_SUPERSEDE)
    try:
        outcome = check_paused_writer(harness, declared, rounds=CONTROL_ROUNDS)
    finally:
        harness.close()
    print(f"control (no supersession): {outcome}")
    assert (outcome.rounds, outcome.newer_in_bound, outcome.refused) == (CONTROL_ROUNDS, 0, 0), outcome
    assert outcome.answers == {"committed": CONTROL_ROUNDS}, outcome.answers


def test_a_declared_stall_is_checked_against_its_control(tmp_path: Path) -> None:
    """The store on SQLite holds nothing while a writer is paused inside its unit (its steps are applied in one
    commit at the end): declared not bounded, as if it held its file's lock, the stall check must fail. The
    newer unit completes at once (held up 0 of 2 in every run so far; not asserted, a loaded host may delay it past
    the 1 s), and the resumed writer is refused (StaleToken), not committed: that fails the check every time."""
    declared = PAUSED["store-sqlite"]
    assert isinstance(declared, PausedBound) and declared.bound_ms == 0
    pretend = NotBounded("pretends to hold the file's write lock", open_writer=declared.open_writer)
    harness = TARGETS["store-sqlite"](tmp_path / "c", suite.CLUSTER, suite.KEYS, None)
    try:
        outcome = check_declared_stall(harness, pretend, rounds=2)
    finally:
        harness.close()
    print(f"control (a target that holds nothing, declared not bounded): {outcome}")
    assert not outcome.as_declared()
    assert (outcome.rounds, outcome.committed, outcome.newer_after) == (2, 0, 2), (STALL_MS, outcome)
    assert outcome.answers == {"fencing-error StaleToken": 2}, outcome.answers
