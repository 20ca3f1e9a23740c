"""A newer token is not stalled by a writer paused inside its transaction (docs/fence-postgres.md, "A paused writer").

A worker process holds a scope in `fenced()` with token 2 and is stopped with
SIGSTOP. The newer holder (token 3) completes within the bound while the worker
is still stopped (its session is ended by the fence), and the worker, resumed
with SIGCONT after that, fails with `Superseded` (a `StaleToken`), applying
nothing. Control: installed without supersession (the old behaviour), the
newer holder is still waiting at several times the bound, and the resumed
worker commits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from stockade.core.errors import Superseded
from stockade.resources import postgres as pg
from stockade.resources.postgres import _sql as q
from stockade.testing.conformance.fence import KEYS, tok
from stockade.testing.servers.postgres import PostgresServer, available, drop_database, fresh_database, shared_server

ROOT = Path(__file__).resolve().parent.parent
LONG = int(os.environ.get("STOCKADE_LONG", "0") or 0)
ROUNDS = 20 if LONG else 3
BOUND_MS = 300
WAIT_S = 30.0

if not available():
    pytest.skip("PostgreSQL 15 is not installed", allow_module_level=True)

WORKER = r"""
import sys, psycopg
from stockade.core.errors import StaleToken, Superseded, BackendUnavailable
from stockade.resources import postgres as pg
dsn, token, front = sys.argv[1:4]
conn = psycopg.connect(dsn, autocommit=True)
def out(line):
    print(line, flush=True)
UPSERT = "INSERT INTO kv VALUES ('A', 'paused') ON CONFLICT (key) DO UPDATE SET value = excluded.value"
try:
    if front == "psycopg":
        with pg.fenced(conn, token):
            conn.execute(UPSERT)
            out("in-transaction")
            sys.stdin.readline()
    elif front == "async":
        import asyncio
        async def main():
            aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
            async with pg.fenced_async(aconn, token):
                await aconn.execute(UPSERT)
                out("in-transaction")
                sys.stdin.readline()
        asyncio.run(main())
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
        asyncio.run(main())
    else:
        from sqlalchemy import create_engine, text
        from sqlalchemy.orm import Session
        if front == "psycopg2":  # SQLAlchemy over the other DBAPI driver (its errors carry pgcode, not sqlstate)
            import psycopg2
            engine = create_engine("postgresql+psycopg2://", creator=lambda: psycopg2.connect(dsn))
        else:
            engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))
        with Session(engine) as session, pg.fenced_sqlalchemy(session, token):
            session.execute(text(UPSERT))
            out("in-transaction")
            sys.stdin.readline()
    out("committed")
except Superseded:
    out("superseded")
except StaleToken as e:
    out(f"refused stale {e.high_water}")
except BackendUnavailable:
    out("connection lost")
except psycopg.Error as e:
    out(f"raw driver error {e.sqlstate}")
except Exception as e:
    out(f"raw error {type(e).__name__}")
