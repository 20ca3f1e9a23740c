"""The lease history on etcd: journal keys written in the Txn of each change, bounded, and served.

The conformance suite (`stockade.testing.conformance.journal`) runs on etcd from
tests/test_coordinator_conformance.py; this file holds what is etcd's own:

- a grant whose Txn fails at etcd writes no event (control: the events in a Txn
  of their own, *before* the change, leave one);
- a process that grants, releases and lets leases lapse in a loop is killed
  with kill -9 at random moments: afterwards ``last/<scope>``, the history's
  head and its events agree (control: the events in a Txn of their own,
  *after* the change, is caught);
- a scope's journal never holds more than 100 keys, counted with a raw range;
  the global cap is swept;
- two clients whose remembered heads go stale, a waiter, an expiry;
- ``stockade history --url etcd://`` and ``stockade serve --coordinator`` (etcd and sqlite).
"""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import HELPERS, PYTHON, python_env
from helpers.etcd_cluster import etcd_available
from helpers.etcd_history_cycler import split_journal

import stockade
from stockade.cli import main as cli_main
from stockade.coordinators import etcd as recipe
from stockade.coordinators.etcd import _journal as _etcd_journal
from stockade.coordinators.etcd._journal import Head, head_of
from stockade.coordinators.journal import HISTORY_PER_SCOPE
from stockade.core.errors import BackendUnavailable

LONG = os.environ.get("STOCKADE_LONG") == "1"
KILL_ROUNDS = 40 if LONG else 6
CYCLER = HELPERS / "etcd_history_cycler.py"

pytestmark = pytest.mark.skipif(
    not etcd_available() and os.environ.get("CI") != "true", reason="etcd is not installed (CI never skips)"
)


@pytest.fixture
def url(etcd_cluster, tmp_path) -> str:
    return f"{etcd_cluster.url}/{tmp_path.name}"  # a namespace per test


def _layout(url: str) -> recipe.Layout:
    return recipe.parse_location(url.removeprefix("etcd://"))[1]


def _raw(cluster, key: bytes, end: bytes | None = None, **options) -> dict:
    body = {"key": base64.b64encode(key).decode(), **options}
    if end is not None:
        body["range_end"] = base64.b64encode(end).decode()
    return cluster._post(cluster.names[0], "/v3/kv/range", body, 5.0)


def _count(cluster, prefix: bytes) -> int:
    return int(_raw(cluster, prefix, recipe.prefix_end(prefix), count_only=True).get("count", 0))


def _one(cluster, key: bytes) -> recipe.KV | None:
    kvs = recipe.kvs_of(_raw(cluster, key))
    return kvs[0] if kvs else None


def _revoke_queue(cluster, layout: recipe.Layout, scope: str) -> int:
    """Revoke the etcd lease of every queue key of ``scope`` (what etcd does when they expire)."""
    prefix = layout.queue_prefix(scope)
    kvs = recipe.kvs_of(_raw(cluster, prefix, recipe.prefix_end(prefix)))
    for kv in kvs:
        try:
            cluster._post(cluster.names[0], "/v3/lease/revoke", {"ID": str(kv.lease)}, 5.0)
        except urllib.error.HTTPError:
            pass  # gone already
    return len(kvs)


def _kinds(events) -> list[tuple[str, str, int]]:
    return [(e.kind, e.holder, e.token_value) for e in events]


# -- pure: the journal's ops ---------------------------------------------------------------------------


def test_journal_ops_name_the_next_keys_and_the_one_that_falls_out():
    layout = recipe.Layout()
    head = Head(n=100, open_token=7, open_holder="a", mod_revision=9, raw=b"x")
    ops, after = _etcd_journal.journal_ops(layout, "s", head, [*_etcd_journal.ending(head, 0), ("grant", "b", 0)],
                                           opens=(0, "b"), at_unix_ms=1)
    keys = [(next(iter(op)), recipe.unb64(next(iter(op.values()))["key"])) for op in ops]
    assert keys == [("request_put", layout.journal_key("s", 101)), ("request_delete_range", layout.journal_key("s", 1)),
                    ("request_put", layout.journal_key("s", 102)), ("request_delete_range", layout.journal_key("s", 2)),
                    ("request_put", layout.head_key("s"))]
    written = _etcd_journal.settled(after, 500)
    assert (written.n, written.open_token, written.open_holder, written.mod_revision) == (102, 500, "b", 500)
    stored = head_of(recipe.KV(layout.head_key("s"), written.raw, 1, 500, 0))
    assert stored == written  # "self" reads back as the head's own revision
    assert _etcd_journal.ending(written, 500) == [] and _etcd_journal.ending(Head(), 3) == []
    released, _ = _etcd_journal.journal_ops(layout, "s", Head(n=3), [("release", "b", 4)], opens=None, at_unix_ms=1)
    assert [next(iter(op)) for op in released] == ["request_put", "request_put"]  # under 100: nothing falls out
    assert _etcd_journal.head_compare("k", Head())[0]["target"] == "CREATE"
    assert [c["target"] for c in _etcd_journal.head_compare("k", written)] == ["MOD", "VALUE"]


