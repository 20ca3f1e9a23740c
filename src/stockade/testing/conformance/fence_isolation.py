"""Fence conformance, optional capabilities: a floor raised mid-transaction, and a role other than the installer's.

Two attack classes of the fence-adapter suite (`stockade.testing.conformance.fence`)
that apply only to adapters whose resource has them: transactions with a
snapshot taken before the fence's check (isolation levels), and roles. An
adapter's harness offers each as an optional capability, and the test module
that runs the suite declares, for every adapter, either the capability or the
reason it does not apply (tests/test_fence_conformance.py): nothing is skipped
in silence.

**A floor raised mid-transaction** (`IsolationHarness`). A transaction of the
user's opens at one of the resource's isolation levels and reads (its snapshot
is taken); then `raise_high_waters` raises the default floor, from another
connection, and returns; then the open transaction runs the fence with a token
below the new floor, for a scope the floor covers only through its default,
writes and commits. R4 says no check admitted below a floor can commit after
the raise returned, so the outcome must be a refusal: `StaleToken`, or one of
the harness's declared ``isolation_refusals`` (a serialization failure the
caller retries; an adapter that refuses to fence inside a transaction already
open). Counted over `FLOOR_ROUNDS` rounds per level: admitted below the floor
must be 0.

**A role other than the installer's** (`OutsiderHarness`). A session of a role
that may only connect takes every lock it can reach (the keys the fence would
use are derivable; the tables are in a schema it may use) and stays idle;
meanwhile honest fenced units, one raising the mark and one with an equal
token on each of `OUTSIDER_SCOPES` scopes, must all complete, and a floor
raise must complete too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from stockade.core.errors import StaleToken
from stockade.core.tokens import FencingToken
from stockade.testing.conformance.fence import FenceHarness, FenceUnit, tok

#: Rounds per isolation level (``STOCKADE_FLOOR_ROUNDS`` overrides; the issue's figure is >= 60 in all).
FLOOR_ROUNDS = int(os.environ.get("STOCKADE_FLOOR_ROUNDS", "0") or 0) or (
    30 if os.environ.get("STOCKADE_LONG") == "1" else 5)
#: Scopes the honest units write while an outsider holds what it can.
OUTSIDER_SCOPES = 3


class IsolationHarness(FenceHarness, Protocol):
    """A harness whose resource has transactions that read before the fence's check.

    Attributes:
        isolation_levels: the levels the resource offers such a transaction at (e.g.
            ``("repeatable read", "serializable")``).
        isolation_refusals: what a unit refused for a floor raised after its snapshot may raise
            besides `StaleToken` (nothing of it applied).
    """

    isolation_levels: tuple[str, ...]
    isolation_refusals: tuple[type[BaseException], ...]

    def fenced_after_read(self, level: str, scope: str, token: FencingToken | str,
                          between: Callable[[], None]) -> AbstractContextManager[FenceUnit]:
        """Begin a transaction at ``level`` on a connection of its own, read in it (its snapshot is
        taken), call ``between()``, then run the adapter's fence in that transaction as a user would;
        yield the unit, and commit the transaction when the block ends (roll it back on an exception)."""
        ...


class OutsiderHarness(FenceHarness, Protocol):
    """A harness whose resource has roles: another role than the installer's can connect to it."""

    def outsider_holds_what_it_can(self, scopes: list[str]) -> AbstractContextManager[list[str]]:
        """A session of a role that may only connect, holding every lock it can reach that the fence
        could use for ``scopes`` (and the floor), idle, until the block ends; yields what it holds."""
        ...


