"""The fence-adapter conformance suite: what every adapter over a user's own data must do.

An adapter (PostgreSQL, a user's SQLite file, Redis, a directory of files, ...)
keeps the high-water mark (HWM) of each scope *inside the user's resource* and
moves it in the same atomic unit as the user's writes. The suite drives every
adapter through one small harness, so the same tests, with the same numbers,
run on all of them. A new adapter is its module plus one line in
`stockade.resources.registry.FENCE_TARGETS` naming its descriptor
(`stockade.testing.conformance.fence_target.FenceTarget`).

The harness (`FenceHarness`) is the only thing the suite knows. Its
``fenced(scope, token)`` opens the adapter's own atomic unit on ``scope`` the
way a user would (``with fenced(conn, token): ...``, a Redis batch, a file
write); inside it, ``unit.write(key, value)`` writes the user's data natively
(a row, a Redis key, a file) and ``unit.read(key)`` reads it back as the unit
sees it. What is checked, each with the numbers the project reports:

- R1: a token lower than the scope's mark is rejected; equal and higher are
  accepted; a higher one raises the mark. A stale unit applies nothing.
- R2: a token of another scope or cluster is refused, and so is a token the
  coordinator did not sign (the adapter holds only verification material).
- R5: every rejection raises the typed error (`StaleToken` with
  ``high_water``, `TokenMismatch`) and is counted under its reason.
- R6: a unit applies all of its writes or none; a higher token that arrives
  while a lower unit is open never interleaves with it, and its writes are
  never lost (S20, S04).
- S05-style delayed writes: a write held back until a newer holder wrote is
  refused and applies nothing (``DELAYED_WRITES`` of them).
- S19: one token from 8 threads, ``SAME_TOKEN_WRITES`` writes (2,000; 10,000 with
  ``STOCKADE_LONG=1``): no false rejections.
- R4: ``raise_high_waters`` raises marks to a floor and never lowers one.
- Bad input (malformed token, ``.``/``..`` scopes, oversize values) raises
  `InvalidArgument` and changes nothing.

The controls (``fencing-off``, ``strict-greater``, ``check-then-write``; see
`stockade.testing.mutants`) are opened through the same harness factory, and
tests/test_fence_conformance.py shows that the suite's own tests fail on each.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

import pytest

from stockade.core.errors import InvalidArgument, StaleToken, TokenMismatch
from stockade.core.tokens import FencingToken
from stockade.keys import FixedKeys, ephemeral_keyring
from stockade.testing.conformance import rejections_counted

CLUSTER = "c0ffee00c0ffee00"
OTHER_CLUSTER = "0ddba110ddba1100"
KEYS = FixedKeys(ephemeral_keyring(CLUSTER))
OTHER_KEYS = FixedKeys(ephemeral_keyring(OTHER_CLUSTER))
ROGUE_KEYS = FixedKeys(ephemeral_keyring(CLUSTER))  # the right cluster id, a key the adapter never saw

#: How many delayed (S05-style) and racing (S04/S20) units a run tries; the issue asks for >= 200.
DELAYED_WRITES = 200
RACES = 200
#: S19: writes under one token from `THREADS` threads: 2,000 by default (250 a thread, each one contends
#: with seven others), the issue's figure of 10,000 with ``STOCKADE_LONG=1``.
SAME_TOKEN_WRITES = 10_000 if os.environ.get("STOCKADE_LONG") == "1" else 2_000
THREADS = 8

#: The names of the controls a harness factory must accept as ``mutant``.
CONTROLS = ("fencing-off", "strict-greater", "check-then-write")


class FenceUnit(Protocol):
    """The user's writes inside one fenced atomic unit (one scope, one token)."""

    def write(self, key: str, value: bytes) -> None:
        """Write ``key`` natively (a row, a Redis key, a file).

        Raises:
            InvalidArgument: a value over the harness's ``value_bytes_max`` (nothing changes).
        """
        ...

    def read(self, key: str) -> bytes | None:
        """``key`` as this unit sees it (its own writes included), or None."""
        ...