# -- what a user sees ---------------------------------------------------------------------------------


def test_an_expiry_is_recorded_by_the_next_grant_and_a_late_release_writes_nothing(url, etcd_cluster):
    coord = stockade.connect(url)
    lapsed = coord.acquire("exp", ttl_ms=5_000, keepalive=False, holder="sleepy")
    _revoke_queue(etcd_cluster, _layout(url), "exp")  # etcd deletes the key: no Txn of ours
    assert coord.inspect("exp").state.name == "FREE"
    assert _kinds(coord.history("exp")) == [("grant", "sleepy", lapsed.token.value)]  # not settled yet
    with coord.lock("exp", ttl_ms=5_000, holder="next") as nxt:
        pass
    lapsed.release()  # 'not held': its key is gone, and nothing is written
    assert _kinds(coord.history("exp")) == [
        ("grant", "sleepy", lapsed.token.value), ("expire", "sleepy", lapsed.token.value),
        ("grant", "next", nxt.token.value), ("release", "next", nxt.token.value),
    ]
    events = coord.history("exp")
    assert events[1].seq // 10 == events[2].seq // 10 == nxt.token.value  # one Txn: the expire, then the grant
    assert [e.seq for e in events] == sorted({e.seq for e in events})
    coord.close()


def test_two_clients_and_a_waiter_keep_one_history(url):
    """Each client's remembered head goes stale when the other writes: its Txn fails and is sent again."""
    one, two = stockade.connect(url), stockade.connect(url)
    tokens = []
    for turn in range(6):
        coord = (one, two)[turn % 2]
        with coord.lock("shared", ttl_ms=5_000, holder=f"h{turn}") as lease:
            tokens.append(lease.token.value)
    held = one.acquire("shared", ttl_ms=5_000, holder="first")
    granted = []
    waiter = threading.Thread(target=lambda: granted.append(two.acquire("shared", ttl_ms=5_000, wait_ms=20_000,
                                                                        holder="waiter")))
    waiter.start()
    deadline = time.monotonic() + 20
    while one.inspect("shared").waiters < 1:
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.02)
    held.release()
    waiter.join(30)
    granted[0].release()
    events = two.history("shared")
    assert [e.kind for e in events] == ["grant", "release"] * 8
    assert [e.holder for e in events[::2]] == [f"h{i}" for i in range(6)] + ["first", "waiter"]
    assert [e.token_value for e in events[::2]] == tokens + [held.token.value, granted[0].token.value]
    assert [e.token_value for e in events[1::2]] == [e.token_value for e in events[::2]]
    assert events == one.history("shared")
    one.close()
    two.close()


