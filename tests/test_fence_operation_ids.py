"""Operation ids of the PostgreSQL and SQLite fences, beyond the retry suite: the bound, and the SQL by hand.

The table of recorded ids keeps the newest `OPERATION_IDS_MAX` (here cut to 3): a
new id past the bound forgets the oldest, in the transaction that records it,
so a retry is recognised while fewer newer ids were recorded after it (in
PostgreSQL, fewer attempts with an id: a refused or rolled-back one draws a
sequence number too). The
retry suite (stockade.testing.conformance.fence_retry) and the kill test
(tests/test_fence_retry_kill.py) hold the rest.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from stockade.core.errors import AlreadyApplied, InvalidArgument
from stockade.resources import postgres as pg
from stockade.resources import sqlite_db
from stockade.resources.postgres import _sql as q
from stockade.testing.conformance.fence import CLUSTER, KEYS, tok
from stockade.testing.servers.postgres import available, drop_database, fresh_database, shared_server

BOUND = 3


@pytest.fixture
def pg_conn() -> Iterator[psycopg.Connection]:
    if not available():
        pytest.skip("PostgreSQL 15 is not installed")
    server = shared_server()
    name = fresh_database(server)
    try:
        with psycopg.connect(server.dsn_of(name), autocommit=True) as conn:
            pg.install(conn, keys=KEYS)
            conn.execute(q.fence_op_function(operation_ids_max=BOUND))
            conn.execute("CREATE TABLE t (op text NOT NULL)")
            yield conn
    finally:
        drop_database(server, name)


def test_postgres_keeps_the_newest_ids_and_forgets_the_oldest(pg_conn: psycopg.Connection) -> None:
    for i in range(5):
        with pg.fenced(pg_conn, tok(3), op_id=f"op-{i}"):
            pg_conn.execute("INSERT INTO t VALUES (%s)", (f"op-{i}",))
    kept = [row[0] for row in pg_conn.execute("SELECT op_id FROM stockade.operations ORDER BY seq")]
    assert kept == ["op-2", "op-3", "op-4"]
    with pytest.raises(AlreadyApplied):
        with pg.fenced(pg_conn, tok(3), op_id="op-2"):
            pg_conn.execute("INSERT INTO t VALUES ('op-2')")
    with pg.fenced(pg_conn, tok(3), op_id="op-0"):  # forgotten: past the bound, a retry applies again
        pg_conn.execute("INSERT INTO t VALUES ('op-0')")
    kept = [row[0] for row in pg_conn.execute("SELECT op_id FROM stockade.operations ORDER BY seq")]
    # The refused retry drew a number too (PostgreSQL's sequences have gaps): the window counts numbers.
    assert kept == ["op-4", "op-0"]


def test_postgres_the_sql_by_hand_rolls_back_a_retry(pg_conn: psycopg.Connection) -> None:
    """From psql or another language: the retry's fence_op is an error, so its COMMIT rolls back."""

    def by_hand() -> str | None:
        pg_conn.execute("BEGIN")
        try:
            pg_conn.execute(pg.FENCE_OP_SQL, (tok(3).encode(), "a", "by-hand"))
            pg_conn.execute("INSERT INTO t VALUES ('by-hand')")
        except psycopg.Error as error:
            pg_conn.execute("COMMIT")  # the COMMIT of a failed transaction rolls it back
            return error.sqlstate
        pg_conn.execute("COMMIT")
        return None

    assert (by_hand(), by_hand()) == (None, pg.ALREADY_APPLIED_SQLSTATE)
    assert pg_conn.execute("SELECT count(*) FROM t").fetchone() == (1,)


def test_sqlite_keeps_the_newest_ids_and_forgets_the_oldest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_db, "OPERATION_IDS_MAX", BOUND)
    conn = sqlite3.connect(str(tmp_path / "app.db"), isolation_level=None)
    conn.execute("CREATE TABLE t (op TEXT NOT NULL)")
    sqlite_db.install(conn, cluster_id=CLUSTER)
    for i in range(5):
        with sqlite_db.fenced(conn, tok(3), keys=KEYS, op_id=f"op-{i}"):
            conn.execute("INSERT INTO t VALUES (?)", (f"op-{i}",))
    kept = [row[0] for row in conn.execute("SELECT op_id FROM stockade_operations ORDER BY seq")]
    assert kept == ["op-2", "op-3", "op-4"]
    with pytest.raises(AlreadyApplied):
        with sqlite_db.fenced(conn, tok(3), keys=KEYS, op_id="op-4"):
            conn.execute("INSERT INTO t VALUES ('op-4')")
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (5,)
    conn.close()


def test_sqlite_a_database_fenced_before_operation_ids_asks_for_install_again(tmp_path: Path) -> None:
    conn = sqlite3.connect(str(tmp_path / "app.db"), isolation_level=None)
    sqlite_db.install(conn, cluster_id=CLUSTER)
    conn.execute("DROP TABLE stockade_operations")  # as an install of an earlier version left it
    with sqlite_db.fenced(conn, tok(3), keys=KEYS):  # without ids nothing changes
        pass
    with pytest.raises(InvalidArgument, match="install"):
        with sqlite_db.fenced(conn, tok(3), keys=KEYS, op_id="op-1"):
            pass
    sqlite_db.install(conn, cluster_id=CLUSTER)
    with sqlite_db.fenced(conn, tok(3), keys=KEYS, op_id="op-1"):
        pass
    conn.close()
