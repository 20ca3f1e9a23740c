"""The lease-journal conformance suite: what every coordinator's journal must show through ``history()``.

Run beside the coordinator suite (`stockade.testing.conformance.coordinator`),
with the same three fixtures (``client``, ``coord_url``, ``store_url``). Every
backend keeps a journal of each scope's grants, expiries and releases, written
in the same atomic step as the change it records (docs/history.md); these
tests check what a user sees of it: the kinds, in order, with their tokens
and holders, bounded to the last 100 per scope, and clear errors on bad input.
"""

from __future__ import annotations

import time

import pytest

from stockade import InvalidArgument, LockTimeout
from stockade.coordinators.journal import HISTORY_PER_SCOPE


def _close(client, coord) -> None:
    client.run(coord.aclose() if client.mode == "async" else coord.close())


def _history(client, coord, scope: str, **kwargs):
    return client.run(coord.history(scope, **kwargs))


def test_history_names_each_grant_and_release_in_order(client, coord_url):
    coord = client.connect(coord_url)
    tokens = []
    for holder in ["ann", "bob", "cy"]:
        lease = client.run(coord.acquire("hist-a", ttl_ms=5_000, holder=holder))
        tokens.append(lease.token.value)
        client.run(lease.release())
    events = _history(client, coord, "hist-a")
    assert [e.kind for e in events] == ["grant", "release"] * 3
    assert [e.token_value for e in events] == [t for t in tokens for _ in range(2)]
    assert [e.holder for e in events] == ["ann", "ann", "bob", "bob", "cy", "cy"]
    assert all(e.scope == "hist-a" for e in events)
    assert [e.seq for e in events] == sorted({e.seq for e in events})  # increasing, never reused
    assert all(e.at_unix_ms > 1_600_000_000_000 for e in events)  # wall-clock milliseconds
    assert _history(client, coord, "hist-a", limit=2) == events[-2:]
    assert _history(client, coord, "hist-never-used") == []
    _close(client, coord)


def test_history_keeps_the_last_100_events_of_a_scope(client, coord_url):
    coord = client.connect(coord_url)
    cycles = HISTORY_PER_SCOPE // 2 + 3  # 106 events
    tokens = []
    for _ in range(cycles):
        lease = client.run(coord.acquire("hist-b", ttl_ms=5_000))
        tokens.append(lease.token.value)
        client.run(lease.release())
    lease = client.run(coord.acquire("hist-other", ttl_ms=5_000))
    client.run(lease.release())
    events = _history(client, coord, "hist-b")
    assert len(events) == HISTORY_PER_SCOPE
    assert [e.kind for e in events] == ["grant", "release"] * (HISTORY_PER_SCOPE // 2)
    assert [e.token_value for e in events[::2]] == tokens[-HISTORY_PER_SCOPE // 2:]
    assert [e.token_value for e in events[1::2]] == tokens[-HISTORY_PER_SCOPE // 2:]
    assert [e.kind for e in _history(client, coord, "hist-other")] == ["grant", "release"]
    _close(client, coord)


def test_history_tells_an_expiry_from_a_release(client, coord_url):
    coord = client.connect(coord_url)
    lapsed = client.run(coord.acquire("hist-c", ttl_ms=1_000, keepalive=False, holder="sleepy"))
    deadline = time.monotonic() + 30
    while True:  # the next holder, once the lapsed lease has gone (etcd: whole seconds; ZooKeeper: its deadline)
        try:
            nxt = client.run(coord.acquire("hist-c", ttl_ms=5_000, wait_ms=500, holder="next"))
            break
        except LockTimeout:
            assert time.monotonic() < deadline, "the lapsed lease never went"
    client.run(nxt.release())
    client.run(lapsed.release())  # a lease already gone: 'not held', and no event
    events = _history(client, coord, "hist-c")
    assert [(e.kind, e.holder, e.token_value) for e in events] == [
        ("grant", "sleepy", lapsed.token.value),
        ("expire", "sleepy", lapsed.token.value),
        ("grant", "next", nxt.token.value),
        ("release", "next", nxt.token.value),
    ]
    _close(client, coord)


def test_history_refuses_bad_input_clearly(client, coord_url):
    coord = client.connect(coord_url)
    for bad in [0, HISTORY_PER_SCOPE + 1, True, "5", None]:
        with pytest.raises(InvalidArgument):
            _history(client, coord, "hist-d", limit=bad)
    for scope in ["no spaces", "", "x" * 10_000]:
        with pytest.raises(InvalidArgument):
            _history(client, coord, scope)
    _close(client, coord)
