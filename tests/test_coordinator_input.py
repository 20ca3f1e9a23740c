"""Bad input to the API raises a clear typed error and changes nothing (compared before/after)."""

from __future__ import annotations

import math

import pytest

import stockade
from stockade import FencingToken, InvalidArgument, NotHolder, StockadeError, TokenMismatch


@pytest.fixture
def world(tmp_path):
    coord = stockade.connect(f"sqlite:///{tmp_path / 'coord.db'}?process=embedded")
    store = stockade.open_store(f"sqlite:///{tmp_path / 'store.db'}", cluster_id=coord.cluster_id)
    lease = coord.acquire("held", ttl_ms=60_000)
    store.put("held", "k", b"v", token=lease.token)
    other = coord.acquire("other", ttl_ms=60_000)
    store.put("other", "k", b"v", token=other.token)
    yield coord, store, lease, other
    lease.release()
    other.release()


def snapshot(coord, store):
    engine = store._port.engine
    records = coord._port.engine._debug_records()
    # leases keep renewing (expires_ns moves); compare everything else
    leases = {s: (r.last_token, r.lease and (r.lease.lease_id, r.lease.token), r.waiters) for s, r in records.items()}
    return leases, engine.high_waters(), [engine.get(s, "k") for s in ("held", "other")], engine.audit()


FOREIGN_CLUSTER = "ffffffffffffffff"

BAD_ACQUIRES = [
    dict(scope="bad scope"), dict(scope=""), dict(scope="x" * 201), dict(scope="é"), dict(scope=None), dict(scope=7),
    dict(ttl_ms=99), dict(ttl_ms=3_600_001), dict(ttl_ms=-1), dict(ttl_ms=0), dict(ttl_ms=1.5), dict(ttl_ms="1000"),
    dict(ttl_ms=True), dict(ttl_ms=math.nan), dict(wait_ms=-1), dict(wait_ms=300_001), dict(wait_ms="forever"),
    dict(holder=""), dict(holder="a b"), dict(holder="x" * 201), dict(holder=3),
]


@pytest.mark.parametrize("bad", BAD_ACQUIRES, ids=[str(b)[:40] for b in BAD_ACQUIRES])
def test_bad_acquire_changes_nothing(world, bad):
    coord, store, _, _ = world
    before = snapshot(coord, store)
    args = dict(scope="fresh", ttl_ms=1000, wait_ms=0)
    args.update(bad)
    scope = args.pop("scope")
    with pytest.raises(InvalidArgument):
        coord.acquire(scope, **args)
    assert snapshot(coord, store) == before


def bad_tokens(lease, other):
    t = lease.token
    return {
        "zero": f"stk1.{t.cluster}.0.held",
        "negative": f"stk1.{t.cluster}.-3.held",
        "2**63": f"stk1.{t.cluster}.{2**63}.held",
        "float": 1.0,
        "int": 5,
        "bool": True,
        "bytes": t.encode().encode(),
        "nan": math.nan,
        "garbage": "not-a-token",
        "leading-zero": f"stk1.{t.cluster}.01.held",
        "empty": "",
        "dict": {"value": 1},
    }


@pytest.mark.parametrize("name", ["zero", "negative", "2**63", "float", "int", "bool", "bytes", "nan", "garbage",
                                  "leading-zero", "empty", "dict"])
def test_bad_token_changes_nothing(world, name):
    coord, store, lease, other = world
    token = bad_tokens(lease, other)[name]
    before = snapshot(coord, store)
    with pytest.raises(InvalidArgument):
        store.put("held", "k", b"x", token=token)
    assert snapshot(coord, store) == before


def test_token_value_object_rejects_out_of_range():
    for value in (0, -1, 2**63, 1.0, True, "1"):
        with pytest.raises(InvalidArgument):
            FencingToken(cluster="0123456789abcdef", scope="s", value=value)
    assert FencingToken(cluster="0123456789abcdef", scope="s", value=2**63 - 1).value == 2**63 - 1


@pytest.mark.parametrize("which", ["another scope", "another cluster"])
def test_foreign_token_rejected_never_compared(world, which):
    coord, store, lease, other = world
    if which == "another scope":
        token = other.token  # valid token, but for scope "other"
    else:
        token = FencingToken(cluster=FOREIGN_CLUSTER, scope="held", value=10**9)
    before = snapshot(coord, store)
    with pytest.raises(TokenMismatch) as info:
        store.put("held", "k", b"x", token=token)
    # the store verifies its coordinator's keyring first: another cluster's token is not one of its MACs
    assert info.value.reason == ("wrong-scope" if which == "another scope" else "forged (unsigned)")
    assert snapshot(coord, store) == before


@pytest.mark.parametrize("lease_id", ["", "x" * 32, "short", None, 5, "a" * 10_000])
def test_unknown_lease_changes_nothing(world, lease_id):
    coord, store, _, _ = world
    engine = coord._port.engine
    before = snapshot(coord, store)
    with pytest.raises((NotHolder, InvalidArgument)) as info:
        engine.renew(lease_id)
    assert isinstance(info.value, StockadeError)
    if isinstance(lease_id, str):
        assert engine.release(lease_id).released is False  # release is idempotent, never an error
    assert snapshot(coord, store) == before


def test_check_can_fail(world):
    # the control: a real change is seen by the snapshot
    coord, store, lease, _ = world
    before = snapshot(coord, store)
    store.put("held", "k", b"changed", token=lease.token)
    assert snapshot(coord, store) != before
