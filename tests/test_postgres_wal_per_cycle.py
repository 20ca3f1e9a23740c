"""What a lock cycle writes to PostgreSQL's WAL, counted record by record (docs/coordinator-postgres.md, "Cost").

A lock cycle through the client (`acquire` with ``keepalive=False``, then
`release`: the two one-statement server rules) writes an exact set of WAL
records, the same on every machine: the count does not depend on how busy the
host is, unlike a time. The test reads them with ``pg_walinspect`` (shipped with
PostgreSQL 15), keeps the records of the transactions that wrote this
database's own tables, and holds the count per cycle to the table in the docs and
to the budget (`WAL_RECORDS_PER_CYCLE_MAX`), so that a change that writes more per
cycle (an index, a row, a lock) is seen and written down. The same for the lease
row the side by side compares with.

Controls: schema version 8's layout (a lease row with three indexes inserted and
deleted, two events with two indexes each) writes 14 records a cycle, over the
budget, and a database of schema 8 migrates to the lease log's 8; one index
more on the log is counted; an index on a column the release writes (a partial
index on the held leases, the obvious way to count them) makes the release's
in-place update a full one, over the budget.

A full log: once the log holds its bound, every grant's sweep deletes about one old row a cycle
(a sweep every `SWEEP_EVERY` rows deletes that many). Counted with small bounds (a sweep every 20 rows,
each deleting 20): one delete record a row, so a cycle is 9 records there. Control: schema 9 to 11's
sweep, which locked each row first (``FOR UPDATE SKIP LOCKED``), wrote a lock record a row more: 10,
over the budget.
"""

from __future__ import annotations

import uuid
from collections import Counter

import psycopg
import pytest
from helpers.pg_schema8 import cycle_8, install_schema_8

import stockade
from stockade.coordinators.postgres._journal import log_functions
from stockade.coordinators.postgres._rows import server_rules
from stockade.testing.budgets import BUDGETS, over_budget

CYCLES = 100
WARM_UP = 20

#: The budget of a lock cycle on the PostgreSQL coordinator, in WAL records, where every budget is
#: (stockade.testing.budgets; schema version 8 wrote 14). A change that writes more raises it there, with
#: the figure, or is undone.
WAL_RECORDS_PER_CYCLE_MAX = BUDGETS["postgres.lock_cycle"]["wal_records"]

#: Per lock cycle, by record type (docs/coordinator-postgres.md, "Cost", the WAL table).
STOCKADE_CYCLE = {
    "Heap/INSERT": 1,  # the lease's row in the log (its grant event)
    "Btree/INSERT_LEAF": 3,  # the log's three indexes: seq, (scope, seq), lease_id
    "Heap/HOT_UPDATE": 2,  # the scope row's last token; the lease's row ended in place (its release event)
    "Transaction/COMMIT": 2,
}
#: Schema version 8's cycle (`helpers.pg_schema8.cycle_8`): the control over the budget.
SCHEMA_8_CYCLE = {
    "Heap/INSERT": 3,  # the lease row, two events
    "Btree/INSERT_LEAF": 7,  # the lease's three indexes, each event's two
    "Heap/HOT_UPDATE": 1,  # the scope row's last token
    "Heap/DELETE": 1,  # the lease row, at the release
    "Transaction/COMMIT": 2,
}
LEASE_ROW_CYCLE = {
    "Heap/INSERT": 1,
    "Heap/HEAP_CONFIRM": 1,  # the upsert's speculative insert, confirmed
    "Btree/INSERT_LEAF": 1,
    "Heap/DELETE": 1,
    "Transaction/COMMIT": 2,
}
#: Records that come now and then, not with every cycle (a split's downlink, a full leaf's deduplication, pruning,
#: a sequence's log-ahead).
OCCASIONAL = ("Btree/INSERT_UPPER", "Btree/NEWROOT", "Btree/DEDUP", "Heap2/", "Sequence/", "Standby/", "XLOG/")