class FenceHarness(Protocol):
    """One adapter over one fresh resource, as the suite drives it.

    Attributes:
        value_bytes_max: the largest value the harness's writes accept.
        between_check_and_write: called by the ``check-then-write`` control
            after its check and before its write (None: no pause); other
            harnesses ignore it.
    """

    value_bytes_max: int
    between_check_and_write: Callable[[], None] | None

    def fenced(self, scope: str, token: FencingToken | str) -> AbstractContextManager[FenceUnit]:
        """Open the adapter's atomic unit on ``scope``, fenced with ``token``.

        The check (MAC, R2, R1) runs when the unit opens or, for adapters that
        apply a batch at the end (Redis, files), when it ends; either way a
        rejected unit applies nothing. Normal exit commits; an exception
        applies nothing and propagates.

        Raises:
            StaleToken, TokenMismatch, InvalidArgument: as the adapter raises them.
        """
        ...

    def read(self, scope: str, key: str) -> bytes | None:
        """``key`` of ``scope`` as committed, or None."""
        ...

    def high_water(self, scope: str) -> int:
        """The scope's mark (0 if never written)."""
        ...

    def raise_high_waters(self, floors: Mapping[str, int], *, default: int = 0) -> dict[str, int]:
        """The adapter's floor operation (R4): raise, never lower; the marks of the named scopes after.

        ``default`` is the floor of every scope *not* named, including scopes
        the resource has never seen (a restored backup may predate them): the
        adapter keeps it durably, and a scope's mark is at least it.

        Raises:
            InvalidArgument: a bad scope or floor (nothing changes).
        """
        ...

    def state(self) -> Any:
        """Everything a unit could change (the user's data and the marks), comparable with ``==``."""
        ...

    def clone(self) -> FenceHarness:
        """Another handle (its own connection) on the same resource, for another thread."""
        ...

    def close(self) -> None: ...


#: ``(cluster_id, keys, mutant) -> harness`` on a fresh, empty resource; ``mutant`` is None or one of `CONTROLS`.
MakeHarness = Callable[[str, FixedKeys, "str | None"], FenceHarness]


def tok(value: int, scope: str = "a", cluster: str = CLUSTER, keys: FixedKeys | None = KEYS) -> FencingToken:
    """A token as the coordinator would issue it (signed with ``keys``; None: unsigned)."""
    token = FencingToken(cluster, scope, value)
    return token if keys is None else keys.sign(token)


def write(harness: FenceHarness, token: FencingToken | str, scope: str = "a", **values: bytes) -> None:
    """One fenced unit on ``scope`` that writes ``values`` (keyword = key)."""
    with harness.fenced(scope, token) as unit:
        for key, value in values.items():
            unit.write(key, value)


@pytest.fixture
def fence(make_harness: MakeHarness) -> FenceHarness:
    return make_harness(CLUSTER, KEYS, None)




# -- R1 ------------------------------------------------------------------------------------------


def test_r1_equal_accepted_higher_raises_lower_rejected(fence: FenceHarness) -> None:
    write(fence, tok(3), k=b"1")
    write(fence, tok(3), k=b"2")  # equal: one lease writes many times
    assert fence.high_water("a") == 3 and fence.read("a", "k") == b"2"
    write(fence, tok(4), k=b"3")
    assert fence.high_water("a") == 4 and fence.high_water("b") == 0
    before = fence.state()
    for stale in (3, 1):
        with pytest.raises(StaleToken) as info:
            write(fence, tok(stale), k=b"old", other=b"old")
        assert info.value.high_water == 4
    assert fence.state() == before


def test_r1_encoded_token_string_is_accepted(fence: FenceHarness) -> None:
    write(fence, tok(7).encode(), k=b"v")
    assert fence.read("a", "k") == b"v" and fence.high_water("a") == 7


def test_s05_delayed_writes_are_refused_and_apply_nothing(fence: FenceHarness) -> None:
    """A's write (token t) is held back until B (t+1) was acknowledged, then delivered: refused."""
    refused = 0
    for t in range(1, 2 * DELAYED_WRITES, 2):
        held = tok(t)  # A's write, delayed in the network
        write(fence, tok(t + 1), k=f"b{t}".encode())
        before = fence.state()
        try:
            write(fence, held, k=b"zombie", z=b"zombie")
        except StaleToken as error:
            assert error.high_water == t + 1
            refused += 1
        assert fence.state() == before, f"the delayed write with token {t} changed the resource"
    assert refused == DELAYED_WRITES