def check_floor_raised_mid_transaction(harness: IsolationHarness, *, rounds: int = 0) -> dict[str, int]:
    """R4 at every isolation level: the units admitted below a floor raised after their snapshot, by level.

    Each round writes the scope's own mark (half the rounds: none, a scope never seen),
    raises the default floor from a clone in the middle of the unit's transaction, and
    tries a token between the own mark and the floor.
    """
    rounds = rounds or FLOOR_ROUNDS
    refusals: tuple[type[BaseException], ...] = (StaleToken, *harness.isolation_refusals)
    other = harness.clone()
    admitted: dict[str, int] = {}
    floor = 10
    try:
        for level in harness.isolation_levels:
            admitted[level] = 0
            for i in range(rounds):
                scope = f"iso-{level.replace(' ', '-')}-{i}"
                if i % 2 == 0:
                    with harness.fenced(scope, tok(floor + 1, scope=scope)) as unit:
                        unit.write("k", b"before")
                floor += 10
                new_floor = floor

                def raise_floor(new_floor: int = new_floor) -> None:
                    other.raise_high_waters({}, default=new_floor)

                try:
                    with harness.fenced_after_read(level, scope, tok(new_floor - 1, scope=scope),
                                                   raise_floor) as unit:
                        unit.write("k", b"below")
                except refusals:
                    pass
                if harness.read(scope, "k") == b"below":
                    admitted[level] += 1
    finally:
        other.close()
    return admitted


def test_a_floor_raised_mid_transaction_is_never_committed_below(isolated: IsolationHarness) -> None:
    admitted = check_floor_raised_mid_transaction(isolated)
    assert all(n == 0 for n in admitted.values()), f"admitted below the floor, of {FLOOR_ROUNDS} per level: {admitted}"


def check_outsider_cannot_stall(harness: OutsiderHarness, *,
                                write_s: float = 20.0) -> tuple[int, int, bool, list[str]]:
    """Honest units completed while an outsider holds what it can: (completed, tried, whether the
    floor raise completed, what the outsider held).

    Each scope gets a unit that raises its mark, then one with the same token; then a floor
    raise. A unit counts as completed when it commits within ``write_s`` (it waits for no
    honest lock, so only a lock the outsider holds can keep it longer).
    """
    scopes = [f"outsider-{n}" for n in range(OUTSIDER_SCOPES)]
    base = max(harness.high_water(scope) for scope in scopes) + 1  # above any floor an earlier check left
    for scope in scopes:
        with harness.fenced(scope, tok(base, scope=scope)) as unit:
            unit.write("k", b"0")
    completed = tried = 0
    workers: list[Any] = []
    threads: list[threading.Thread] = []

    def start(action: Callable[[Any], None]) -> threading.Event:
        done = threading.Event()
        worker = harness.clone()
        workers.append(worker)

        def run() -> None:
            try:
                action(worker)
                done.set()
            except BaseException:  # noqa: BLE001 - not completed: counted by the caller
                pass

        threads.append(threading.Thread(target=run, daemon=True))
        threads[-1].start()
        return done

    try:
        with harness.outsider_holds_what_it_can(scopes) as held:
            for scope in scopes:
                for value in (base + 1, base + 1):  # one unit raises the mark, the next has the same token
                    def one(worker: Any, scope: str = scope, value: int = value) -> None:
                        with worker.fenced(scope, tok(value, scope=scope)) as unit:
                            unit.write("k", str(value).encode())

                    tried += 1
                    completed += start(one).wait(write_s)
            floor_raised = start(lambda worker: worker.raise_high_waters({}, default=base)).wait(write_s)
        for thread in threads:  # a stalled unit goes on once the outsider has let go
            thread.join(60)
    finally:
        for worker in workers:
            worker.close()
    return completed, tried, floor_raised, held


def test_a_role_that_may_only_connect_cannot_stall_fenced_writes(outsider: OutsiderHarness) -> None:
    completed, tried, floor_raised, held = check_outsider_cannot_stall(outsider)
    assert (completed, floor_raised) == (tried, True), (
        f"completed {completed} of {tried}, floor raised: {floor_raised}, while an outsider held {held}")


__all__ = [
    "FLOOR_ROUNDS", "OUTSIDER_SCOPES", "IsolationHarness", "OutsiderHarness", "check_floor_raised_mid_transaction",
    "check_outsider_cannot_stall", "test_a_floor_raised_mid_transaction_is_never_committed_below",
    "test_a_role_that_may_only_connect_cannot_stall_fenced_writes",
]
