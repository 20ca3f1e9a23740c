"""A coordinator file of schema version 1 (leases in a table of their own) is migrated on open, all or nothing.

The file is one main's code wrote (tests/helpers/coord_v1.sql): its tokens keep
rising, its held lease is still held and can be released by its id, its
history is kept, and `stockade serve` and `stockade status` read it too.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import stockade
from stockade.coordinators.sqlite import APPLICATION_ID, SCHEMA_VERSION, SQLiteCoordinator, new_lease_id
from stockade.coordinators.sqlite._rows import LEASE_COLUMNS
from stockade.core.errors import BackendUnavailable
from stockade.core.leases import Granted

V1_DUMP = Path(__file__).parent / "helpers" / "coord_v1.sql"
HELD_SCOPE, HELD_LEASE, HELD_TOKEN = "b", "5rTKPcJeabE_INELQEXBZu6aLj9uc23q", 387367592144142337
LAST_TOKEN_A = 387367592144142339


def _v1_file(tmp_path: Path) -> Path:
    path = tmp_path / "coord.db"
    conn = sqlite3.connect(path)
    conn.executescript(V1_DUMP.read_text())
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("UPDATE meta SET v = 'a-boot-before-this-one' WHERE k = 'boot_id'")  # the restart rule: full TTL
    conn.commit()
    conn.close()
    return path


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    return tables


def test_a_version_1_file_is_migrated_and_its_tokens_keep_rising(tmp_path: Path) -> None:
    path = _v1_file(tmp_path)
    assert "leases" in _tables(path)
    with SQLiteCoordinator(path) as coord:
        assert coord.inspect(HELD_SCOPE).token.value == HELD_TOKEN  # still held, after the restart rule
        refused = coord.try_acquire(HELD_SCOPE, lease_id=new_lease_id(), holder="t", ttl_ms=1000, wait_deadline_ns=0)
        assert not isinstance(refused, Granted)
        assert coord.release(HELD_LEASE).released  # found by its id in its scope's row
        lease_id = new_lease_id()
        granted = coord.try_acquire("a", lease_id=lease_id, holder="t", ttl_ms=1000, wait_deadline_ns=0)
        assert isinstance(granted, Granted) and granted.lease.token.value > LAST_TOKEN_A
        coord.release(lease_id)
        events = coord.records.history("a", 100)
        assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6, 9, 10]  # kept, and numbered on (7, 8: scope b)
        assert [e.kind for e in coord.records.history(HELD_SCOPE, 100)] == ["grant", "release"]
    assert "leases" not in _tables(path)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone() == (SCHEMA_VERSION,)
        assert {r[1] for r in conn.execute("PRAGMA table_info(scopes)")} >= set(LEASE_COLUMNS)
    conn.close()


def test_stockade_serve_loads_a_version_1_file(tmp_path: Path) -> None:
    from helpers.work_budget import served

    _v1_file(tmp_path)
    with served(tmp_path) as server:
        coord = stockade.connect(server.url)
        try:
            assert coord.inspect(HELD_SCOPE).token.value == HELD_TOKEN
            lease = coord.acquire("a", ttl_ms=10_000, keepalive=False)
            assert lease.token.value > LAST_TOKEN_A
            lease.release()
        finally:
            coord.close()


def test_a_failed_migration_leaves_the_file_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _v1_file(tmp_path)
    with sqlite3.connect(path) as conn:
        before = list(conn.iterdump())
    conn.close()

    def failing(conn: sqlite3.Connection) -> None:
        conn.execute("DROP TABLE leases")
        raise sqlite3.OperationalError("disk I/O error (a test's)")

    monkeypatch.setattr("stockade.coordinators.sqlite._rows.migrate_journal", failing)
    with pytest.raises(BackendUnavailable):
        SQLiteCoordinator(path)
    with sqlite3.connect(path) as conn:
        assert list(conn.iterdump()) == before
    conn.close()


def _v2_file(tmp_path: Path, cycles: int) -> Path:
    """A file of schema version 2: every event in ``history`` (indexed by scope), no recent table."""
    path = tmp_path / "coord.db"
    with SQLiteCoordinator(path) as coord:
        for _ in range(cycles):
            lease_id = new_lease_id()
            coord.try_acquire("a", lease_id=lease_id, holder="t", ttl_ms=1000, wait_deadline_ns=0)
            coord.release(lease_id)
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO history SELECT * FROM history_recent")
    conn.execute("DROP TABLE history_recent")
    conn.execute("UPDATE meta SET v = '2' WHERE k = 'schema_version'")
    conn.commit()
    conn.close()
    return path


def test_a_version_2_file_gets_the_recent_table_and_its_events_are_numbered_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stockade.cli import _readonly

    path = _v2_file(tmp_path, 3)
    with sqlite3.connect(path) as conn:
        before = list(conn.iterdump())
    conn.close()
    events, _ = _readonly.read_history(path, "a", 100)  # what `stockade status` reads: as it is
    assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6]
    with sqlite3.connect(path) as conn:
        assert list(conn.iterdump()) == before
    conn.close()
    with monkeypatch.context() as control:  # the control: an opener that migrates version 1 only refuses it
        control.setattr("stockade.coordinators.sqlite.SQLiteRecords._migrating", lambda self, conn: False)
        with pytest.raises(BackendUnavailable, match="schema version '2' is not supported"):
            SQLiteCoordinator(path)
    with SQLiteCoordinator(path) as coord:
        lease_id = new_lease_id()
        coord.try_acquire("a", lease_id=lease_id, holder="t", ttl_ms=1000, wait_deadline_ns=0)
        coord.release(lease_id)
        events = coord.records.history("a", 100)
    assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6, 7, 8]  # the old events kept, the new ones numbered on
    assert "history_recent" in _tables(path)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone() == (SCHEMA_VERSION,)
        assert conn.execute("SELECT COUNT(*) FROM history_recent").fetchone() == (2,)
    conn.close()


def test_the_recent_events_move_keeping_their_numbers(tmp_path: Path) -> None:
    """120 events: the first 100 moved into ``history`` at the 100th, the last 20 still recent; a read takes
    the newest 100 of both tables, numbered 21..120 with no gap (the move kept each event's number)."""
    with SQLiteCoordinator(tmp_path / "coord.db") as coord:
        for _ in range(60):
            lease_id = new_lease_id()
            coord.try_acquire("s", lease_id=lease_id, holder="t", ttl_ms=1000, wait_deadline_ns=0)
            coord.release(lease_id)
        events = coord.records.history("s", 100)
    assert [e.seq for e in events] == list(range(21, 121))
    assert [e.kind for e in events] == ["grant", "release"] * 50
    with sqlite3.connect(tmp_path / "coord.db") as conn:
        assert conn.execute("SELECT MIN(seq), MAX(seq), COUNT(*) FROM history").fetchone() == (1, 100, 100)
        assert conn.execute("SELECT MIN(seq), MAX(seq), COUNT(*) FROM history_recent").fetchone() == (101, 120, 20)
        # the control: the read of version 2 (``history`` alone) misses the newest 20
        old_read = conn.execute("SELECT seq FROM history WHERE scope = 's' ORDER BY seq DESC LIMIT 100").fetchall()
        assert max(row[0] for row in old_read) == 100
    conn.close()
