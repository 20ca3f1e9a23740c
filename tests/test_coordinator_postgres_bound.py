"""The bound on held leases on PostgreSQL, and what checking it costs a grant.

Every grant of a free scope checks that fewer than ``leases_max`` leases are
stored. It used to count the lease table on every grant: a scan of every lease
held, up to 100,000 rows, so a lock cycle took 1.9 ms with no other lease held
and 5.6 ms with 20,000 held. A held lease is one scope's, and the scope table's
size bounds its rows (a heap page holds at most ``(block_size - 24) / 28``), so
the count (of the lease log's held rows, schema 9) runs only when there could
be as many scopes as the bound. Checked on a real PostgreSQL 15, by the rows the
check reads (``pg_stat_xact_user_tables``), never by time.
"""

from __future__ import annotations

import psycopg
import pytest
from helpers.pg_schema8 import grant_8

from stockade.coordinators import postgres as pg_module
from stockade.coordinators.postgres import PostgresCoordinator
from stockade.coordinators.postgres._rows import RULE_NAMES, leases_at_least
from stockade.coordinators.postgres._schema8 import HISTORY_SCHEMA, MIGRATIONS_8, SERVER_RULES_8, leases_at_least_8
from stockade.coordinators.sqlite import new_lease_id
from stockade.core.errors import LimitExceeded
from stockade.core.leases import TimedOut
from stockade.core.limits import LEASES_MAX

#: The check before this change, for the control.
_COUNT_ALWAYS = ("(SELECT count(*) FROM (SELECT 1 FROM stockade_coord_log WHERE end_kind IS NULL LIMIT {n}) AS n) "
                 ">= {n}")
#: The check of schema 4 (on its lease table), for the control of the migration.
_COUNT_ALWAYS_4 = "(SELECT count(*) FROM (SELECT 1 FROM stockade_coord_leases LIMIT {n}) AS n) >= {n}"
#: The check of schema 5 on the lease log, for the control: the heap's size alone (the log grows with churn).
_HEAP_ONLY = ("CASE WHEN (SELECT pg_relation_size('stockade_coord_log') / b * ((b - 24) / 28) FROM "
              "(SELECT current_setting('block_size')::bigint AS b) AS bs) < {n} THEN false ELSE "
              "(SELECT count(*) FROM (SELECT 1 FROM stockade_coord_log WHERE end_kind IS NULL LIMIT {n}) AS n) "
              ">= {n} END")


def _grant(coord: PostgresCoordinator, scope: str) -> str:
    lease_id = new_lease_id()
    coord.attempt(scope, lease_id=lease_id, holder="h", ttl_ms=60_000, wait_ms=0)
    return lease_id


def _rows_read(url: str, check: str, n: int) -> tuple[bool, int]:
    """The check's answer for ``n``, and how many lease rows it read (this transaction's own statistics)."""
    with psycopg.connect(url) as conn:
        answer = conn.execute(f"SELECT {check}".replace("%s", str(n))).fetchone()[0]
        read = conn.execute("SELECT COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0) "
                            "FROM pg_stat_xact_user_tables WHERE relname = 'stockade_coord_log'").fetchone()[0]
        conn.rollback()
    return bool(answer), int(read)


def test_the_bound_holds_on_both_paths(pg_coord_url):
    coord = PostgresCoordinator(pg_coord_url)
    try:
        coord.leases_max = 3
        held = [_grant(coord, f"s{i}") for i in range(3)]
        with pytest.raises(LimitExceeded):  # the grant function refuses, then the engine raises
            _grant(coord, "s3")
        coord.release(held[0])
        _grant(coord, "s3")  # room again
        with pytest.raises(LimitExceeded):
            _grant(coord, "s4")
    finally:
        coord.close()


def test_a_grant_counts_no_table_that_cannot_hold_the_bound(pg_coord_url):
    coord = PostgresCoordinator(pg_coord_url)
    try:
        for i in range(200):
            _grant(coord, f"s{i}")
    finally:
        coord.close()
    check = leases_at_least("%s")
    assert _rows_read(pg_coord_url, check, LEASES_MAX) == (False, 0)  # 200 rows fill a page or two: no count
    assert _rows_read(pg_coord_url, check, 200)[0] is True  # a table that could be full is counted
    assert _rows_read(pg_coord_url, check, 201)[0] is False
    # Control: the check as it was reads every lease on every grant.
    assert _rows_read(pg_coord_url, _COUNT_ALWAYS.format(n="%s"), LEASES_MAX) == (False, 200)


def test_a_database_of_schema_4_migrates_with_its_leases(pg_coord_url, monkeypatch):
    rules_4 = SERVER_RULES_8.replace(leases_at_least_8("p_leases_max"), _COUNT_ALWAYS_4.format(n="p_leases_max"))
    assert rules_4 != SERVER_RULES_8 and "pg_relation_size" not in rules_4
    monkeypatch.setattr(pg_module, "MIGRATIONS", (*MIGRATIONS_8[:3], HISTORY_SCHEMA + rules_4))
    monkeypatch.setattr(pg_module, "SCHEMA_VERSION", 4)
    PostgresCoordinator(pg_coord_url).close()
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        held, _ = grant_8(conn, "m")  # as a process of schema 4 grants (the function of that name)
    monkeypatch.undo()
    new = PostgresCoordinator(pg_coord_url)
    try:
        with psycopg.connect(pg_coord_url, autocommit=True) as conn:
            version = conn.execute("SELECT v FROM stockade_coord_meta WHERE k = 'schema_version'").fetchone()[0]
            assert version == str(pg_module.SCHEMA_VERSION)
            grant = conn.execute("SELECT pg_get_functiondef(%s::regproc)", (RULE_NAMES[0],)).fetchone()[0]
        assert "pg_relation_size" in grant and "stockade_coord_scopes_pkey" in grant  # schema 9's check
        # the lease granted under schema 4 is still held
        assert isinstance(new.attempt("m", lease_id=new_lease_id(), holder="h", ttl_ms=60_000, wait_ms=0).outcome,
                          TimedOut)
        assert new.release(held).released
    finally:
        new.close()


def test_a_grant_counts_no_table_grown_by_churn_alone(pg_coord_url):
    """Lock cycles on a few scopes grow the lease log (each grant a new row); the scope table's primary
    key stays small, and the check reads no lease row."""
    coord = PostgresCoordinator(pg_coord_url)
    try:
        with psycopg.connect(pg_coord_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE stockade_coord_log SET (autovacuum_enabled = false)")  # as between vacuums
        for i in range(1200):  # the log: one row a cycle
            coord.release(_grant(coord, f"churn{i % 4}"))
        held = _grant(coord, "held")
    finally:
        coord.close()
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        heap_pages, key_pages = conn.execute(
            "SELECT pg_relation_size('stockade_coord_log') / 8192, "
            "pg_relation_size('stockade_coord_scopes_pkey') / 8192").fetchone()
    assert heap_pages >= 4 and key_pages <= 2, (heap_pages, key_pages)
    bound = 1000  # above what 2 key pages can hold (814), below what 4 heap pages of the log can (1160)
    assert _rows_read(pg_coord_url, leases_at_least("%s"), bound) == (False, 0)
    # Control: judged by the log's heap alone (as schema 5 judged its lease table), the same check reads the log.
    answer, read = _rows_read(pg_coord_url, _HEAP_ONLY.format(n="%s"), bound)
    assert answer is False and read >= 1, read
    assert held