#: A record that does the same for this count: a heap insert that starts a page, a leaf insert that splits one.
_SAME = {"Heap/INSERT+INIT": "Heap/INSERT", "Btree/SPLIT_L": "Btree/INSERT_LEAF", "Btree/SPLIT_R": "Btree/INSERT_LEAF"}

_LEASE_ROW = """
CREATE SEQUENCE IF NOT EXISTS fence_seq;
CREATE TABLE IF NOT EXISTS lock_lease (name text PRIMARY KEY, holder text NOT NULL, token bigint NOT NULL,
                                       expires_at timestamptz NOT NULL)
"""
_LEASE_ROW_GRANT = ("INSERT INTO lock_lease (name, holder, token, expires_at) "
                    "VALUES (%s, %s, nextval('fence_seq'), now() + interval '10 seconds') "
                    "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, token = excluded.token, "
                    "expires_at = excluded.expires_at WHERE lock_lease.expires_at < now() RETURNING token")


def _per_cycle(conn: psycopg.Connection, start: str, end: str) -> dict[str, float]:
    """The records between two LSNs of the transactions that wrote this database's own tables, by type, per cycle.

    A transaction of the server's (an automatic analyze writes the catalogs of this
    database) is not counted, nor a record without a transaction (a vacuum's).
    """
    db, files = conn.execute(
        "SELECT (SELECT oid FROM pg_database WHERE datname = current_database()), "
        "string_agg(pg_relation_filenode(oid)::text, '|') FROM pg_class "
        "WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'i', 'S')").fetchone()
    rows = conn.execute(
        "WITH r AS (SELECT xid, resource_manager || '/' || record_type AS kind, block_ref "
        "FROM pg_get_wal_records_info(%s, %s)) "
        "SELECT kind, count(*) FROM r WHERE xid IN (SELECT xid FROM r WHERE xid <> '0' AND block_ref ~ %s) "
        "GROUP BY kind", (start, end, f"rel [0-9]+/{db}/({files}) ")).fetchall()
    counts: Counter[str] = Counter()
    for kind, n in rows:
        if not kind.startswith(OCCASIONAL):
            counts[_SAME.get(kind, kind)] += n
    return {kind: round(n / CYCLES, 2) for kind, n in counts.items()}