# -- R2 and forged tokens ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, reason",
    [
        (lambda: tok(9, scope="b"), ("wrong-scope",)),
        # Another cluster's token is signed by a key this resource does not hold.
        (lambda: tok(9, cluster=OTHER_CLUSTER, keys=OTHER_KEYS), ("wrong-cluster", "forged (unknown-key)")),
        (lambda: tok(9, keys=None), ("forged (unsigned)",)),
        (lambda: tok(9, keys=ROGUE_KEYS), ("forged (unknown-key)",)),
        (lambda: FencingToken(CLUSTER, "a", 9, KEYS.sign(tok(8)).kid, KEYS.sign(tok(8)).mac), ("forged (bad-mac)",)),
    ],
    ids=["other-scope", "other-cluster", "unsigned", "rogue-key", "bad-mac"],
)
def test_r2_tokens_of_another_scope_or_cluster_or_not_signed_are_refused(
    fence: FenceHarness, bad: Callable[[], FencingToken], reason: tuple[str, ...]
) -> None:
    write(fence, tok(5), k=b"v")
    before = fence.state()
    with pytest.raises(TokenMismatch) as info:
        with fence.fenced("a", bad()) as unit:
            unit.write("k", b"evil")
    assert info.value.reason in reason
    assert fence.state() == before


def test_r5_every_rejection_is_counted(fence: FenceHarness) -> None:
    write(fence, tok(5), k=b"v")
    stale, other, forged = (rejections_counted(r) for r in ("stale", "wrong-scope", "forged"))
    for _ in range(3):
        with pytest.raises(StaleToken):
            write(fence, tok(4), k=b"old")
    with pytest.raises(TokenMismatch):
        write(fence, tok(9, scope="b"), k=b"old")
    with pytest.raises(TokenMismatch):
        write(fence, tok(9, keys=ROGUE_KEYS), k=b"old")
    assert rejections_counted("stale") == stale + 3
    assert rejections_counted("wrong-scope") == other + 1
    assert rejections_counted("forged") == forged + 1


# -- R6 ------------------------------------------------------------------------------------------------


def test_r6_a_unit_applies_all_of_its_writes_or_none(fence: FenceHarness) -> None:
    with fence.fenced("a", tok(2)) as unit:
        unit.write("x", b"1")
        assert unit.read("x") == b"1"  # sees its own write
        unit.write("y", b"2")
    assert (fence.read("a", "x"), fence.read("a", "y")) == (b"1", b"2")
    before = fence.state()
    with pytest.raises(RuntimeError):
        with fence.fenced("a", tok(3)) as unit:
            unit.write("x", b"3")
            unit.write("z", b"3")
            raise RuntimeError("the caller's code failed")
    assert fence.state() == before  # no write and no raised mark survive


def test_s20_a_higher_token_never_interleaves_with_an_open_lower_unit(fence: FenceHarness) -> None:
    """A opens a unit with t and writes; B (t+1) arrives meanwhile; A writes again and ends.

    Allowed outcomes: A committed whole before B (B's value is last), or A
    was refused whole. Counted as an interleaving: A committed although it
    saw B's write inside its unit, a refused A left a write behind, or B's
    write was lost (A's second write landed after B's). A unit that applies
    its writes at the end (Redis, files, stockade's store) may read B's
    committed write before it is refused: that is not an interleaving.
    """
    other = fence.clone()
    interleavings = lost = 0
    try:
        for i in range(RACES):
            low, high = tok(2 * i + 1), tok(2 * i + 2)
            b_started, b_done = threading.Event(), threading.Event()
            errors: list[BaseException] = []

            mark = f"B{i}".encode()

            def b_writes(high: FencingToken = high, b_started: threading.Event = b_started,
                         b_done: threading.Event = b_done, mark: bytes = mark,
                         errors: list[BaseException] = errors) -> None:
                try:
                    b_started.set()
                    write(other, high, k=mark, m=mark)
                except BaseException as error:  # noqa: BLE001 - reported by the main thread
                    errors.append(error)
                finally:
                    b_done.set()

            b = threading.Thread(target=b_writes)
            a_refused = saw_b = False
            try:
                with fence.fenced("a", low) as unit:
                    unit.write("k", b"A1")
                    b.start()
                    b_started.wait()
                    b_done.wait(0.005)  # a chance for B to run now; the verdict is read from the data
                    saw_b = unit.read("k") != b"A1" or unit.read("m") == mark
                    unit.write("k", b"A2")
                    unit.write("n", str(i).encode())
            except StaleToken:
                a_refused = True
            b.join()
            assert not errors, f"B failed: {errors[0]!r}"
            if fence.read("a", "k") != mark or fence.read("a", "m") != mark:
                lost += 1
            if a_refused and fence.read("a", "n") == str(i).encode():
                interleavings += 1  # refused, yet part of it applied
            if saw_b and not a_refused:
                interleavings += 1  # committed although B had written in the middle of it
    finally:
        other.close()
    assert (interleavings, lost) == (0, 0), f"interleavings {interleavings} of {RACES}, higher writes lost {lost}"


