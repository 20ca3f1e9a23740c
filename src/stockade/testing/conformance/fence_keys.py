"""Attack class "a missing or ambiguous keyring" (L2) over every fence adapter and store.

L2: verification never turns itself off. A resource given no keys
(``keys=None``, or nothing: the argument defaults to None), or whose keyring
discovery finds none or several keyrings of its cluster, refuses to open or
to admit (`InvalidArgument`), unless the caller chose unsigned mode in words
(``keys="unsigned"``). Opened with the coordinator's keys, it refuses a
forged token of the largest value, ``stk1.<cluster>.<2**63-1>.<scope>``
without a MAC, and nothing changes.

The suite drives each adapter through one opener (`OpenKeyed`): open *the*
resource of the test (the same one on every call) with ``keys`` exactly as a
user passes them, after putting the given keyring files in the directory its
discovery would read. Adapters without discovery (every one but the sqlite
store opened by url) take nothing from that directory: for them the
"ambiguous discovery" cases are the ``keys=None`` case, which is what a
caller who relied on discovery passes.

A resource that once verified keeps verifying: opened again with
``keys="unsigned"`` it refuses to open or to admit
(`test_l2_once_verified_unsigned_is_refused`).

The control, `legacy_keys`, brings back the behaviour before L2 (None meant
unsigned; discovery gave up on any ambiguity, or lost its keyring past 16
files, and the store opened unsigned; nothing remembered verifying);
tests/test_fence_conformance.py shows `L2_TESTS` fail under it on every
adapter that had the hole (all but PostgreSQL, whose ``install`` always
refused None), and `L2_MEMORY_TESTS` on every adapter.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

import pytest

import stockade.keys
from stockade.core.errors import InvalidArgument, StaleToken, TokenMismatch
from stockade.core.limits import TOKEN_VALUE_MAX
from stockade.core.signing import Keyring
from stockade.core.tokens import FencingToken
from stockade.keys import ephemeral_keyring
from stockade.testing.conformance.fence import KEYS, FenceHarness, tok, write

#: Keyrings of other clusters a directory may hold (the finding's "16 other clusters").
OTHER_CLUSTERS = [ephemeral_keyring(f"{index:016x}") for index in range(1, 17)]


def FORGED_MAX() -> FencingToken:  # noqa: N802 - a constant, built on use (tokens are frozen values)
    """The forgery: the largest value, our cluster, no MAC."""
    return tok(TOKEN_VALUE_MAX, keys=None)


class OpenKeyed(Protocol):
    def __call__(self, keys: object, *, beside: Sequence[tuple[str, Keyring]] = ()) -> FenceHarness:
        """The test's resource opened with ``keys`` (None: none given), after writing each ``(file name,
        keyring)`` of ``beside`` into the directory its discovery reads. Raises what the adapter raises."""
        ...


@contextmanager
def legacy_keys() -> Iterator[None]:
    """The control: the behaviour before L2 (see the module docstring)."""
    stockade.keys.LEGACY_NONE_MEANS_UNSIGNED = True
    try:
        yield
    finally:
        stockade.keys.LEGACY_NONE_MEANS_UNSIGNED = False


def _refused_or_verified(open_keyed: OpenKeyed, keys: object, beside: Sequence[tuple[str, Keyring]]) -> None:
    """Opening with ``keys`` is refused, or the forgery is; either way no mark moved."""
    try:
        harness = open_keyed(keys, beside=beside)
    except InvalidArgument:
        harness = None
    if harness is not None:
        try:
            with pytest.raises((InvalidArgument, TokenMismatch)):
                write(harness, FORGED_MAX(), k=b"forged")
        finally:
            harness.close()
    checker = open_keyed(KEYS)
    try:
        assert checker.high_water("a") == 0, "a forged token moved the mark"
        write(checker, tok(5), k=b"honest")  # the resource still works, with keys
    finally:
        checker.close()


def test_l2_keys_none_is_refused(open_keyed: OpenKeyed) -> None:
    with pytest.raises(InvalidArgument):
        harness = open_keyed(None)
        try:
            write(harness, FORGED_MAX(), k=b"forged")
        finally:
            harness.close()
    _refused_or_verified(open_keyed, None, ())


def test_l2_ambiguous_discovery_is_refused(open_keyed: OpenKeyed) -> None:
    """Two keyrings of the cluster (the keyring and a backup copy) and 16 other clusters' beside it."""
    beside = [("coord.keys", KEYS.keyring), ("coord.backup.keys", KEYS.keyring),
              *((f"other{index:02d}.keys", keyring) for index, keyring in enumerate(OTHER_CLUSTERS))]
    with pytest.raises(InvalidArgument):
        harness = open_keyed(None, beside=beside)
        try:
            write(harness, FORGED_MAX(), k=b"forged")
        finally:
            harness.close()
    _refused_or_verified(open_keyed, None, ())


