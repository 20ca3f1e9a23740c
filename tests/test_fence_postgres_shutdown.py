"""A server's fast shutdown is an outage, not a supersession (docs/fence-postgres.md, "A paused writer").

``pg_ctl stop -m fast`` ends every session with SQLSTATE 57P01, the same
SQLSTATE and message as a newer token's check ending a paused lower holder.
A worker process holds a scope in a fenced transaction; the server is stopped
fast (and left down, or started again); the worker then commits. It must read
`BackendUnavailable` (the outcome: nothing applied, no newer token wrote),
never `Superseded`: the edge asks a fresh session whether a newer token wrote
(`stockade.resources.postgres._probe`). Through psycopg and through
SQLAlchemy over psycopg2. Control: the probe switched off in the worker (the
behaviour before it), the same shutdown reads as `Superseded`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from stockade.resources import postgres as pg
from stockade.testing.conformance.fence import KEYS, tok
from stockade.testing.servers.postgres import BIN, START_TIMEOUT_S, PostgresServer, available

ROOT = Path(__file__).resolve().parent.parent

if not available():
    pytest.skip("PostgreSQL 15 is not installed", allow_module_level=True)

WORKER = r"""
import sys, psycopg
from stockade.core.errors import StaleToken, Superseded, BackendUnavailable
from stockade.resources import postgres as pg
dsn, token, front, control = sys.argv[1:5]
if control == "1":  # the behaviour before the probe: every 57P01 read as supersession
    from stockade.resources.postgres._sync import fence as sync_fronts
    sync_fronts.probe_psycopg = lambda conn: None
    sync_fronts.probe_sqlalchemy = lambda bind: None
UPSERT = "INSERT INTO kv VALUES ('A', 'zombie') ON CONFLICT (key) DO UPDATE SET value = excluded.value"
def out(line):
    print(line, flush=True)
try:
    if front == "psycopg":
        conn = psycopg.connect(dsn, autocommit=True)
        with pg.fenced(conn, token):
            conn.execute(UPSERT)
            out("in-transaction")
            sys.stdin.readline()
            conn.execute(UPSERT)
    elif front == "sqlalchemy-async":
        import asyncio
        from sqlalchemy import text
        from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
        async def main():
            engine = create_async_engine("postgresql+psycopg://",
                                         async_creator=lambda: psycopg.AsyncConnection.connect(dsn))
            async with AsyncSession(engine) as session:
                async with pg.fenced_sqlalchemy_async(session, token):
                    await session.execute(text(UPSERT))
                    out("in-transaction")
                    sys.stdin.readline()
                    await session.execute(text(UPSERT))
        asyncio.run(main())
    else:
        import psycopg2
        from sqlalchemy import create_engine, text
        from sqlalchemy.orm import Session
        engine = create_engine("postgresql+psycopg2://", creator=lambda: psycopg2.connect(dsn))
        with Session(engine) as session, pg.fenced_sqlalchemy(session, token):
            session.execute(text(UPSERT))
            out("in-transaction")
            sys.stdin.readline()
            session.execute(text(UPSERT))
    out("committed")
except Superseded:
    out("superseded")
except StaleToken:
    out("stale")
except BackendUnavailable:
    out("outage")
except Exception as e:
    out(f"raw error {type(e).__name__}")
"""


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    server.start()
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        pg.install(conn, keys=KEYS)
        conn.execute("CREATE TABLE kv (key text PRIMARY KEY, value text NOT NULL)")
    try:
        yield server
    finally:
        server.close()


def _stop_fast(server: PostgresServer) -> None:
    server._run([str(BIN / "pg_ctl"), "stop", "-D", str(server.datadir), "-m", "fast", "-w"])
    server._process.wait(START_TIMEOUT_S)


def _shutdown_under(server: PostgresServer, front: str, restart: bool, control: bool = False) -> str:
    """What a worker in a fenced transaction reads when the server is stopped fast under it."""
    if server._process.poll() is not None:
        server.start()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    argv = [sys.executable, "-c", WORKER, server.dsn, tok(7, scope="s").encode(), front, "1" if control else "0"]
    worker = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdin is not None and worker.stdout is not None
    try:
        assert worker.stdout.readline().strip() == "in-transaction"
        _stop_fast(server)
        if restart:
            server.start()
        worker.stdin.write("go\n")
        worker.stdin.flush()
        return worker.stdout.readline().strip()
    finally:
        worker.wait(60)


@pytest.mark.parametrize("restart", [False, True], ids=["left-down", "restarted"])
@pytest.mark.parametrize("front", ["psycopg", "psycopg2", "sqlalchemy-async"])
def test_a_fast_shutdown_is_an_outage_not_a_supersession(server: PostgresServer, front: str, restart: bool) -> None:
    if front == "psycopg2":
        pytest.importorskip("psycopg2")
    assert _shutdown_under(server, front, restart) == "outage"
    if server._process.poll() is not None:
        server.start()
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM kv WHERE key = 'A'").fetchone()[0] == 0


def test_the_control_reads_a_fast_shutdown_as_superseded(server: PostgresServer) -> None:
    assert _shutdown_under(server, "psycopg", restart=True, control=True) == "superseded"
