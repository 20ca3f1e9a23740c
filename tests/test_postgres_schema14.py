"""Schema 14 of the PostgreSQL coordinator: the same rules for fewer of the server's instructions.

- **The lease log's checks** (`LOG_CHECKS_14`): its two ``CHECK`` constraints, prepared again for every
  statement that writes a row, became a domain on ``end_kind`` and ``NOT NULL`` on the lease's four
  columns. The same writes are refused as before, on a table of schema 13 and of 14 alike, with one
  difference written down: an *ended* row without its lease's columns (which only migration 9 made,
  from schema 8's history) is refused now, and the migration gives such rows ``''`` and ``0``.
  Control: migration 14 without the domain lets a row of an unknown kind in, and the comparison says so.
- **The meta values' row** (`META_STATE`): the functions read the four meta values from one row that a
  trigger keeps equal to the meta table. After each way the keys are written (the coordinator's upsert,
  its epoch update, its forgotten floor, an administrator's update, a delete, a truncate) the row equals
  the meta table; two transactions changing different keys at once both land. Control: with the
  trigger disabled the row falls behind, and the functions then answer from stale values.
- **Migration 13 -> 14 in use**: leases held by schema 13 are renewed and released by 14's functions,
  an ended row of schema 8's history gets its columns, and tokens keep rising; migration 13's text stays
  the one version 13 shipped.
"""

from __future__ import annotations

import hashlib
import threading

import psycopg
import pytest
from helpers.pg_upgrade import lease_carried_over

from stockade.coordinators import postgres as pg_module
from stockade.coordinators.postgres import PostgresCoordinator
from stockade.coordinators.postgres._journal import LOG_CHECKS_14
from stockade.coordinators.postgres._rows import META_STATE, MIGRATIONS, SERVER_RULES, SERVER_RULES_13, TIMELINE_KEY
from stockade.coordinators.sqlite import new_lease_id
from stockade.core.leases import Granted

#: The sha256 of migration 13's text as version 13 shipped it (a database that ran it must not see it change).
MIGRATION_13_SHA256 = "2248093a88d36003132c4c7c8a193c79441025cb3598a1be45a3013e65fe8578"
_COLUMNS = "(scope, lease_id, holder, token, ttl_ms, granted_ns, expires_ns, end_kind)"
#: Direct writes of the log, each on its own (the coordinator's role may write the table; nothing else may).
WRITES = {
    "held, complete": f"INSERT INTO stockade_coord_log {_COLUMNS} VALUES ('w', 'l1', 'h', 1, 1000, 1, 2, NULL)",
    "released, complete": f"INSERT INTO stockade_coord_log {_COLUMNS} VALUES ('w', 'l2', 'h', 2, 1000, 1, 2, "
                          "'release')",
    "expired, complete": f"INSERT INTO stockade_coord_log {_COLUMNS} VALUES ('w', 'l3', 'h', 3, 1000, 1, 2, 'expire')",
    "ended unrecorded": f"INSERT INTO stockade_coord_log {_COLUMNS} VALUES ('w', 'l4', 'h', 4, 1000, 1, 2, '')",
    "unknown kind": f"INSERT INTO stockade_coord_log {_COLUMNS} VALUES ('w', 'l5', 'h', 5, 1000, 1, 2, 'grant')",
    "held without id": f"INSERT INTO stockade_coord_log {_COLUMNS} VALUES ('w', NULL, 'h', 6, 1000, 1, 2, NULL)",
    "held without ttl": f"INSERT INTO stockade_coord_log {_COLUMNS} VALUES ('w', 'l7', 'h', 7, NULL, 1, 2, NULL)",
    "held without times": f"INSERT INTO stockade_coord_log {_COLUMNS} VALUES ('w', 'l8', 'h', 8, 1000, NULL, NULL, "
                          "NULL)",
    "ended without id": f"INSERT INTO stockade_coord_log {_COLUMNS} VALUES ('w', NULL, 'h', 9, NULL, NULL, NULL, "
                        "'release')",
    "a held row's deadline cleared": "UPDATE stockade_coord_log SET expires_ns = NULL WHERE end_kind IS NULL",
    "a held row ended": "UPDATE stockade_coord_log SET end_kind = 'release' WHERE end_kind IS NULL",
    "an ended row of an unknown kind": "UPDATE stockade_coord_log SET end_kind = 'lost' WHERE end_kind IS NOT NULL",
}
#: What schema 14 refuses that 13 let in: an ended row without its lease's columns (module docstring).
STRICTER = {"ended without id"}
_META_READ = ("SELECT max(v::bigint) FILTER (WHERE k = %s), max(v::bigint) FILTER (WHERE k = 'timeline_offset'), "
              "max(v::bigint) FILTER (WHERE k = 'epoch'), max(v::bigint) FILTER (WHERE k = 'forgotten_floor') "
              "FROM stockade_coord_meta")
_STATE_READ = "SELECT timeline, timeline_offset, epoch, forgotten_floor FROM stockade_coord_state"


