"""The PostgreSQL coordinator's lease history: written in the same transaction as each change it records.

The kill -9 test stops a process that grants and releases in a loop at
random moments (grants of a free scope and releases by the one-statement
rules, an expiry and the next grant by the lease engine's path); afterwards
the scope's record and its journal must agree. A history insert that fails
undoes the change it records, on both paths. Databases of schema versions 3
(no journal, server rules that write none) and 6 (a journal numbered per scope)
migrate to the lease log of version 9 with their events. Each has a control
with the bug put back, caught.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import time

import psycopg
import pytest
from conftest import HELPERS, PYTHON, python_env
from helpers.pg_history import SCHEMA_6_HISTORY, agreement, defer_journal
from helpers.pg_schema8 import grant_8

import stockade
from stockade.cli import main as cli_main
from stockade.coordinators import postgres as pg_module
from stockade.coordinators.postgres import PostgresCoordinator
from stockade.coordinators.postgres._journal import log_functions
from stockade.coordinators.postgres._rows import MIGRATIONS, server_rules
from stockade.coordinators.postgres._schema8 import HISTORY_APPEND_ONLY, MIGRATIONS_8, SERVER_RULES_8
from stockade.coordinators.sqlite import new_lease_id
from stockade.core.errors import BackendUnavailable

LONG = os.environ.get("STOCKADE_LONG") == "1"
CYCLER = HELPERS / "pg_history_cycler.py"


def _kinds(url: str, scope: str) -> list[tuple[str, str, int]]:
    client = stockade.connect(url)
    try:
        return [(e.kind, e.holder, e.token_value) for e in client.history(scope)]
    finally:
        client.close()


def _kill_rounds(url: str, rounds: int, *extra: str, stop_at_first: bool = False) -> tuple[int, int]:
    PostgresCoordinator(url).close()  # the tables, before the first child races to create them
    rng = random.Random(7)
    disagreed = 0
    for done in range(rounds):
        child = subprocess.Popen([PYTHON, str(CYCLER), url, "k", *extra], env=python_env(), stdout=subprocess.PIPE)
        assert child.stdout is not None and child.stdout.readline() == b"cycling\n"
        time.sleep(rng.random() * 0.3)
        child.kill()
        child.wait()
        problems = agreement(url, "k")
        if problems:
            print(f"round {done + 1}: {problems}")
        disagreed += bool(problems)
        if stop_at_first and disagreed:
            return disagreed, done + 1
    return disagreed, rounds


def test_kill_9_never_leaves_a_change_without_its_event(pg_coord_url):
    disagreed, rounds = _kill_rounds(pg_coord_url, 40 if LONG else 6)
    events = _kinds(pg_coord_url, "k")
    assert {kind for kind, _, _ in events} == {"grant", "release", "expire"}, events  # both paths ran
    print(f"history on postgres: kill -9 mid-loop: record and journal disagree {disagreed} of {rounds}")
    assert disagreed == 0


def test_control_a_journal_written_after_the_commit_is_caught(pg_coord_url):
    disagreed, rounds = _kill_rounds(pg_coord_url, 40, "control", stop_at_first=True)
    print(f"history on postgres control: journal in its own commit: disagree {disagreed} of {rounds}")
    assert disagreed > 0


def _inject_failing_insert(url: str) -> None:
    """From now on an event of the holder ``doomed`` cannot be journaled (its row can be neither written nor ended)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE stockade_coord_log ADD CONSTRAINT injected CHECK (holder <> 'doomed') NOT VALID")


def _release_fails(url: str, *, server_rules: bool, control: bool = False) -> list[str]:
    coord = PostgresCoordinator(url)
    coord.server_rules = server_rules
    lease_id = new_lease_id()
    granted = coord.attempt("f", lease_id=lease_id, holder="doomed", ttl_ms=30_000, wait_ms=0)
    before = coord.inspect("f")
    _inject_failing_insert(url)
    write_later = defer_journal(coord, url) if control else None
    try:
        if write_later is not None:  # a grant commits; its row in the log, written afterwards, fails
            coord.attempt("g", lease_id=new_lease_id(), holder="doomed", ttl_ms=30_000, wait_ms=0)
            with pytest.raises(psycopg.errors.CheckViolation):
                write_later()
            write_later.close()
            assert coord.inspect("g").last_token > 0
            return agreement(url, "g")
        else:
            with pytest.raises(BackendUnavailable):
                coord.release(lease_id)
        if not control:
            after = coord.inspect("f")  # still held: the release did not land
            assert (after.state, after.holder, after.token, after.last_token) == (
                before.state, before.holder, before.token, before.last_token)
            assert _kinds(url, "f") == [("grant", "doomed", granted.outcome.lease.token.value)]
            with pytest.raises(BackendUnavailable):  # a grant whose event fails is no grant
                coord.attempt("g", lease_id=new_lease_id(), holder="doomed", ttl_ms=30_000, wait_ms=0)
            assert coord.inspect("g").last_token == 0 and _kinds(url, "g") == []
        return agreement(url, "f")
    finally:
        coord.close()


