"""The lease history on a real three-server ZooKeeper 3.8 ensemble (docs/history.md, "On ZooKeeper").

The shared history suite runs on ZooKeeper from tests/test_coordinator_conformance.py
(``-k "history and zookeeper"``). Here: the per-scope bound counted on the
server; the global cap; and a kill -9 of a process that grants and releases
in a loop, after which the scope's nodes, its journal record and its events
must agree, beside its control (the journal written in a transaction of its
own, after the change), which must be caught.
"""

from __future__ import annotations

import os
import random
import subprocess
import time

import pytest
from conftest import HELPERS, PYTHON, python_env

import stockade
from stockade.coordinators.zookeeper import _journal as journal
from stockade.coordinators.zookeeper import last_of, sequence_of

LONG = os.environ.get("STOCKADE_LONG") == "1"
KILL_ROUNDS = 40 if LONG else 4
CONTROL_ROUNDS_MAX = 40
CYCLER = HELPERS / "zk_history_cycler.py"


@pytest.fixture
def raw(zk_ensemble):
    """A plain kazoo client on the ensemble, to read the nodes as they are."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=zk_ensemble.hosts, timeout=30)
    client.start(30)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def url(zk_ensemble, tmp_path) -> str:
    return f"{zk_ensemble.url}/{tmp_path.name}"


def _cycle(coord, scope: str, n: int) -> None:
    for _ in range(n):
        coord.acquire(scope, ttl_ms=2000).release()


def test_a_scope_keeps_its_last_100_events_counted_on_the_server(url, raw, tmp_path):
    coord = stockade.connect(url)
    _cycle(coord, "bound", 53)  # 106 events
    hist = f"/{tmp_path.name}/stockade/hist/bound"
    numbers = sorted(journal.event_number(name) for name in raw.get_children(hist))
    assert numbers == list(range(7, 107))  # the 6 oldest were deleted in the transactions that wrote 101..106
    record = journal.record_of(*raw.get(hist))
    assert (record.count, record.floor, record.open_token, record.queued) == (106, 7, 0, 0)
    events = coord.history("bound")
    assert len(events) == 100 and [e.kind for e in events] == ["grant", "release"] * 50
    assert [e.seq for e in events] == sorted({e.seq for e in events})
    coord.close()


def test_the_journals_global_cap_empties_the_least_recently_written(url, raw, tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "HISTORY_PER_SCOPE", 4)
    monkeypatch.setattr(journal, "HISTORY_TOTAL_MAX", 10)
    coord = stockade.connect(url)
    for scope in ["s1", "s2", "s3", "s4"]:
        _cycle(coord, scope, 3)  # 6 events each, 4 kept: 16 in all, over the cap of 10
    hist = f"/{tmp_path.name}/stockade/hist"

    def kept() -> dict[str, int]:
        return {name: len(raw.get_children(f"{hist}/{name}")) for name in raw.get_children(hist)}

    deadline = time.monotonic() + 30
    while sum(kept().values()) > 10:  # trimmed in the background, past each window of 4 events
        assert time.monotonic() < deadline, kept()
        time.sleep(0.05)
    assert kept() == {"s1": 0, "s2": 0, "s3": 4, "s4": 4}  # the oldest journals went, whole
    assert coord.history("s1") == [] and len(coord.history("s4")) == 4
    _cycle(coord, "s1", 1)  # an emptied journal goes on from where it was
    assert [(e.kind, journal.event_number(n)) for e, n in zip(
        coord.history("s1"), sorted(raw.get_children(f"{hist}/s1")), strict=True)] == [("grant", 7), ("release", 8)]
    coord.close()


def _disagreements(raw, root: str, scope: str, coord) -> list[str]:
    """Where the scope's queue, its journal record and its events disagree (empty: they agree)."""
    from kazoo.exceptions import NoNodeError

    record = journal.record_of(*raw.get(f"{root}/hist/{scope}"))
    try:
        names = raw.get_children(f"{root}/q/{scope}")
    except NoNodeError:
        names = []
    queue = sorted((sequence_of(name), raw.exists(f"{root}/q/{scope}/{name}")) for name in names)
    queue = [(seq, stat.czxid) for seq, stat in queue if stat is not None]
    events = coord.history(scope)
    problems = []
    if record.open_token:
        if queue and queue[0][1] != record.open_token:
            problems.append(f"open grant {record.open_token}, queue head {queue[0]}")
        last_token, how, _ = last_of(raw.get(f"{root}/last/{scope}")[0])
        if not queue and last_token == record.open_token:  # else: its session expired, not yet settled
            problems.append(f"open grant {record.open_token}, but its node left ({how}) without its event")
        if not events or (events[-1].kind, events[-1].token_value) != ("grant", record.open_token):
            problems.append(f"open grant {record.open_token}, last event {events[-1:]}")
    elif events and events[-1].kind == "grant":
        problems.append(f"no open grant, last event {events[-1]}")
    if len(queue) - bool(record.open_token) > record.queued:
        problems.append(f"{len(queue)} queued nodes, the record counts {record.queued} besides the holder")
    for before, after in zip(events, events[1:], strict=False):
        ends_it = after.kind in ("release", "expire") and after.token_value == before.token_value
        if not (ends_it if before.kind == "grant" else after.kind == "grant"):
            problems.append(f"{before.kind} {before.token_value} then {after.kind} {after.token_value}")
    if record.count != (journal.event_number(max(raw.get_children(f"{root}/hist/{scope}"), default="e-0")) or 0):
        problems.append(f"record counts {record.count} events")
    return problems