def test_l2_no_keyring_of_the_cluster_is_refused(open_keyed: OpenKeyed) -> None:
    """Only other clusters' keyrings where discovery looks (the store opened elsewhere, the keyring renamed)."""
    beside = [(f"other{index:02d}.keys", keyring) for index, keyring in enumerate(OTHER_CLUSTERS)]
    with pytest.raises(InvalidArgument):
        harness = open_keyed(None, beside=beside)
        try:
            write(harness, FORGED_MAX(), k=b"forged")
        finally:
            harness.close()


def test_l2_the_keyring_past_sixteen_others_refuses_or_verifies(open_keyed: OpenKeyed) -> None:
    """Our keyring sorted after 16 others': discovery reads it (or the adapter refuses without keys)."""
    beside = [*((f"a{index:02d}.keys", keyring) for index, keyring in enumerate(OTHER_CLUSTERS)),
              ("zz-coord.keys", KEYS.keyring)]
    _refused_or_verified(open_keyed, None, beside)


def test_l2_a_forged_max_value_token_is_refused_with_keys(open_keyed: OpenKeyed) -> None:
    harness = open_keyed(KEYS)
    try:
        write(harness, tok(3), k=b"honest")
        before = harness.state()
        with pytest.raises(TokenMismatch) as info:
            write(harness, FORGED_MAX(), k=b"forged")
        assert info.value.reason == "forged (unsigned)"
        assert harness.state() == before and harness.high_water("a") == 3
        with pytest.raises(StaleToken):  # the honest order still holds
            write(harness, tok(2), k=b"old")
    finally:
        harness.close()


def test_l2_unsigned_is_chosen_in_words(open_keyed: OpenKeyed) -> None:
    harness = open_keyed("unsigned")
    try:
        write(harness, tok(7, keys=None), k=b"legacy")
        assert harness.high_water("a") == 7
    finally:
        harness.close()


def test_l2_once_verified_unsigned_is_refused(open_keyed: OpenKeyed) -> None:
    """A resource that once verified keeps verifying: opened again with ``keys="unsigned"``, it refuses to
    open or to admit (`InvalidArgument`, one line naming what it found), and nothing changes."""
    harness = open_keyed(KEYS)
    try:
        write(harness, tok(3), k=b"honest")
    finally:
        harness.close()
    with pytest.raises(InvalidArgument, match="has verified signed tokens before") as info:
        harness = open_keyed("unsigned")
        try:
            write(harness, FORGED_MAX(), k=b"forged")
        finally:
            harness.close()
    assert "\n" not in str(info.value)
    checker = open_keyed(KEYS)
    try:
        assert checker.high_water("a") == 3, "the refused open moved the mark"
        write(checker, tok(4), k=b"honest")  # the resource still works, with keys
    finally:
        checker.close()


#: The suite's tests that the control (`legacy_keys`) must fail on an adapter that had the hole.
L2_TESTS = ["test_l2_keys_none_is_refused", "test_l2_ambiguous_discovery_is_refused",
            "test_l2_no_keyring_of_the_cluster_is_refused"]
#: The suite's tests that the control must fail on every adapter (none remembered verifying before L2).
L2_MEMORY_TESTS = ["test_l2_once_verified_unsigned_is_refused"]