@pytest.mark.parametrize("server_rules", [True, False], ids=["one-statement", "engine"])
def test_a_failing_history_insert_undoes_the_change(pg_coord_url, server_rules):
    assert _release_fails(pg_coord_url, server_rules=server_rules) == []


def test_control_a_failing_insert_after_the_commit_leaves_a_change_without_its_event(pg_coord_url, monkeypatch):
    from stockade.coordinators.postgres import _rows as _postgres_coord_rows

    monkeypatch.setattr(_postgres_coord_rows, "log_statements", _postgres_coord_rows.log_statements)
    assert _release_fails(pg_coord_url, server_rules=False, control=True) == ["nothing recorded"]


#: The server rules of schema version 3: those of 8, without the journal.
_RULES_3 = "\n".join(line for line in SERVER_RULES_8.splitlines() if "stockade_coord_journal" not in line)


def _release_and_cycle(url: str, held: str) -> int:
    """Under the current version: give back ``held`` (a lease of the old version), then one lock cycle; its token."""
    new = PostgresCoordinator(url)
    try:
        assert new.release(held).released
        lease_id = new_lease_id()
        token = new.attempt("m", lease_id=lease_id, holder="after", ttl_ms=30_000, wait_ms=0).outcome.lease.token.value
        new.release(lease_id)
    finally:
        new.close()
    with psycopg.connect(url, autocommit=True) as conn:
        version = conn.execute("SELECT v FROM stockade_coord_meta WHERE k = 'schema_version'").fetchone()[0]
    assert version == str(len(MIGRATIONS))
    return token


def _at_version(url: str, monkeypatch, migrations: tuple[str, ...]) -> tuple[str, int]:
    """Open a database at the version of ``migrations`` and grant ``m`` as a process of that version does."""
    monkeypatch.setattr(pg_module, "MIGRATIONS", migrations)
    monkeypatch.setattr(pg_module, "SCHEMA_VERSION", len(migrations))
    PostgresCoordinator(url).close()
    with psycopg.connect(url, autocommit=True) as conn:
        lease_id, token = grant_8(conn, "m")  # the function of that name, as that version's client calls it
    monkeypatch.undo()
    return lease_id, token


def test_a_database_of_schema_3_migrates(pg_coord_url, monkeypatch):
    """No journal at version 3: the held lease's grant was never recorded; its release and what follows are."""
    assert SERVER_RULES_8.count("stockade_coord_journal") == 2 and "stockade_coord_journal" not in _RULES_3
    held, old_token = _at_version(pg_coord_url, monkeypatch, (*MIGRATIONS_8[:2], _RULES_3))
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('stockade_coord_history')").fetchone()[0] is None
    token = _release_and_cycle(pg_coord_url, held)
    assert token > old_token
    assert [(kind, holder, value - old_token) for kind, holder, value in _kinds(pg_coord_url, "m")] == [
        ("release", "holder-8", 0), ("grant", "after", 1), ("release", "after", 1)]
    monkeypatch.setattr(pg_module, "SCHEMA_VERSION", 8)  # an older stockade refuses the newer tables
    with pytest.raises(BackendUnavailable, match=f"schema version {len(MIGRATIONS)},"):
        PostgresCoordinator(pg_coord_url)


def test_a_journal_of_schema_6_migrates_to_the_lease_log(pg_coord_url, monkeypatch):
    """Schema 6's journal (numbered per scope, trimmed at each event): its events stay, in order; new ones follow."""
    assert MIGRATIONS_8[6] == HISTORY_APPEND_ONLY
    held, old_token = _at_version(pg_coord_url, monkeypatch,
                                  (*MIGRATIONS_8[:3], SCHEMA_6_HISTORY + SERVER_RULES_8, *MIGRATIONS_8[4:6]))
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        assert conn.execute("SELECT n FROM stockade_coord_history").fetchall() == [(1,)]
    _release_and_cycle(pg_coord_url, held)
    assert [(kind, holder, value - old_token) for kind, holder, value in _kinds(pg_coord_url, "m")] == [
        ("grant", "holder-8", 0), ("release", "holder-8", 0), ("grant", "after", 1), ("release", "after", 1)]
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        tables = conn.execute("SELECT to_regclass('stockade_coord_history'), to_regclass('stockade_coord_leases'), "
                              "to_regclass('stockade_coord_log')").fetchone()
    assert tables == (None, None, "stockade_coord_log")