def test_migration_13_is_the_text_version_13_shipped():
    assert hashlib.sha256(MIGRATIONS[12].encode()).hexdigest() == MIGRATION_13_SHA256
    assert MIGRATIONS[12] == SERVER_RULES_13 and MIGRATIONS[13] == LOG_CHECKS_14 + META_STATE + SERVER_RULES
    assert "stockade_coord_state" not in SERVER_RULES_13 and "stockade_coord_state AS m" in SERVER_RULES


def _install(url: str, monkeypatch: pytest.MonkeyPatch, migrations: tuple[str, ...]) -> None:
    monkeypatch.setattr(pg_module, "MIGRATIONS", migrations)
    monkeypatch.setattr(pg_module, "SCHEMA_VERSION", len(migrations))
    PostgresCoordinator(url).close()
    monkeypatch.undo()


def _refused(url: str) -> set[str]:
    """The `WRITES` the log refuses, each tried on the installed tables with one held row and one ended row."""
    refused = set()
    with psycopg.connect(url, autocommit=True) as conn:
        for name, statement in WRITES.items():
            conn.execute("BEGIN")
            conn.execute(WRITES["held, complete"])
            conn.execute(WRITES["released, complete"])
            try:
                conn.execute(statement)
            except (psycopg.errors.CheckViolation, psycopg.errors.NotNullViolation):
                refused.add(name)
            conn.execute("ROLLBACK")
    return refused


def test_the_log_refuses_what_schema_13_refused(pg_coord_url, monkeypatch):
    _install(pg_coord_url, monkeypatch, MIGRATIONS[:13])
    before = _refused(pg_coord_url)
    PostgresCoordinator(pg_coord_url).close()  # migrated to 14
    after = _refused(pg_coord_url)
    assert before == {"unknown kind", "held without id", "held without ttl", "held without times",
                      "a held row's deadline cleared", "an ended row of an unknown kind"}
    assert after == before | STRICTER
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        checks = conn.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = 'stockade_coord_log'::regclass "
                              "AND contype = 'c'").fetchone()[0]
    assert checks == 0  # nothing left for a write to prepare


def test_control_a_migration_without_the_domain_lets_an_unknown_kind_in(pg_coord_url, monkeypatch):
    domain = "CREATE DOMAIN stockade_coord_end_kind AS text CHECK (VALUE IN ('release', 'expire', ''));"
    assert domain in LOG_CHECKS_14
    lax = LOG_CHECKS_14.replace(domain, "CREATE DOMAIN stockade_coord_end_kind AS text;")
    _install(pg_coord_url, monkeypatch, (*MIGRATIONS[:13], lax + META_STATE + SERVER_RULES))
    assert {"unknown kind", "an ended row of an unknown kind"}.isdisjoint(_refused(pg_coord_url))


def _meta_and_state(conn: psycopg.Connection) -> tuple[tuple[object, ...], tuple[object, ...]]:
    return conn.execute(_META_READ, (TIMELINE_KEY,)).fetchone(), conn.execute(_STATE_READ).fetchone()


def _write_the_meta_every_way(url: str) -> list[str]:
    """The meta keys written every way there is, one transaction each; after which ones the row differed."""
    coord = PostgresCoordinator(url)
    try:
        coord.attempt("s", lease_id=new_lease_id(), holder="h", ttl_ms=60_000, wait_ms=0)
        with coord.records.write("s") as tx:
            tx.new_epoch(tx.epoch)  # the engine's epoch update (a scope's counter ran out)
    finally:
        coord.close()
    writes = [
        "INSERT INTO stockade_coord_meta (k, v) VALUES ('forgotten_floor', '77') ON CONFLICT (k) "
        "DO UPDATE SET v = GREATEST(stockade_coord_meta.v::bigint, excluded.v::bigint)::text",  # a forget's floor
        "UPDATE stockade_coord_meta SET v = (v::bigint + 3)::text WHERE k = 'timeline_offset'",  # an administrator
        "DELETE FROM stockade_coord_meta WHERE k = 'forgotten_floor'",
        "INSERT INTO stockade_coord_meta (k, v) VALUES ('forgotten_floor', '5')",
        f"UPDATE stockade_coord_meta SET k = 'renamed' WHERE k = '{TIMELINE_KEY}'",
        f"UPDATE stockade_coord_meta SET k = '{TIMELINE_KEY}' WHERE k = 'renamed'",
        "UPDATE stockade_coord_meta SET v = v WHERE k = 'cluster_id'",  # another key: nothing to follow
        "TRUNCATE stockade_coord_meta",
    ]
    differed = []
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in ["SELECT 1", *writes]:
            conn.execute(statement)
            meta, state = _meta_and_state(conn)
            if meta != state:
                differed.append(statement)
    return differed


def test_the_state_row_follows_every_write_of_the_meta_table(pg_coord_url):
    assert _write_the_meta_every_way(pg_coord_url) == []


def test_control_without_the_trigger_the_row_falls_behind(pg_coord_url):
    PostgresCoordinator(pg_coord_url).close()
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE stockade_coord_meta DISABLE TRIGGER stockade_coord_state_of_meta")
    assert len(_write_the_meta_every_way(pg_coord_url)) >= 5


