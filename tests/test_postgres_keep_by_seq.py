"""A release on the PostgreSQL coordinator reads its lease's row, not its scope's history (schema 11).

The one-statement release and renewal (`stockade.coordinators.postgres._rows.SERVER_RULES`) find the
lease's row in the lease log. Schemas 9 and 10 wrote it ``WHERE lease_id = ... AND scope = ...``, and
the planner read that as the AND of both indexes' bitmaps: the scope's bitmap is every row of the
scope's history (up to ``LOG_ROWS_MAX``), so on a scope used over and over each release read its whole
history, and a lock cycle got slower the longer a scope was used. Since 11 the row is found by its
primary key, as the read before the lock found it (`KEEP_BY_SEQ`).

Counted, not timed: the index entries the lease log's indexes return (``pg_stat_user_indexes``) over
`CYCLES` cycles on one scope that already has `HISTORY` rows. Control: schema 10's functions
(`SERVER_RULES_10`) read at least the scope's history on every release.

- **Migration 10 -> 11 with a lease held**: the lease granted by schema 10's function is released
  by 11's; migration 10's text stays the one version 10 shipped.
"""

from __future__ import annotations

import hashlib

import psycopg
from helpers.pg_upgrade import lease_carried_over

from stockade.coordinators import postgres as pg_module
from stockade.coordinators.postgres import PostgresCoordinator
from stockade.coordinators.postgres._rows import MIGRATIONS, RULE_NAMES, SERVER_RULES, SERVER_RULES_10, SERVER_RULES_11
from stockade.coordinators.sqlite import new_lease_id
from stockade.core.leases import Granted

HISTORY = 2_000
CYCLES = 20
#: Index entries a cycle may read: the grant's newest row of the scope, the release's row by lease id and by seq.
ENTRIES_PER_CYCLE_MAX = 10

#: The sha256 of migration 10's text as version 10 shipped it (a database that ran it must not see it change).
MIGRATION_10_SHA256 = "c0043d65fb919d76fb5774267b97e0d8dee7518cc1b88f4c21c411c70b757311"


def test_migration_10_is_the_text_version_10_shipped():
    assert hashlib.sha256(MIGRATIONS[9].encode()).hexdigest() == MIGRATION_10_SHA256
    assert MIGRATIONS[10] == SERVER_RULES_11 and "l.seq = v_held" in SERVER_RULES_11 and "v_held" not in MIGRATIONS[9]
    assert "l.seq = v_held" in SERVER_RULES  # and in every later version


def _cycle(conn: psycopg.Connection, scope: str) -> None:
    lease_id = new_lease_id()
    granted = conn.execute(f"SELECT token FROM {RULE_NAMES[0]}(%s, %s, 'h', 60000, 100000)", (scope, lease_id))
    assert granted.fetchone() is not None
    released = conn.execute(f"SELECT scope FROM {RULE_NAMES[1]}(%s, true)", (lease_id,)).fetchone()
    assert released is not None and released[0] == scope


def _entries_read(url: str, rules: str | None) -> float:
    """Index entries of the lease log read per cycle, after `HISTORY` cycles on the scope (a new session then,
    as a client that connects to a scope already in use: its functions' plans are made on the log as it is)."""
    PostgresCoordinator(url).close()  # the tables, at this version
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE stockade_coord_log SET (autovacuum_enabled = false)")  # the same statistics
        if rules is not None:
            conn.execute(rules)
        for _ in range(HISTORY):
            _cycle(conn, "s")
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT 1")  # its counts flushed before the baseline is read
    count = "SELECT sum(idx_tup_read) FROM pg_stat_user_indexes WHERE relname = 'stockade_coord_log'"
    with psycopg.connect(url, autocommit=True) as conn, psycopg.connect(url, autocommit=True) as reader:
        reader.execute("SET stats_fetch_consistency = none")
        before = int(reader.execute(count).fetchone()[0])
        for _ in range(CYCLES):
            _cycle(conn, "s")
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT 1")  # a transaction's end flushes this backend's counts
        return (int(reader.execute(count).fetchone()[0]) - before) / CYCLES


def test_a_release_reads_its_row_not_its_scopes_history(pg_coord_url):
    assert _entries_read(pg_coord_url, None) <= ENTRIES_PER_CYCLE_MAX


def test_control_schema_10_reads_the_scopes_history(pg_coord_url):
    assert _entries_read(pg_coord_url, SERVER_RULES_10) >= HISTORY


def test_migration_10_to_11_keeps_a_held_lease(pg_coord_url, monkeypatch):
    monkeypatch.setattr(pg_module, "MIGRATIONS", MIGRATIONS[:10])
    monkeypatch.setattr(pg_module, "SCHEMA_VERSION", 10)
    old = PostgresCoordinator(pg_coord_url)
    try:
        held = old.attempt("held", lease_id=new_lease_id(), holder="old", ttl_ms=60_000, wait_ms=0).outcome
        assert isinstance(held, Granted)
    finally:
        old.close()
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        body = conn.execute("SELECT pg_get_functiondef(%s::regproc)", (RULE_NAMES[1],)).fetchone()[0]
    assert "v_held" not in body
    monkeypatch.undo()
    lease_carried_over(pg_coord_url, held)
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        meta = dict(conn.execute("SELECT k, v FROM stockade_coord_meta").fetchall())
        body = conn.execute("SELECT pg_get_functiondef(%s::regproc)", (RULE_NAMES[1],)).fetchone()[0]
    assert meta["schema_version"] == str(len(MIGRATIONS)) and "v_held" in body
