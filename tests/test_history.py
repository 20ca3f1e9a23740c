"""The lease history: bounded, in order, durable, and written in the same commit as each change it records.

What a user sees of every backend's journal (the kinds in order, the last 100 of a scope, bad input) is the
journal conformance suite's (`stockade.testing.conformance.journal`, in tests/test_coordinator_conformance.py).

The kill -9 test stops a process that grants and releases in a loop at random
moments; afterwards the scope's record and its journal must agree. Its
control writes each change's events in a transaction of their own, after the
change's commit, and is caught disagreeing.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import PYTHON, python_env

import stockade
from stockade.cli import main as cli_main
from stockade.coordinators.journal import MemoryJournal, events_of
from stockade.coordinators.sqlite import SQLiteCoordinator, new_lease_id
from stockade.coordinators.sqlite import _journal as _sqlite_journal
from stockade.core.errors import BackendUnavailable, InvalidArgument
from stockade.resources.store._sqlite_journal import rejections

LONG = os.environ.get("STOCKADE_LONG") == "1"
CYCLER = Path(__file__).parent / "helpers" / "jobs_history_cycler.py"


def _cycle(coord, scope: str, n: int) -> None:
    for _ in range(n):
        with coord.lock(scope, ttl_ms=5_000):
            pass


def test_the_journal_has_a_global_cap(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(_sqlite_journal, "HISTORY_TOTAL_MAX", 10)
    coord = stockade.connect(f"sqlite:///{tmp_path}/coord.db?process=embedded")
    for scope in "abcdef":
        _cycle(coord, scope, 2)
    with sqlite3.connect(tmp_path / "coord.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM history").fetchone()[0] <= 10
    assert coord.history("a") == [] and len(coord.history("f")) == 4
    journal = MemoryJournal(per_scope=3, total_max=5)
    for i in range(8):
        journal.add("x" if i % 2 else "y", "grant", "h", i, i)
    assert [e.token_value for e in journal.history("x", 10)] == [3, 5, 7]  # 1: over the global cap
    assert [e.token_value for e in journal.history("y", 10)] == [4, 6]


def test_expiry_release_and_grant_are_told_apart_and_survive_a_restart(tmp_path: Path):
    coord = stockade.connect(f"sqlite:///{tmp_path}/coord.db?process=embedded")
    lease = coord.acquire("s", ttl_ms=100, keepalive=False)
    time.sleep(0.25)
    with coord.lock("s", ttl_ms=1_000) as second:
        pass
    kinds = [(e.kind, e.token_value) for e in coord.history("s")]
    assert kinds == [("grant", lease.token.value), ("expire", lease.token.value),
                     ("grant", second.token.value), ("release", second.token.value)]
    coord.close()
    again = stockade.connect(f"sqlite:///{tmp_path}/coord.db?process=embedded")
    assert [(e.kind, e.token_value) for e in again.history("s")] == kinds
    again.close()


def test_a_failing_journal_write_undoes_the_change(tmp_path: Path, monkeypatch):
    """The change and its events share one transaction: a journal insert that fails leaves neither."""
    coord = SQLiteCoordinator(tmp_path / "coord.db")
    lease_id = new_lease_id()
    coord.try_acquire("f", lease_id=lease_id, holder="h", ttl_ms=5_000, wait_deadline_ns=0)
    before = coord.inspect("f")

    def failing(conn, old, new):
        _sqlite_journal.journal_change(conn, old, new)
        raise sqlite3.OperationalError("disk I/O error (injected after the journal insert)")

    from stockade.coordinators.sqlite import _rows as _sqlite_rows

    monkeypatch.setattr(_sqlite_rows, "journal_change", failing)
    with pytest.raises(BackendUnavailable):
        coord.release(lease_id)
    monkeypatch.undo()
    after = coord.inspect("f")  # still held: the release did not land
    assert (after.state, after.holder, after.token, after.last_token) == (
        before.state, before.holder, before.token, before.last_token)
    client = stockade.connect(f"sqlite:///{tmp_path}/coord.db?process=embedded")
    assert [e.kind for e in client.history("f")] == ["grant"]
    client.close()
    coord.close()


def _agree(path: Path, scope: str) -> list[str]:
    """Where the scope's record and its journal disagree (empty: they agree)."""
    coord = SQLiteCoordinator(path)
    try:
        record = coord.records.records().get(scope)
        client = stockade.connect(f"sqlite:///{path}?process=embedded")
        events = client.history(scope)
        client.close()
    finally:
        coord.close()
    problems = []
    grants = [e for e in events if e.kind == "grant"]
    if record is None or not grants:
        return ["nothing recorded"]
    if grants[-1].token_value != record.last_token:
        problems.append(f"last grant in the journal {grants[-1].token_value}, last token {record.last_token}")
    held = record.lease is not None
    if held != (events[-1].kind == "grant"):
        problems.append(f"record {'holds' if held else 'holds no'} lease, last event {events[-1].kind}")
    for before, after in zip(events, events[1:], strict=False):
        if (before.kind == "grant") == (after.kind == "grant"):
            problems.append(f"{before.kind} {before.token_value} then {after.kind} {after.token_value}")
    return problems


def _kill_rounds(tmp_path: Path, rounds: int, *extra: str, stop_at_first: bool = False) -> tuple[int, int]:
    path = tmp_path / "coord.db"
    SQLiteCoordinator(path).close()
    rng = random.Random(7)
    disagreed = 0
    for done in range(rounds):
        child = subprocess.Popen([PYTHON, str(CYCLER), str(path), "k", *extra], env=python_env(),
                                 stdout=subprocess.PIPE)
        assert child.stdout is not None and child.stdout.readline() == b"cycling\n"
        time.sleep(rng.random() * 0.3)
        child.kill()
        child.wait()
        disagreed += bool(_agree(path, "k"))
        if stop_at_first and disagreed:
            return disagreed, done + 1
    return disagreed, rounds