def _kill_rounds(url: str, raw, root: str, rounds: int, *extra: str, stop_at_first: bool = False):
    rng = random.Random(13)
    disagreed: list[list[str]] = []
    checker = stockade.connect(url)
    env = python_env()
    try:
        for done in range(rounds):
            child = subprocess.Popen([PYTHON, str(CYCLER), f"{url}?session_timeout_ms=1000", "k", *extra],
                                     env=env, stdout=subprocess.PIPE)
            assert child.stdout is not None and child.stdout.readline() == b"cycling\n", "the cycler did not start"
            time.sleep(rng.random() * 0.4)
            child.kill()
            child.wait()
            # A transaction the child sent before it died may still be committing, and the two
            # sessions read from different servers: only a disagreement that lasts counts.
            for _ in range(20):
                problems = _disagreements(raw, root, "k", checker)
                if not problems:
                    break
                time.sleep(0.05)
            if problems:
                disagreed.append(problems)
                if stop_at_first:
                    return disagreed, done + 1
    finally:
        checker.close()
    return disagreed, rounds


def test_kill_9_never_leaves_a_change_without_its_journal(url, raw, tmp_path):
    disagreed, rounds = _kill_rounds(url, raw, f"/{tmp_path.name}/stockade", KILL_ROUNDS)
    kinds = [e.kind for e in stockade.connect(url).history("k")]
    print(f"history zookeeper: kill -9 mid-loop: queue, record and journal disagree {len(disagreed)} of {rounds}; "
          f"last 100 events: {kinds.count('expire')} expiries (killed holders settled by the next grant)")
    assert disagreed == []
    assert "expire" in kinds or not LONG  # a killed holder's grant is settled by the next one's (40 rounds)


def test_control_the_journal_in_its_own_transaction_is_caught(url, raw, tmp_path):
    disagreed, rounds = _kill_rounds(url, raw, f"/{tmp_path.name}/stockade", CONTROL_ROUNDS_MAX, "control",
                                     stop_at_first=True)
    print(f"history zookeeper control: journal written after the change: disagree at round {rounds}: {disagreed}")
    assert disagreed, f"the control was never caught in {rounds} rounds"


def test_cli_history_on_zookeeper(url):
    coord = stockade.connect(url)
    lease = coord.acquire("cli-h", ttl_ms=2000, holder="ann")
    lease.release()
    shown = subprocess.run([PYTHON, "-m", "stockade", "history", "cli-h", "--url", url],
                           capture_output=True, text=True, env=python_env(), timeout=60)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert [line.split()[1] for line in lines] == ["grant", "release"], lines
    assert all(f"token {lease.token.value}" in line and "holder ann" in line for line in lines)
    coord.close()
