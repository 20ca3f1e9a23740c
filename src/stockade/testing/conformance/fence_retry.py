"""The fence suite's retry class: a retry after an unknown outcome, for the adapters with operation ids (R3).

A writer whose commit's outcome it does not know (the connection dropped
during COMMIT, the process was killed and restarted) can only retry. Without
an operation id, a retry of a transaction that did commit applies it a second
time: the fence cannot tell, since the same token is rightly accepted again.
An adapter that offers operation ids records the id in the same transaction as
the user's writes, and a transaction that carries an id already applied
raises `AlreadyApplied` and applies nothing (R3: "a key already applied
returns the original result and applies nothing again, even if its token has
since gone stale").

Operation ids are an optional capability of a fence harness: a harness that
offers them is a `RetryHarness` (its ``fenced_once``). Which adapters offer
them, and in words why the others do not, is declared by the test module that
runs the suite over every adapter (no adapter is skipped silently). Every unit
here writes a counter by reading it and writing it plus one, the write a retry
must not repeat; applications are counted from the data.

The control ``op-ids-off`` (the harness drops the id, as a fence without the
capability does) is opened through the same factory, and fails these tests.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

import pytest

from stockade.core.errors import AlreadyApplied, InvalidArgument, StaleToken, TokenMismatch
from stockade.core.tokens import FencingToken
from stockade.testing.conformance.fence import CLUSTER, KEYS, FenceHarness, FenceUnit, tok
from stockade.testing.conformance.fence import ROGUE_KEYS as ROGUE_KEYS

#: Concurrent pairs (an original still open and its retry) that `test_r3_an_original_and_its_retry_at_once` runs.
RETRY_RACES = 50
#: The control a retry-harness factory must accept as ``mutant``: the id is dropped.
RETRY_CONTROL = "op-ids-off"


class RetryHarness(FenceHarness, Protocol):
    """A `FenceHarness` whose adapter offers operation ids (the capability: ``fenced_once``)."""

    def fenced_once(self, scope: str, token: FencingToken | str, op_id: str) -> AbstractContextManager[FenceUnit]:
        """`FenceHarness.fenced` with an operation id.

        Raises:
            AlreadyApplied: ``op_id`` was applied before; nothing of this unit is applied and
                its block does not run.
            StaleToken, TokenMismatch, InvalidArgument: as `FenceHarness.fenced`.
        """
        ...

    def clone(self) -> RetryHarness: ...


#: ``(cluster_id, keys, mutant) -> harness`` on a fresh resource; ``mutant`` is None or `RETRY_CONTROL`.
MakeRetryHarness = Callable[[str, object, "str | None"], RetryHarness]


@pytest.fixture
def retry_fence(make_retry_harness: MakeRetryHarness) -> RetryHarness:
    return make_retry_harness(CLUSTER, KEYS, None)


def increment(harness: RetryHarness, token: FencingToken | str, op_id: str, scope: str = "a") -> None:
    """One operation: read the counter, write it plus one (not idempotent), under ``op_id``."""
    with harness.fenced_once(scope, token, op_id) as unit:
        unit.write("count", str(int(unit.read("count") or b"0") + 1).encode())


def count(harness: RetryHarness, scope: str = "a") -> int:
    return int(harness.read(scope, "count") or b"0")


def test_r3_a_retry_of_a_committed_operation_applies_nothing(retry_fence: RetryHarness) -> None:
    increment(retry_fence, tok(3), "op-1")
    before = retry_fence.state()
    for token in (tok(3), tok(3).encode(), tok(4)):  # the same token, its string, a newer holder's
        with pytest.raises(AlreadyApplied) as info:
            increment(retry_fence, token, "op-1")
        assert (info.value.scope, info.value.op_id, info.value.token_value) == ("a", "op-1", 3)
        assert retry_fence.state() == before
    increment(retry_fence, tok(3), "op-2")
    assert count(retry_fence) == 2


def test_r3_a_retry_answers_even_after_its_token_went_stale(retry_fence: RetryHarness) -> None:
    increment(retry_fence, tok(3), "op-1")
    increment(retry_fence, tok(4), "op-2")  # a newer holder
    before = retry_fence.state()
    with pytest.raises(AlreadyApplied) as info:
        increment(retry_fence, tok(3), "op-1")
    assert info.value.token_value == 3 and retry_fence.state() == before
    with pytest.raises(StaleToken):  # a stale token with a new id is refused as ever (R1)
        increment(retry_fence, tok(3), "op-3")
    assert retry_fence.state() == before


def test_r3_only_a_real_token_of_the_scope_learns_that_an_id_was_applied(retry_fence: RetryHarness) -> None:
    increment(retry_fence, tok(3), "op-1")
    before = retry_fence.state()
    for bad in (tok(3, keys=ROGUE_KEYS), tok(3, keys=None), tok(3, scope="b")):
        with pytest.raises(TokenMismatch):
            increment(retry_fence, bad, "op-1")
    assert retry_fence.state() == before


def test_r3_a_rolled_back_operation_is_not_recorded_and_ids_are_per_scope(retry_fence: RetryHarness) -> None:
    with pytest.raises(RuntimeError):
        with retry_fence.fenced_once("a", tok(3), "op-1") as unit:
            unit.write("count", b"41")
            raise RuntimeError("the caller's code failed")
    increment(retry_fence, tok(3), "op-1")  # nothing of the failed attempt was kept: this one applies
    increment(retry_fence, tok(3, scope="b"), "op-1", scope="b")
    assert (count(retry_fence), count(retry_fence, "b")) == (1, 1)


@pytest.mark.parametrize("op_id", ["", "a b", "x" * 201, "é", 5], ids=["empty", "space", "long", "non-ascii", "int"])
def test_r3_a_bad_operation_id_is_invalid_argument_and_changes_nothing(retry_fence: RetryHarness,
                                                                        op_id: object) -> None:
    increment(retry_fence, tok(3), "op-1")
    before = retry_fence.state()
    with pytest.raises(InvalidArgument):
        increment(retry_fence, tok(3), op_id)  # type: ignore[arg-type]
    assert retry_fence.state() == before


def test_r3_an_original_and_its_retry_at_once_apply_once(retry_fence: RetryHarness) -> None:
    """The original is still open (a zombie, or a commit in flight) when its retry arrives: one applies.

    The retry starts once the original's unit is open, and is refused (`AlreadyApplied`) when the
    original commits; an adapter that checks the id at the end of the unit may also refuse the
    original instead. Counted from the data: each operation applied exactly once.
    """
    other = retry_fence.clone()
    already = 0
    try:
        for i in range(RETRY_RACES):
            opened, retried = threading.Event(), threading.Event()
            outcomes: list[str] = []

            def retry(i: int = i, opened: threading.Event = opened, retried: threading.Event = retried,
                      outcomes: list[str] = outcomes) -> None:
                opened.wait(30)
                try:
                    increment(other, tok(3), f"race-{i}")
                    outcomes.append("applied")
                except AlreadyApplied:
                    outcomes.append("already")
                finally:
                    retried.set()

            thread = threading.Thread(target=retry)
            thread.start()
            try:
                with retry_fence.fenced_once("a", tok(3), f"race-{i}") as unit:
                    value = int(unit.read("count") or b"0")
                    opened.set()
                    retried.wait(0.005)  # a chance for the retry to run now; the verdict is read from the data
                    unit.write("count", str(value + 1).encode())
            except AlreadyApplied:
                outcomes.append("already")
            opened.set()
            thread.join()
            already += outcomes.count("already")
    finally:
        other.close()
    applied = count(retry_fence)
    assert applied == RETRY_RACES, f"{applied - RETRY_RACES} of {RETRY_RACES} operations applied twice"
    assert already == RETRY_RACES


__all__ = [
    "RetryHarness", "MakeRetryHarness", "RETRY_RACES", "RETRY_CONTROL", "retry_fence", "increment", "count",
] + [name for name in dir() if name.startswith("test_")]