"""


@pytest.fixture(params=["supersede", "control-no-supersede"])
def kv_db(request: pytest.FixtureRequest) -> Iterator[tuple[PostgresServer, str, psycopg.Connection, bool]]:
    server = shared_server()
    name = fresh_database(server)
    conn = psycopg.connect(server.dsn_of(name), autocommit=True)
    supersede = request.param == "supersede"
    keyring, cluster = pg._keyring_of(KEYS, None)
    pg._install(conn, keyring, cluster, q.STALE_WHEN["decide"], supersede_after_ms=BOUND_MS if supersede else 0)
    conn.execute("CREATE TABLE kv (key text PRIMARY KEY, value text NOT NULL)")
    try:
        yield server, name, conn, supersede
    finally:
        conn.close()
        drop_database(server, name)


def _round(server: PostgresServer, dbname: str, conn: psycopg.Connection, old: int, new: int,
           supersede: bool, front: str = "psycopg") -> tuple[bool, float, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    argv = [sys.executable, "-c", WORKER, server.dsn_of(dbname), tok(old, scope="s").encode(), front]
    worker = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdin is not None and worker.stdout is not None
    assert worker.stdout.readline().strip() == "in-transaction"
    os.kill(worker.pid, signal.SIGSTOP)
    done = threading.Event()
    took: list[float] = []

    def newer() -> None:
        with psycopg.connect(server.dsn_of(dbname), autocommit=True) as other:
            started = time.monotonic()
            with pg.fenced(other, tok(new, scope="s")):
                other.execute("INSERT INTO kv VALUES ('B', %s) ON CONFLICT (key) DO UPDATE SET value = "
                              "excluded.value", (str(new),))
            took.append(time.monotonic() - started)
        done.set()

    thread = threading.Thread(target=newer)
    thread.start()
    # Supersession: the newer holder must finish while the worker is still stopped. Control: it is
    # still waiting at ten times the bound (then the worker is resumed, and the newer holder goes on).
    finished_while_paused = done.wait(WAIT_S if supersede else 10 * BOUND_MS / 1000)
    os.kill(worker.pid, signal.SIGCONT)
    worker.stdin.write("go\n")
    worker.stdin.flush()
    answer = worker.stdout.readline().strip()
    worker.wait(WAIT_S)
    thread.join(WAIT_S)
    return finished_while_paused, (took[0] if took else float("inf")), answer


def test_a_paused_lower_holder_does_not_stall_a_newer_token(
        kv_db: tuple[PostgresServer, str, psycopg.Connection, bool]) -> None:
    server, dbname, conn, supersede = kv_db
    with pg.fenced(conn, tok(1, scope="s")):
        pass
    finished = superseded = 0
    answers: dict[str, int] = {}
    slowest = 0.0
    for i in range(ROUNDS):
        old, new = 2 + 2 * i, 3 + 2 * i
        finished_while_paused, took, answer = _round(server, dbname, conn, old, new, supersede)
        finished += finished_while_paused
        superseded += answer == "superseded"
        answers[answer] = answers.get(answer, 0) + 1
        slowest = max(slowest, took)
        if supersede:
            assert conn.execute("SELECT value FROM kv WHERE key = 'B'").fetchone()[0] == str(new)
            assert conn.execute("SELECT count(*) FROM kv WHERE key = 'A'").fetchone()[0] == 0
    print(f"supersede={supersede}: newer holder finished while the older was paused {finished} of {ROUNDS}, "
          f"resumed writer superseded {superseded} of {ROUNDS}, slowest newer holder {slowest:.2f} s "
          f"(bound {BOUND_MS} ms); resumed writers: {answers}")
    if supersede:
        assert finished == ROUNDS and superseded == ROUNDS
        assert slowest < WAIT_S
    else:  # the old behaviour: the newer holder waits for the paused one, and the zombie is no fencing error
        assert finished == 0 and superseded == 0


def test_install_validates_the_bound() -> None:
    from stockade.core.errors import InvalidArgument
    with pytest.raises(InvalidArgument):
        pg.install(None, keys=KEYS, supersede_after_ms=0)
    from stockade.core.errors import StaleToken
    assert issubclass(Superseded, StaleToken)  # a handler catching StaleToken catches it


def test_a_non_superuser_installer_needs_pg_signal_backend() -> None:
    """`install` warns when the installing role may not end sessions; granted pg_signal_backend, it does not,
    and a paused lower holder of another (non-superuser) role is superseded."""
    server = shared_server()
    name = fresh_database(server)
    owner, app = f"{name}_owner", f"{name}_app"
    try:
        with psycopg.connect(server.dsn_of(name), autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {owner} LOGIN")
            admin.execute(f"CREATE ROLE {app} LOGIN")
            admin.execute(f"ALTER DATABASE {name} OWNER TO {owner}")
            admin.execute(f"GRANT ALL ON SCHEMA public TO {owner}")
        owner_dsn = " ".join(f"user={owner}" if p.startswith("user=") else p for p in server.dsn_of(name).split())
        with psycopg.connect(owner_dsn, autocommit=True) as conn:
            with pytest.warns(pg.SupersedeWarning):
                pg.install(conn, keys=KEYS, supersede_after_ms=BOUND_MS)
            with psycopg.connect(server.dsn_of(name), autocommit=True) as admin:
                admin.execute(f"GRANT pg_signal_backend TO {owner}")
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                pg.install(conn, keys=KEYS, supersede_after_ms=BOUND_MS)
            conn.execute("CREATE TABLE kv (key text PRIMARY KEY, value text NOT NULL)")
            conn.execute(f"GRANT ALL ON kv TO {app}")
            app_dsn = owner_dsn.replace(f"user={owner}", f"user={app}")
            app_server = _AsRole(server, app_dsn)
            finished, _took, answer = _round(app_server, name, conn, 2, 3, True)  # type: ignore[arg-type]
            assert (finished, answer) == (True, "superseded")
    finally:
        drop_database(server, name)
        with psycopg.connect(server.dsn_of("postgres"), autocommit=True) as admin:
            admin.execute(f"DROP ROLE IF EXISTS {app}")
            admin.execute(f"DROP ROLE IF EXISTS {owner}")


class _AsRole:
    def __init__(self, server: PostgresServer, dsn: str) -> None:
        self.server, self.dsn = server, dsn

    def dsn_of(self, dbname: str) -> str:
        return self.dsn


@pytest.mark.parametrize("front", ["async", "sqlalchemy", "sqlalchemy-async", "psycopg2"])
def test_the_other_front_ends_read_superseded(kv_db: tuple[PostgresServer, str, psycopg.Connection, bool],
                                             front: str) -> None:
    """Each front end's paused writer reads `Superseded` (psycopg2: fenced_sqlalchemy over
    ``postgresql+psycopg2``). Control, each front end: without supersession the newer holder is still
    waiting at ten times the bound, and the resumed writer commits."""
    server, dbname, conn, supersede = kv_db
    with pg.fenced(conn, tok(1, scope="s")):
        pass
    finished, _took, answer = _round(server, dbname, conn, 2, 3, supersede, front)
    if supersede:
        assert (finished, answer) == (True, "superseded")
        assert conn.execute("SELECT count(*) FROM kv WHERE key = 'A'").fetchone()[0] == 0
    else:
        assert (finished, answer) == (False, "committed")
