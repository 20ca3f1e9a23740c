"""The fenced-store conformance suite: what every adapter of `TransactionalStorePort` must do.

Three things are called "store"; this is the suite that proves a store adapter. The others: the
client's handle (`stockade.client`'s `FencedStore`, module ``client/_async/store.py``) and stockade's
own fenced key-value store (`stockade.resources.store`), which passes this suite.

Run it against an adapter by importing its tests into a test module and
providing one fixture, ``make_store``: a callable ``(cluster_id) -> store``
that opens a fresh, empty store trusting ``cluster_id`` (and closes it when
the test ends)::

    from stockade.testing.conformance.store import *  # noqa: F403

    @pytest.fixture
    def make_store(tmp_path):
        ...

The project's own run parametrises ``make_store`` over every scheme in
`stockade.resources.registry.SCHEMES` (tests/test_store_conformance.py) and
refuses a scheme without a parameter. What the suite checks, rule by rule:

- R1: a token lower than the scope's mark is rejected; equal and higher are
  accepted; a higher one raises the mark.
- R2: a token of another scope or cluster is never compared, only rejected.
- R3: a retry with the same idempotency key answers the original result, even
  after the token went stale; a key reused for another write is refused.
- R5: every rejection raises a typed error, changes nothing, and is counted.
- R6: a transaction is fenced once, sees its own steps, and applies all of
  them or none.
- Bad input raises `InvalidArgument` and changes nothing.

State is compared through the port itself (marks, audit trail, items), so
the suite needs nothing of an adapter beyond the port.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from stockade.core.errors import InvalidArgument, StaleToken, TokenMismatch
from stockade.core.tokens import FencingToken
from stockade.resources.port import FencedStorePort, TransactionalStorePort
from stockade.testing.conformance import rejections_counted

CLUSTER = "c0ffee00c0ffee00"
OTHER_CLUSTER = "0ddba110ddba1100"
MakeStore = Callable[[str], TransactionalStorePort]


def tok(value: int, scope: str = "a", cluster: str = CLUSTER) -> FencingToken:
    return FencingToken(cluster, scope, value)


def snapshot(store: TransactionalStorePort, scopes: tuple[str, ...] = ("a", "b")) -> tuple[Any, ...]:
    """Everything a write could change, as seen through the port."""
    return (
        store.high_waters(),
        store.commit_seq(),
        [(r.commit_seq, r.scope, r.key, r.op, r.token_value) for r in store.audit()],
        {scope: [(i.key, i.value, i.token_value) for i in store.list(scope)] for scope in scopes},
    )


@pytest.fixture
def store(make_store: MakeStore) -> TransactionalStorePort:
    return make_store(CLUSTER)


def test_matches_the_port(store: TransactionalStorePort) -> None:
    assert isinstance(store, FencedStorePort)
    assert store.cluster_id == CLUSTER


def test_put_get_delete_list_and_audit(store: TransactionalStorePort) -> None:
    first = store.put("a", "k1", b"one", token=tok(1))
    assert (first.scope, first.key, first.token_value, first.high_water, first.replayed) == ("a", "k1", 1, 1, False)
    store.put("a", "k2", "two", token=tok(1))  # str is stored as UTF-8
    store.put("a", "k3", b"three", token=tok(2))
    item = store.get("a", "k2")
    assert item is not None and (item.value, item.token_value) == (b"two", 1)
    assert store.get("a", "missing") is None and store.get("b", "k1") is None  # scopes are namespaces
    assert [i.key for i in store.list("a")] == ["k1", "k2", "k3"]
    assert [i.key for i in store.list("a", after="k1", limit=1)] == ["k2"]
    store.delete("a", "k1", token=tok(2))
    assert store.get("a", "k1") is None
    assert [(r.key, r.op) for r in store.audit("a")] == [("k1", "put"), ("k2", "put"), ("k3", "put"), ("k1", "delete")]
    seqs = [r.commit_seq for r in store.audit()]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4 and store.commit_seq() == seqs[-1]
    assert store.high_water("a") == 2 and store.high_water("b") == 0 and store.high_waters() == {"a": 2}


def test_encoded_token_string_is_accepted(store: TransactionalStorePort) -> None:
    assert store.put("a", "k", b"v", token=tok(7).encode()).token_value == 7
    with store.transaction("a", token=tok(7).encode()) as tx:
        tx.put("k", b"w")
    item = store.get("a", "k")
    assert item is not None and item.value == b"w"


def test_r1_equal_accepted_higher_raises_lower_rejected(store: TransactionalStorePort) -> None:
    for i in range(5):
        store.put("a", "k", str(i), token=tok(3))
    store.put("a", "k", b"4", token=tok(4))
    before = snapshot(store)
    for stale in (3, 1):
        with pytest.raises(StaleToken) as info:
            store.put("a", "k", b"old", token=tok(stale))
        assert info.value.high_water == 4
    with pytest.raises(StaleToken):
        store.delete("a", "k", token=tok(2))
    assert snapshot(store) == before


@pytest.mark.parametrize(
    "bad, reason", [(tok(9, scope="b"), "wrong-scope"), (tok(9, cluster=OTHER_CLUSTER), "wrong-cluster")]
)
def test_r2_token_of_another_scope_or_cluster_is_never_compared(
    store: TransactionalStorePort, bad: FencingToken, reason: str
) -> None:
    store.put("a", "k", b"v", token=tok(5))
    before = snapshot(store)
    with pytest.raises(TokenMismatch) as info:
        store.put("a", "k", b"evil", token=bad)
    assert info.value.reason == reason
    with pytest.raises(TokenMismatch):
        with store.transaction("a", token=bad):
            pytest.fail("the body must not run")
    assert snapshot(store) == before


def test_r3_retry_answers_the_original_even_after_the_token_went_stale(store: TransactionalStorePort) -> None:
    first = store.put("a", "k", b"v1", token=tok(1), idempotency_key="op-1")
    store.put("a", "k", b"v2", token=tok(2))
    before = snapshot(store)
    retry = store.put("a", "k", b"v1", token=tok(1), idempotency_key="op-1")
    assert retry.replayed and (retry.token_value, retry.commit_seq) == (first.token_value, first.commit_seq)
    assert snapshot(store) == before  # nothing applied again
    with pytest.raises(InvalidArgument):
        store.put("a", "other-key", b"v1", token=tok(2), idempotency_key="op-1")  # another write, same key
    assert snapshot(store) == before




def test_r5_every_rejection_is_counted(store: TransactionalStorePort) -> None:
    store.put("a", "k", b"v", token=tok(5))
    stale, mismatched = rejections_counted("stale"), rejections_counted("wrong-cluster")
    for _ in range(3):
        with pytest.raises(StaleToken):
            store.put("a", "k", b"old", token=tok(4))
    with pytest.raises(TokenMismatch):
        store.put("a", "k", b"old", token=tok(9, cluster=OTHER_CLUSTER))
    assert rejections_counted("stale") == stale + 3
    assert rejections_counted("wrong-cluster") == mismatched + 1


def test_r6_transaction_all_steps_or_none(store: TransactionalStorePort) -> None:
    with store.transaction("a", token=tok(2)) as tx:
        tx.put("x", b"1")
        seen = tx.get("x")
        assert seen is not None and seen.value == b"1"  # sees its own step
        tx.put("y", b"2")
        tx.delete("x")
    assert store.get("a", "x") is None
    assert [(r.key, r.op) for r in store.audit("a")] == [("x", "put"), ("y", "put"), ("x", "delete")]
    before = snapshot(store)
    with pytest.raises(RuntimeError):
        with store.transaction("a", token=tok(3)) as tx:
            tx.put("z", b"3")
            raise RuntimeError("the caller's code failed")
    assert snapshot(store) == before  # no step and no raised mark survive


def test_r6_stale_transaction_is_refused_before_its_body(store: TransactionalStorePort) -> None:
    store.put("a", "x", b"0", token=tok(5))
    before = snapshot(store)
    with pytest.raises(StaleToken):
        with store.transaction("a", token=tok(4)):
            pytest.fail("the body must not run")
    assert snapshot(store) == before


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.put("", "k", b"v", token=tok(1)),
        lambda s: s.put("a", "", b"v", token=tok(1)),
        lambda s: s.put("a", "k", 5, token=tok(1)),
        lambda s: s.put("a", "k", b"v", token="not-a-token"),
        lambda s: s.put("a", "k", b"v", token=tok(1), idempotency_key=""),
        lambda s: s.put("a", "k", b"x" * (s.value_bytes_max + 1), token=tok(1)),
        lambda s: s.delete("a\x00", "k", token=tok(1)),
        lambda s: s.get("a", "k" * 10_000),
        lambda s: s.list("a", limit=0),
        lambda s: s.list("a", limit=10**9),
        lambda s: s.audit(after_seq=-1),
    ],
    ids=["empty-scope", "empty-key", "int-value", "bad-token", "empty-idem-key", "huge-value", "nul-scope",
         "huge-key", "zero-limit", "huge-limit", "negative-seq"],
)
def test_bad_input_is_invalid_argument_and_changes_nothing(
    store: TransactionalStorePort, call: Callable[[Any], object]
) -> None:
    store.put("a", "k", b"v", token=tok(1))
    before = snapshot(store)
    with pytest.raises(InvalidArgument):
        call(store)
    assert snapshot(store) == before


__all__ = ["CLUSTER", "tok", "snapshot", "store"] + [name for name in dir() if name.startswith("test_")]