def test_kill_9_never_leaves_a_change_without_its_event(tmp_path: Path):
    disagreed, rounds = _kill_rounds(tmp_path, 40 if LONG else 3)
    print(f"history: kill -9 mid-loop: record and journal disagree {disagreed} of {rounds}")
    assert disagreed == 0


def test_control_a_journal_written_after_the_commit_is_caught(tmp_path: Path):
    disagreed, rounds = _kill_rounds(tmp_path, 40, "control", stop_at_first=True)
    print(f"history control: kill -9 mid-loop, journal in its own commit: disagree {disagreed} of {rounds}")
    assert disagreed > 0


def test_events_of_a_change():
    from stockade.core.leases import Lease, ScopeRecord
    from stockade.core.tokens import FencingToken

    lease = Lease("id1", "h", FencingToken("a" * 16, "s", 3), 1000, 0, 1_000)
    held = ScopeRecord("s", last_token=3, lease=lease)
    assert events_of(ScopeRecord("s", last_token=2), held) == [("grant", "h", 3)]
    assert events_of(held, ScopeRecord("s", last_token=3)) == [("release", "h", 3)]
    assert events_of(held, ScopeRecord("s", last_token=3, delay_until_ns=1_000)) == [("expire", "h", 3)]
    assert events_of(held, None) == []


def test_the_store_journals_its_refusals_and_the_cli_shows_them(tmp_path: Path, capsys):
    coord = stockade.connect(f"sqlite:///{tmp_path}/coord.db?process=embedded")
    store = stockade.open_store(f"sqlite:///{tmp_path}/store.db", cluster_id=coord.cluster_id)
    old = coord.acquire("r", ttl_ms=1_000)
    old.release()
    with coord.lock("r", ttl_ms=1_000) as new:
        store.put("r", "k", b"new", token=new.token)
        with pytest.raises(stockade.StaleToken):
            store.put("r", "k", b"zombie", token=old.token)
    refused = rejections(tmp_path / "store.db", "r")
    assert [(e.kind, e.token_value) for e in refused] == [("reject", old.token.value)]
    assert refused[0].detail == f"stale, high-water {new.token.value}"
    store.close()
    coord.close()
    assert cli_main(["history", "r", "--data-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    kinds = [line.split()[1] for line in lines]
    # Merged by the millisecond: the reject comes after the second grant; the release that followed it in
    # the same millisecond may be listed before it (two files, one clock reading each: no finer order).
    assert [k for k in kinds if k != "reject"] == ["grant", "release", "grant", "release"], lines
    assert kinds.count("reject") == 1 and kinds.index("reject") >= 3, lines
    assert [line.split()[0] for line in lines] == sorted(line.split()[0] for line in lines), lines
    last_two = sorted(kinds[-2:])
    assert cli_main(["history", "r", "--data-dir", str(tmp_path), "--json", "--limit", "2"]) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(d["kind"] for d in docs) == last_two == ["reject", "release"]
    assert {d["source"] for d in docs} == {"store", "coordinator"}
    assert cli_main(["history", "r", "--data-dir", str(tmp_path), "--limit", "0"]) == 2


def test_the_server_answers_history_from_its_file_across_a_restart(tmp_path: Path, serve):
    data = tmp_path / "data"
    server = serve(data_dir=data)
    coord = stockade.connect(server.url)
    _cycle(coord, "web", 3)
    events = coord.history("web")
    assert [e.kind for e in events] == ["grant", "release"] * 3
    with urllib.request.urlopen(f"{server.url}/v1/locks/web/history?limit=2") as response:
        doc = json.load(response)
    assert [e["kind"] for e in doc["events"]] == ["grant", "release"] and doc["scope"] == "web"
    with pytest.raises(InvalidArgument):
        coord.history("web", limit=101)
    try:
        urllib.request.urlopen(f"{server.url}/v1/locks/web/history?limit=500")
        raise AssertionError("a limit over 100 was accepted")
    except urllib.error.HTTPError as exc:
        assert exc.code == 400
    coord.close()
    server.stop()
    again = serve(data_dir=data)
    coord = stockade.connect(again.url)
    assert coord.history("web") == events
    coord.close()


@pytest.mark.parametrize("journal", [False, True], ids=["serve-table", "memory-control"])
def test_records_without_a_journal_keep_no_events_and_say_so(journal: bool):
    """`stockade serve`'s table keeps no journal in memory (its file journals what it commits, and history is read
    there, test above); memory:// records keep theirs (the control: the same grant and release are journaled)."""
    from stockade.clock import SystemClock
    from stockade.coordinators.memory import MemoryRecords
    from stockade.core.engine import LeaseEngine

    records = MemoryRecords(journal=journal)
    engine = LeaseEngine(records, cluster_id="0123456789abcdef", clock=SystemClock())
    granted = engine.try_acquire("s", lease_id=new_lease_id(), holder="h", ttl_ms=10_000, wait_deadline_ns=0)
    engine.release(granted.lease.lease_id)
    if journal:
        assert [e.kind for e in records.history("s", 10)] == ["grant", "release"]
    else:
        assert records.journal is None
        with pytest.raises(InvalidArgument, match="coordinator file"):
            records.history("s", 10)
