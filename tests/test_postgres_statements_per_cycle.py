"""The statements PostgreSQL runs for one lock cycle of the coordinator, nested ones included, counted.

Each statement a server-side function runs costs the server an executor start (and a PL/pgSQL
statement of its own), so their count is the server's work a cycle in a figure that does not
depend on how busy the host is, unlike a time. ``pg_stat_statements`` (shipped with PostgreSQL 15,
loaded by a server of this test's own) counts them with ``track = all``: the two calls the client
sends and every statement inside them. Since schema 13 a cycle runs 8 (docs/coordinator-postgres.md,
"The scopes' locks, and other roles"): the grant's lock, read and write, the release's read, lock and
write; the release's commit setting and its check of the log's bound are expressions (no executor).

Controls: schema 12's functions, whose release sets its commit and checks the log's bound with a query
each, run 10; schema 11's, which lock through a nested call of ``lock_scope`` (one statement more each
lock) and whose release sets nothing (one statement fewer), run 11: both over the budget.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest

import stockade
from stockade.coordinators.postgres._rows import SERVER_RULES_11, SERVER_RULES_12
from stockade.testing.budgets import over_budget
from stockade.testing.servers import postgres as pg_helper

if not pg_helper.available():
    if os.environ.get("CI") == "true":
        raise RuntimeError("PostgreSQL 15 is not installed (scripts/test.sh installs it)")
    pytest.skip("PostgreSQL 15 is not installed", allow_module_level=True)

CYCLES = 50
WARM_UP = 10


@pytest.fixture(scope="module")
def server() -> Iterator[pg_helper.PostgresServer]:
    server = pg_helper.PostgresServer({"shared_preload_libraries": "pg_stat_statements",
                                       "pg_stat_statements.track": "all"})
    try:
        yield server
    finally:
        server.close()


def _statements_per_cycle(server: pg_helper.PostgresServer, rules: str | None) -> dict[str, float]:
    """Statements a cycle runs (``pg_stat_statements`` calls over `CYCLES` cycles), in a fresh database."""
    name = pg_helper.fresh_database(server)
    try:
        coord = stockade.connect(server.url(name))
        try:
            with psycopg.connect(server.dsn_of(name), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                if rules is not None:
                    conn.execute(rules)
                for _ in range(WARM_UP):
                    coord.acquire("s", ttl_ms=10_000, keepalive=False).release()
                conn.execute("SELECT pg_stat_statements_reset()")
                for _ in range(CYCLES):
                    coord.acquire("s", ttl_ms=10_000, keepalive=False).release()
                rows = conn.execute(
                    "SELECT toplevel, sum(calls) FROM pg_stat_statements WHERE dbid = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database()) "
                    "AND query NOT LIKE '%%pg_stat_statements%%' GROUP BY toplevel").fetchall()
        finally:
            coord.close()
    finally:
        pg_helper.drop_database(server, name)
    counts = {("sent" if top else "nested"): int(n) / CYCLES for top, n in rows}
    return {**counts, "statements": sum(counts.values())}


def test_a_lock_cycle_runs_eight_statements_within_the_budget(server):
    got = _statements_per_cycle(server, None)
    assert got == {"sent": 2, "nested": 6, "statements": 8}
    assert not over_budget("postgres.lock_cycle_server", got)


def test_control_schema_12s_release_queries_are_over_the_budget(server):
    got = _statements_per_cycle(server, SERVER_RULES_12)
    assert got == {"sent": 2, "nested": 8, "statements": 10}
    assert over_budget("postgres.lock_cycle_server", got)


def test_control_schema_11s_nested_lock_calls_are_over_the_budget(server):
    got = _statements_per_cycle(server, SERVER_RULES_11)
    assert got == {"sent": 2, "nested": 9, "statements": 11}
    assert over_budget("postgres.lock_cycle_server", got)