def _measure(url: str, cycle) -> dict[str, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        for _ in range(WARM_UP):
            cycle()
        start = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        for n in range(CYCLES):
            cycle()
            if n == CYCLES // 2:
                conn.execute("ANALYZE")  # as the server's automatic analyze may: its writes are not the cycles'
        end = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        flush_wal(conn)  # the last release did not wait for its flush (docs/coordinator-postgres.md)
        return _per_cycle(conn, str(start), str(end))


def flush_wal(conn: psycopg.Connection) -> None:
    """Commit a write that waits for its WAL flush: the WAL before it is on disk when this returns (WAL is in order)."""
    conn.execute("CREATE TABLE IF NOT EXISTS wal_flush (n int)")
    conn.execute("INSERT INTO wal_flush VALUES (1)")


def within_budget(counts: dict[str, float]) -> None:
    """Refuse a cycle that writes more WAL records than `WAL_RECORDS_PER_CYCLE_MAX`, with the figure."""
    total = sum(counts.values())
    over = over_budget("postgres.lock_cycle", {"wal_records": total})
    assert not over, f"a lock cycle writes {total:g} WAL records ({counts}): {over[0]}"


def _stockade_cycles(url: str) -> dict[str, float]:
    coord = stockade.connect(url)
    try:
        return _measure(url, lambda: coord.acquire("wal", ttl_ms=10_000, keepalive=False).release())
    finally:
        coord.close()


def test_a_lock_cycle_writes_the_records_the_docs_count_within_the_budget(pg_coord_url):
    got = _stockade_cycles(pg_coord_url)
    assert got == STOCKADE_CYCLE
    within_budget(got)


def test_the_lease_row_cycle_writes_the_records_the_docs_count(pg_coord_url):
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        conn.execute(_LEASE_ROW)
        holder = uuid.uuid4().hex

        def cycle() -> None:
            token = conn.execute(_LEASE_ROW_GRANT, ("wal", holder)).fetchone()[0]
            conn.execute("DELETE FROM lock_lease WHERE name = %s AND token = %s", ("wal", token))

        assert _measure(pg_coord_url, cycle) == LEASE_ROW_CYCLE


def test_control_schema_8_is_over_the_budget_and_migrates_under_it(pg_coord_url, monkeypatch):
    install_schema_8(pg_coord_url, monkeypatch)
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        tokens = []
        got = _measure(pg_coord_url, lambda: tokens.append(cycle_8(conn, "wal")))
    assert got == SCHEMA_8_CYCLE
    with pytest.raises(AssertionError, match="writes 14 WAL records .* over its budget of 9"):
        within_budget(got)
    assert _stockade_cycles(pg_coord_url) == STOCKADE_CYCLE  # migration 9: the lease log
    assert _one_grant(pg_coord_url, "wal") > max(tokens)  # a used scope's tokens go on
    assert _one_grant(pg_coord_url, "a-new-scope") > 0  # a new scope's row is inserted


def test_control_one_index_more_is_counted(pg_coord_url):
    stockade.connect(pg_coord_url).close()  # the tables
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        conn.execute("CREATE INDEX stockade_coord_log_holder ON stockade_coord_log (holder)")
    got = _stockade_cycles(pg_coord_url)
    assert got == {**STOCKADE_CYCLE, "Btree/INSERT_LEAF": STOCKADE_CYCLE["Btree/INSERT_LEAF"] + 1}


def test_control_an_index_on_what_the_release_writes_is_over_the_budget(pg_coord_url):
    stockade.connect(pg_coord_url).close()  # the tables
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        conn.execute("CREATE INDEX stockade_coord_log_held ON stockade_coord_log (scope) WHERE end_kind IS NULL")
    got = _stockade_cycles(pg_coord_url)
    assert got["Heap/HOT_UPDATE"] == 1 and got["Heap/UPDATE"] == 1  # the release is a full update now
    with pytest.raises(AssertionError, match="over its budget of 9"):
        within_budget(got)


def _one_grant(url: str, scope: str) -> int:
    coord = stockade.connect(url)
    try:
        lease = coord.acquire(scope, ttl_ms=10_000, keepalive=False)
        lease.release()
        return lease.token.value
    finally:
        coord.close()


#: Small bounds for the sweep: 5 rows kept, a sweep every 20 rows, each over the 20 rows below the bound.
SWEPT = {"rows_max": 5, "sweep_every": 20, "sweep_windows": 1}


def _swept_cycles(url: str, *, lock_rows: bool) -> dict[str, float]:
    stockade.connect(url).close()  # the tables
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(log_functions(lock_rows=lock_rows, **SWEPT) + server_rules(lock_rows=lock_rows, **SWEPT))
    return _stockade_cycles(url)


def test_a_full_logs_sweep_deletes_each_row_with_one_record(pg_coord_url):
    got = _swept_cycles(pg_coord_url, lock_rows=False)
    assert got == {**STOCKADE_CYCLE, "Heap/DELETE": 1}  # 100 cycles, 5 sweeps of 20 ended rows
    within_budget(got)


def test_control_a_sweep_that_locks_each_row_first_writes_a_record_more_a_row(pg_coord_url):
    got = _swept_cycles(pg_coord_url, lock_rows=True)
    assert got == {**STOCKADE_CYCLE, "Heap/DELETE": 1, "Heap/LOCK": 1}
    with pytest.raises(AssertionError, match="writes 10 WAL records .* over its budget of 9"):
        within_budget(got)