def _small_bounds(url: str, **bounds: int) -> None:
    """The same functions with small bounds (rows kept, a sweep every so many rows, sweeps per row)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(log_functions(**bounds) + server_rules(**bounds))


def test_the_journal_is_bounded_in_all_and_a_scope_reads_its_newest(pg_coord_url):
    """The same functions with a small bound (5 rows in all, a sweep every 4): the sweeps keep the newest 5."""
    coord = PostgresCoordinator(pg_coord_url)
    _small_bounds(pg_coord_url, rows_max=5, sweep_every=4)
    for scope in "abcdef":
        for _ in range(2):
            lease_id = new_lease_id()
            coord.attempt(scope, lease_id=lease_id, holder="h", ttl_ms=5_000, wait_ms=0)
            coord.release(lease_id)
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        seqs = [seq for seq, in conn.execute("SELECT seq FROM stockade_coord_log ORDER BY seq")]
    coord.close()
    assert seqs == [8, 9, 10, 11, 12]  # the sweep at 12 took everything up to 7
    assert [kind for kind, _, _ in _kinds(pg_coord_url, "f")] == ["grant", "release", "grant", "release"]
    assert [kind for kind, _, _ in _kinds(pg_coord_url, "d")] == ["grant", "release"]
    assert _kinds(pg_coord_url, "a") == []


def test_a_lease_held_past_the_bound_is_deleted_when_it_ends(pg_coord_url):
    """No sweep's range reaches a lease held while the bound's rows went past it: its end deletes it."""
    coord = PostgresCoordinator(pg_coord_url)
    _small_bounds(pg_coord_url, rows_max=5, sweep_every=4, sweep_windows=1)
    try:
        held = new_lease_id()
        coord.attempt("long", lease_id=held, holder="h", ttl_ms=60_000, wait_ms=0)
        for _ in range(16):
            lease_id = new_lease_id()
            coord.attempt("short", lease_id=lease_id, holder="h", ttl_ms=5_000, wait_ms=0)
            coord.release(lease_id)
        assert [kind for kind, _, _ in _kinds(pg_coord_url, "long")] == ["grant"]  # held: never swept
        assert coord.release(held).released
        assert _kinds(pg_coord_url, "long") == []
    finally:
        coord.close()


def _left_behind(url: str, *, sweep_every: int, sweep_windows: int = 4) -> list[int]:
    """Leases logged and ended directly, every third rolled back (its ``seq`` never used): what the trims miss."""
    PostgresCoordinator(url).close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(log_functions(rows_max=5, sweep_every=sweep_every, sweep_windows=sweep_windows))
        for i in range(1, 33):
            with contextlib.suppress(psycopg.errors.RaiseException), conn.transaction():
                conn.execute("SELECT stockade_coord_log_grant('w', %s, 'h', %s, 1, 0, 1)", (f"id{i}", i))
                conn.execute("SELECT stockade_coord_log_end('w', %s, 'release')", (f"id{i}",))
                if i % 3 == 0:
                    conn.execute("DO $$ BEGIN RAISE EXCEPTION 'rolled back'; END $$")
        rows = conn.execute("SELECT seq FROM stockade_coord_log ORDER BY seq").fetchall()
    newest = rows[-1][0]
    assert newest == 32  # 32 seq values used (every third by a rollback), the last one kept
    return [seq for seq, in rows if seq <= newest - 5]


def test_the_sweep_removes_what_a_rolled_back_sweep_leaves_behind(pg_coord_url):
    """The sweeps due at seq 12 and 24 roll back; the overlapping ranges of the others cover theirs."""
    assert _left_behind(pg_coord_url, sweep_every=4) == []


def test_control_sweeps_that_do_not_overlap_leave_events_behind(pg_coord_url):
    assert _left_behind(pg_coord_url, sweep_every=4, sweep_windows=1) == [4, 5, 7, 16, 17, 19]


def test_control_without_the_sweep_events_stay(pg_coord_url):
    assert len(_left_behind(pg_coord_url, sweep_every=1_000_000)) == 18


def test_the_cli_shows_the_history_of_a_postgres_coordinator(pg_coord_url, capsys):
    coord = stockade.connect(pg_coord_url)
    with coord.lock("web", ttl_ms=5_000) as lease:
        pass
    coord.close()
    assert cli_main(["history", "web", "--url", pg_coord_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1:4] for line in lines] == [["grant", "token", str(lease.token.value)],
                                                     ["release", "token", str(lease.token.value)]], lines
