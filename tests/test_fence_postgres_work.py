"""The PostgreSQL fence's work per transaction, as counts, against the budget ``postgres.fenced_write``.

One fenced transaction of the benchmark's shape (benchmarks/fence_postgres.py:
`fenced` on an idle autocommit connection, a one-row upsert of a row that
exists, the commit) beside the same transaction unfenced (``conn.transaction()``):

- **Round trips**: each is one wait of psycopg's connection for the server's
  answer (`_counted_waits`). `fenced` sends ``BEGIN`` and the check in one
  query, so it makes as many as the plain transaction (``BEGIN``, the upsert,
  ``COMMIT``: 3). Control: the check sent in a transaction begun apart (the
  path `fenced` takes inside a transaction the caller opened) makes one more.
- **WAL records** of the transaction (read with ``pg_walinspect`` as
  tests/test_postgres_wal_per_cycle.py reads them): the check's locks write
  nothing, and an equal token does not write the mark, so the fenced
  transaction writes what the plain one writes. Control: under REPEATABLE READ
  the check locks the mark's row FOR SHARE (docs/fence-postgres.md, "Read as
  committed"), one record more, over the budget.
- **Calls** of the client (Python and C functions on this thread, ``sys.setprofile``;
  `_counted_calls`): the fence's own few beyond the plain transaction's. ``BEGIN``
  and the check go straight to the connection's ``pgconn``. Control: the same query
  sent through a cursor (``conn.execute``, the path before), whose set-up and result
  rows cost about 50 calls more, over the budget.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from helpers.work_budget import CallCounter
from test_postgres_wal_per_cycle import CYCLES, _per_cycle

from stockade.resources import postgres as pg
from stockade.resources.postgres._sync import fence as sync_fence
from stockade.testing.budgets import BUDGETS, over_budget
from stockade.testing.conformance.fence import KEYS, tok
from stockade.testing.servers.postgres import available, drop_database, fresh_database, shared_server

if not available():
    pytest.skip("PostgreSQL 15 is not installed", allow_module_level=True)

WRITES = CYCLES  # what `_per_cycle` divides by
WARM_UP = 10
UPSERT = ("INSERT INTO {t} (id, state) VALUES (1, 'paid') "
          "ON CONFLICT (id) DO UPDATE SET state = excluded.state")
#: What the plain transaction makes and writes (the same on every machine): the budget is no more than this.
PLAIN = {"round_trips": 3, "wal_records": 3}


@pytest.fixture
def conn() -> Iterator[psycopg.Connection]:
    server = shared_server()
    name = fresh_database(server)
    connection = psycopg.connect(server.dsn_of(name), autocommit=True)
    pg.install(connection, keys=KEYS)
    connection.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    for table in ("plain_orders", "fenced_orders"):
        connection.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, state text NOT NULL)")
        connection.execute(f"INSERT INTO {table} VALUES (1, 'new')")
    try:
        yield connection
    finally:
        connection.close()
        drop_database(server, name)


def _counted_waits(conn: psycopg.Connection, step: Callable[[], None]) -> float:
    """Round trips per ``step``: the connection's waits for an answer (one per query sent, and per commit)."""
    calls = 0
    wait = conn.wait

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return wait(*args, **kwargs)

    conn.wait = counted  # type: ignore[method-assign]
    try:
        for _ in range(WRITES):
            step()
    finally:
        del conn.wait
    return calls / WRITES


def _counted_calls(step: Callable[[], None]) -> float:
    """Python and C function calls per ``step`` on this thread (``sys.setprofile``): the client's work."""
    counter = CallCounter()
    sys.setprofile(counter.profile)
    try:
        counter.on = True
        for _ in range(WRITES):
            step()
        counter.on = False
    finally:
        sys.setprofile(None)
    return counter.calls / WRITES


def _measure(conn: psycopg.Connection, step: Callable[[], None]) -> dict[str, float]:
    for _ in range(WARM_UP):
        step()
    start = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    round_trips = _counted_waits(conn, step)
    end = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
    return {"round_trips": round_trips, "wal_records": sum(_per_cycle(conn, str(start), str(end)).values()),
            "calls": _counted_calls(step)}


def _plain(conn: psycopg.Connection) -> Callable[[], None]:
    def step() -> None:
        with conn.transaction():
            conn.execute(UPSERT.format(t="plain_orders"))
    return step


def _fenced(conn: psycopg.Connection) -> Callable[[], None]:
    token = tok(7, scope="orders")

    def step() -> None:
        with pg.fenced(conn, token):
            conn.execute(UPSERT.format(t="fenced_orders"))
    return step


def test_a_fenced_transaction_does_what_the_plain_one_does_within_the_budget(conn: psycopg.Connection) -> None:
    plain = _measure(conn, _plain(conn))
    fenced = _measure(conn, _fenced(conn))
    assert {name: plain[name] for name in PLAIN} == PLAIN
    assert {name: fenced[name] for name in PLAIN} == PLAIN
    assert over_budget("postgres.fenced_write", fenced) == []
    budget = BUDGETS["postgres.fenced_write"]
    assert {name: budget[name] for name in PLAIN} == PLAIN
    # The client's calls: the plain transaction's (97 with psycopg 3.3) and the fence's own few beyond them.
    assert plain["calls"] < fenced["calls"] <= budget["calls"] < plain["calls"] + 25, (plain, fenced)


def test_control_the_check_sent_through_a_cursor_is_over_the_budget(
        conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    def through_a_cursor(connection: psycopg.Connection, query: str) -> None:
        connection.execute(query, prepare=False)  # the path before: a cursor's set-up and its result's rows

    monkeypatch.setattr(sync_fence, "_begin_and_check", through_a_cursor)
    found = over_budget("postgres.fenced_write", _measure(conn, _fenced(conn)))
    assert [line.split()[1] for line in found] == ["calls"], found


def test_control_the_check_in_a_transaction_begun_apart_is_over_the_budget(
        conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync_fence, "_owns_transaction", lambda _conn: False)
    found = over_budget("postgres.fenced_write", _measure(conn, _fenced(conn)))
    assert [line.split()[1:3] for line in found if "round_trips" in line] == [["round_trips", "4"]], found


def test_control_a_row_lock_on_the_mark_is_over_the_budget(conn: psycopg.Connection) -> None:
    conn.execute("SET default_transaction_isolation = 'repeatable read'")
    found = over_budget("postgres.fenced_write", _measure(conn, _fenced(conn)))
    assert [line.split()[1:3] for line in found] == [["wal_records", "4"]], found