def test_s19_one_token_from_eight_threads_is_never_falsely_rejected(fence: FenceHarness) -> None:
    write(fence, tok(1), k=b"start")
    handles = [fence.clone() for _ in range(THREADS)]
    false_rejections: list[int] = []
    token = tok(1)

    def hammer(handle: FenceHarness, n: int, index: int) -> None:
        for i in range(n):
            try:
                with handle.fenced("a", token) as unit:
                    unit.write(f"t{index}", str(i).encode())
            except StaleToken:
                false_rejections.append(i)
                return

    per_thread = SAME_TOKEN_WRITES // THREADS
    threads = [threading.Thread(target=hammer, args=(h, per_thread, n)) for n, h in enumerate(handles)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for handle in handles:
            handle.close()
    assert not false_rejections, f"{len(false_rejections)} threads saw a false rejection"
    assert all(fence.read("a", f"t{n}") == str(per_thread - 1).encode() for n in range(THREADS))


# -- R4: the floor -------------------------------------------------------------------------------------


def test_r4_raise_high_waters_raises_and_never_lowers(fence: FenceHarness) -> None:
    write(fence, tok(5), k=b"v")
    assert fence.raise_high_waters({"a": 9, "b": 3}) == {"a": 9, "b": 3}
    assert fence.raise_high_waters({"a": 2}) == {"a": 9}  # never lowered
    before = fence.state()
    with pytest.raises(StaleToken):
        write(fence, tok(8), k=b"old")  # a token the floor put behind
    assert fence.state() == before
    write(fence, tok(9), k=b"new")
    assert fence.read("a", "k") == b"new"


def test_r4_the_default_floor_covers_scopes_the_resource_never_saw(fence: FenceHarness) -> None:
    write(fence, tok(5), k=b"v")
    fence.raise_high_waters({"a": 6}, default=20)
    assert fence.high_water("b") == 20 and fence.high_water("a") == 20  # the default covers named scopes too
    before = fence.state()
    for scope in ("a", "b"):
        with pytest.raises(StaleToken):
            write(fence, tok(19, scope=scope), scope=scope, k=b"old")
    assert fence.state() == before
    write(fence, tok(20, scope="b"), scope="b", k=b"new")
    assert fence.read("b", "k") == b"new"


def test_r4_bad_floors_change_nothing(fence: FenceHarness) -> None:
    write(fence, tok(5), k=b"v")
    before = fence.state()
    for floors in ({"a": -1}, {"..": 3}, {"a": 2**63}, {"": 1}, {"a": True}):
        with pytest.raises(InvalidArgument):
            fence.raise_high_waters(floors)
    with pytest.raises(InvalidArgument):
        fence.raise_high_waters({}, default=-1)
    assert fence.state() == before


# -- bad input -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "token",
    ["not-a-token", "stk2." + CLUSTER + ".5.00000000.x.a", "", "stk1." + CLUSTER + ".0.a",
     "stk1." + CLUSTER + ".5...", "stk1." + CLUSTER + ".5.."],
    ids=["garbage", "short-mac", "empty", "zero", "dotdot-scope", "dot-scope"],
)
def test_malformed_tokens_are_invalid_argument_and_change_nothing(fence: FenceHarness, token: str) -> None:
    write(fence, tok(1), k=b"v")
    before = fence.state()
    with pytest.raises(InvalidArgument):
        write(fence, token, k=b"evil")
    assert fence.state() == before


@pytest.mark.parametrize("scope", [".", "..", "", "a/b", "a\x00"], ids=["dot", "dotdot", "empty", "slash", "nul"])
def test_bad_scopes_are_invalid_argument_and_change_nothing(fence: FenceHarness, scope: str) -> None:
    write(fence, tok(1), k=b"v")
    before = fence.state()
    with pytest.raises(InvalidArgument):
        with fence.fenced(scope, tok(1)) as unit:
            unit.write("k", b"evil")
    assert fence.state() == before


def test_an_oversize_value_is_invalid_argument_and_the_unit_applies_nothing(fence: FenceHarness) -> None:
    write(fence, tok(1), k=b"v")
    before = fence.state()
    with pytest.raises(InvalidArgument):
        with fence.fenced("a", tok(2)) as unit:
            unit.write("small", b"ok")
            unit.write("k", b"x" * (fence.value_bytes_max + 1))
    assert fence.state() == before


__all__ = [
    "CLUSTER", "OTHER_CLUSTER", "KEYS", "CONTROLS", "FenceHarness", "FenceUnit", "MakeHarness", "tok", "write",
    "fence", "DELAYED_WRITES", "RACES", "SAME_TOKEN_WRITES", "THREADS",
] + [name for name in dir() if name.startswith("test_")]