def test_two_transactions_changing_different_keys_at_once_both_land(pg_coord_url):
    PostgresCoordinator(pg_coord_url).close()
    with psycopg.connect(pg_coord_url, autocommit=True) as first, psycopg.connect(pg_coord_url) as second:
        first.execute("BEGIN")
        first.execute("UPDATE stockade_coord_meta SET v = (v::bigint + 1)::text WHERE k = 'epoch'")
        done = threading.Event()
        pid = second.info.backend_pid

        def other() -> None:  # waits for the first's row of the state, then sets its own column on the latest
            second.execute("INSERT INTO stockade_coord_meta (k, v) VALUES ('forgotten_floor', '99')")
            done.set()
            second.commit()

        thread = threading.Thread(target=other)
        thread.start()
        with psycopg.connect(pg_coord_url, autocommit=True) as watcher:  # until the second waits for a lock
            while watcher.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                  (pid,)).fetchone()[0] != "Lock":
                assert not done.is_set() and thread.is_alive()
        first.execute("COMMIT")
        thread.join(60)
        assert done.is_set()
        meta, state = _meta_and_state(first)
    assert meta == state and state[3] == 99


def test_control_a_stale_row_is_what_the_functions_answer_from(pg_coord_url):
    """With the trigger off, the grant reads an epoch below the meta table's: the row is what they read."""
    PostgresCoordinator(pg_coord_url).close()
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE stockade_coord_meta DISABLE TRIGGER stockade_coord_state_of_meta")
        conn.execute("UPDATE stockade_coord_meta SET v = (v::bigint + 1)::text WHERE k = 'epoch'")
        epoch = int(conn.execute("SELECT v FROM stockade_coord_meta WHERE k = 'epoch'").fetchone()[0])
    coord = PostgresCoordinator(pg_coord_url)
    try:
        granted = coord.attempt("s", lease_id=new_lease_id(), holder="h", ttl_ms=60_000, wait_ms=0).outcome
    finally:
        coord.close()
    assert isinstance(granted, Granted) and granted.lease.token.value < epoch << 22


def test_a_missing_state_row_sends_the_grant_and_release_to_the_engine(pg_coord_url):
    PostgresCoordinator(pg_coord_url).close()
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        conn.execute("DELETE FROM stockade_coord_state")
    coord = PostgresCoordinator(pg_coord_url)
    try:
        assert coord.records.call(pg_module._GRANT, ("s", new_lease_id(), "h", 60_000, 1_000)) is None
        granted = coord.attempt("s", lease_id=new_lease_id(), holder="h", ttl_ms=60_000, wait_ms=0).outcome
        assert isinstance(granted, Granted)  # by the engine, which reads the meta table
        assert coord.records.call(pg_module._KEEP, (granted.lease.lease_id, True)) is None
        assert coord.release(granted.lease.lease_id).released
    finally:
        coord.close()


def test_migration_13_to_14_in_use(pg_coord_url, monkeypatch):
    _install(pg_coord_url, monkeypatch, MIGRATIONS[:13])
    monkeypatch.setattr(pg_module, "MIGRATIONS", MIGRATIONS[:13])
    monkeypatch.setattr(pg_module, "SCHEMA_VERSION", 13)
    old = PostgresCoordinator(pg_coord_url)
    try:
        held = old.attempt("held", lease_id=new_lease_id(), holder="old", ttl_ms=60_000, wait_ms=0).outcome
        ended = old.attempt("ended", lease_id=new_lease_id(), holder="old", ttl_ms=60_000, wait_ms=0).outcome
        assert isinstance(held, Granted) and isinstance(ended, Granted)
        assert old.release(ended.lease.lease_id).released
    finally:
        old.close()
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:  # a row of schema 8's history (migration 9)
        conn.execute("INSERT INTO stockade_coord_log (scope, holder, token, end_kind, end_ms) "
                     "VALUES ('legacy', 'eight', 3, 'release', 1)")
        history = conn.execute("SELECT seq, scope, holder, token, grant_ms, end_kind, end_ms FROM stockade_coord_log "
                               "ORDER BY seq").fetchall()
    monkeypatch.undo()
    lease_carried_over(pg_coord_url, held)
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        after = conn.execute("SELECT seq, scope, holder, token, grant_ms, end_kind, end_ms FROM stockade_coord_log "
                             "ORDER BY seq").fetchall()
        legacy = conn.execute("SELECT lease_id, ttl_ms, granted_ns, expires_ns FROM stockade_coord_log "
                              "WHERE scope = 'legacy'").fetchone()
        version = conn.execute("SELECT v FROM stockade_coord_meta WHERE k = 'schema_version'").fetchone()[0]
        meta, state = _meta_and_state(conn)
    assert [row for row in after if row[1] != "held"] == [row for row in history if row[1] != "held"]
    assert legacy == ("", 0, 0, 0) and version == str(len(MIGRATIONS)) == "14" and meta == state