def test_the_journal_of_a_scope_never_holds_more_than_100_keys(url, etcd_cluster):
    coord = stockade.connect(url)
    prefix = _layout(url).journal_prefix("bound")
    counts = []
    for _ in range(HISTORY_PER_SCOPE // 2 + 10):  # 120 events
        with coord.lock("bound", ttl_ms=5_000):
            pass
        counts.append(_count(etcd_cluster, prefix))
    print(f"history on etcd: keys of one scope after each of {len(counts)} cycles: max {max(counts)}, "
          f"last {counts[-1]}")
    assert max(counts) == counts[-1] == HISTORY_PER_SCOPE
    events = coord.history("bound")
    assert len(events) == HISTORY_PER_SCOPE and [e.kind for e in events] == ["grant", "release"] * 50
    head = head_of(_one(etcd_cluster, _layout(url).head_key("bound")))
    assert (head.n, head.open_token) == (2 * len(counts), 0)
    coord.close()


def test_control_a_journal_that_deletes_nothing_outgrows_the_bound(url, etcd_cluster, monkeypatch):
    """The bug put back: events appended without the delete of the one that falls out of the window."""
    real = _etcd_journal.journal_ops

    def appending(*args, **kwargs):
        ops, after = real(*args, **kwargs)
        return [op for op in ops if "request_delete_range" not in op], after

    monkeypatch.setattr(recipe, "journal_ops", appending)
    coord = stockade.connect(url)
    for _ in range(HISTORY_PER_SCOPE // 2 + 10):
        with coord.lock("bound", ttl_ms=5_000):
            pass
    keys = _count(etcd_cluster, _layout(url).journal_prefix("bound"))
    print(f"history control on etcd: no delete in the Txn: {keys} keys for one scope after 60 cycles")
    assert keys > HISTORY_PER_SCOPE
    coord.close()


def _global(url: str, cluster, sweep_chance: float) -> tuple[int, int, object]:
    coord = stockade.connect(url)
    port = coord._port
    port.journal.total_max, port.journal.sweep_chance = 30, sweep_chance  # 1.0: a sweep before every acquire
    for scope in ["g1", "g2", "g3", "g4"]:
        for _ in range(10):
            with coord.lock(scope, ttl_ms=5_000):
                pass
    root = _layout(url).journal_root
    before = _count(cluster, root)
    coord.acquire("g4", ttl_ms=5_000)  # sweeps first, then writes its grant (released by close)
    after = _count(cluster, root)
    return before, after, coord


def test_the_global_cap_is_swept(url, etcd_cluster):
    before, after, coord = _global(url, etcd_cluster, 1.0)
    print(f"history on etcd: global cap 30: {before} keys before a sweep, {after} after it and one grant")
    assert before <= 30 + 3 and after <= 30 + 1
    assert [e.kind for e in coord.history("g4")][-3:] == ["grant", "release", "grant"]  # the newest stay
    assert coord.history("g1") == []  # the oldest went first
    coord.close()


def test_control_without_a_sweep_the_global_cap_is_passed(url, etcd_cluster):
    before, after, coord = _global(url, etcd_cluster, 0.0)
    print(f"history control on etcd: no sweep: {after} keys against a cap of 30")
    assert after == 81  # 40 cycles and one grant: nothing deleted
    coord.close()


# -- atomicity ----------------------------------------------------------------------------------------


def _failed_grant_leaves(url: str, cluster, when: str | None) -> tuple[int, int]:
    """Make a grant's Txn fail at etcd (its reused etcd lease was revoked behind the port's back).

    Returns the events and the scope's ``last/`` revision before and after, as (events added, last moved).
    """
    coord = stockade.connect(url)
    with coord.lock("fail", ttl_ms=5_000):
        pass  # the port keeps this etcd lease to grant again
    port = coord._port
    lease, _, _ = port._spares[-1]
    cluster._post(cluster.names[0], "/v3/lease/revoke", {"ID": str(lease)}, 5.0)
    if when is not None:
        split_journal(port, when)
    layout = _layout(url)
    before_events = len(coord.history("fail"))
    before_last = _one(cluster, layout.last_key("fail"))
    with pytest.raises(BackendUnavailable):
        coord.acquire("fail", ttl_ms=5_000)
    added = len(coord.history("fail")) - before_events
    after_last = _one(cluster, layout.last_key("fail"))
    coord.close()
    return added, int(after_last.mod_revision != before_last.mod_revision)


def test_a_grant_whose_txn_fails_writes_no_event(url, etcd_cluster):
    added, moved = _failed_grant_leaves(url, etcd_cluster, None)
    print(f"history on etcd: a grant Txn refused by etcd: {added} events written, last/ moved {moved}")
    assert (added, moved) == (0, 0)


def test_control_events_in_a_txn_before_the_change_are_caught(url, etcd_cluster):
    added, moved = _failed_grant_leaves(url, etcd_cluster, "before")
    print(f"history control: events in their own Txn before the change: {added} written by a failed grant")
    assert moved == 0 and added > 0


def _disagreements(url: str, cluster, scope: str) -> list[str]:
    """Where ``last/<scope>``, the history's head and its events disagree (empty: they agree)."""
    layout = _layout(url)
    coord = stockade.connect(url)
    events = coord.history(scope)
    coord.close()
    last_token, released = recipe.last_of(_one(cluster, layout.last_key(scope)))
    head = head_of(_one(cluster, layout.head_key(scope)))
    problems = []
    grants = [e for e in events if e.kind == "grant"]
    if not grants or grants[-1].token_value != last_token:
        problems.append(f"last grant in the journal {grants[-1].token_value if grants else None}, last/ {last_token}")
    if events and (events[-1].kind == "release") != released:
        problems.append(f"last/ {'released' if released else 'not released'}, last event {events[-1].kind}")
    if events and events[-1].token_value != last_token:
        problems.append(f"last event names {events[-1].token_value}, last/ {last_token}")
    queue = layout.queue_prefix(scope)
    holders = recipe.kvs_of(_raw(cluster, queue, recipe.prefix_end(queue), sort_order="ASCEND",
                                 sort_target="CREATE", limit="1"))
    if holders and holders[0].create_revision == last_token and (released or events[-1:] != grants[-1:]):
        problems.append(f"{last_token} holds the scope, last event {events[-1].kind if events else None}")
    if head.open_token != (0 if released else last_token):
        problems.append(f"head leaves {head.open_token} open, last/ {last_token} released={released}")
    for before, after in zip(events, events[1:], strict=False):
        if (before.kind == "grant") == (after.kind == "grant"):
            problems.append(f"{before.kind} {before.token_value} then {after.kind} {after.token_value}")
        elif before.kind == "grant" and after.token_value != before.token_value:
            problems.append(f"grant {before.token_value} ended as {after.token_value}")
    return problems


def _kill_rounds(url: str, cluster, rounds: int, *extra: str, stop_at_first: bool = False) -> tuple[int, int]:
    rng = random.Random(11)
    disagreed = 0
    for done in range(rounds):
        child = subprocess.Popen([PYTHON, str(CYCLER), url, "k", *extra], env=python_env(), stdout=subprocess.PIPE)
        try:
            assert child.stdout is not None and child.stdout.readline() == b"cycling\n"
            time.sleep(rng.random() * 0.4)
        finally:
            child.kill()
            child.wait()
        problems = _disagreements(url, cluster, "k")
        if problems:
            print(f"  round {done + 1}: {problems}")
        disagreed += bool(problems)
        _revoke_queue(cluster, _layout(url), "k")  # the killed holder's key goes now, not after its TTL
        if stop_at_first and disagreed:
            return disagreed, done + 1
    return disagreed, rounds


def test_kill_9_never_leaves_a_change_without_its_event(url, etcd_cluster):
    disagreed, rounds = _kill_rounds(url, etcd_cluster, KILL_ROUNDS)
    print(f"history on etcd: kill -9 mid-loop: last/, head and journal disagree {disagreed} of {rounds}")
    assert disagreed == 0


def test_control_events_in_a_txn_after_the_change_are_caught(url, etcd_cluster):
    disagreed, rounds = _kill_rounds(url, etcd_cluster, 40, "control", stop_at_first=True)
    print(f"history control on etcd: events in their own Txn after the change: disagree at kill {rounds}")
    assert disagreed > 0


# -- the CLI and the server ---------------------------------------------------------------------------


def test_cli_history_on_etcd(url, capsys):
    coord = stockade.connect(url)
    with coord.lock("cli", ttl_ms=5_000, holder="ann") as lease:
        pass
    coord.close()
    assert cli_main(["history", "cli", "--url", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["grant", "release"]
    assert all("holder ann" in line and f"token {lease.token.value}" in line for line in lines)
    assert cli_main(["history", "cli", "--url", url, "--json", "--limit", "1"]) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(d["kind"], d["token_value"], d["source"]) for d in docs] == [("release", lease.token.value,
                                                                            "coordinator")]
    assert cli_main(["history", "cli", "--url", url, "--limit", "101"]) == 2


def _get(url: str) -> tuple[int, dict, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.load(response), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), exc.headers.get("Content-Type", "")


@pytest.mark.parametrize("backend", ["etcd", "sqlite"])
def test_serve_coordinator_answers_history_from_the_backend(backend, url, serve, tmp_path: Path):
    coord_url = url if backend == "etcd" else f"sqlite:///{tmp_path / 'backend' / 'coord.db'}"
    (tmp_path / "backend").mkdir()
    server = serve("--coordinator", coord_url)
    client = stockade.connect(server.url)
    for _ in range(2):
        with client.lock("web", ttl_ms=5_000, holder="web-1"):
            pass
    status, doc, _ = _get(f"{server.url}/v1/locks/web/history?limit=3")
    assert status == 200 and doc["scope"] == "web"
    assert [e["kind"] for e in doc["events"]] == ["release", "grant", "release"]
    beside = coord_url if backend == "etcd" else f"{coord_url}?process=embedded"  # beside the server, in process
    assert client.history("web") == stockade.connect(beside).history("web")  # the backend's own journal
    assert _get(f"{server.url}/v1/locks/never/history")[:2] == (200, {"scope": "never", "events": []})
    for bad in ["web/history?limit=0", "web/history?limit=101", "web/history?limit=x", "no%20space/history"]:
        status, problem, content_type = _get(f"{server.url}/v1/locks/{bad}")
        assert status == 400 and content_type.startswith("application/problem+json"), (bad, status, problem)
    client.close()


def test_serve_coordinator_refuses_history_for_a_backend_without_one():
    """An engine whose record store keeps no journal (not `Journaled`): a clear InvalidArgument, the route's 400."""
    import asyncio
    import types

    from stockade.client._async._embedded import AsyncEmbeddedCoordinatorPort
    from stockade.core.errors import InvalidArgument
    from stockade.server._port_leases import PortLeaseService

    port = AsyncEmbeddedCoordinatorPort.__new__(AsyncEmbeddedCoordinatorPort)
    port.engine = types.SimpleNamespace(records=object())  # a record store that journals nothing
    with pytest.raises(InvalidArgument, match="keeps no lease history"):
        asyncio.run(PortLeaseService.history(types.SimpleNamespace(port=port), "s", 10))
