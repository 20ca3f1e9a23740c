"""`fenced_sqlalchemy` over ``postgresql+psycopg2``: the fence's errors are stockade's typed errors there too.

psycopg2's errors carry the SQLSTATE as ``pgcode`` (psycopg 3's as ``sqlstate``);
the edge (`stockade.resources.postgres._errors`) reads both. Before, every fence
error through psycopg2 reached the caller as SQLAlchemy's raw DBAPI error: a
stale token was no `StaleToken`, a forged one no `TokenMismatch`, a retried
operation no `AlreadyApplied` (and a superseded writer no `Superseded`:
tests/test_fence_postgres_supersede.py). Control: the psycopg 3 driver, the
same calls, the same typed errors.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from stockade.core.errors import AlreadyApplied, StaleToken, TokenMismatch
from stockade.resources import postgres as pg
from stockade.testing.conformance.fence import KEYS, ROGUE_KEYS, tok
from stockade.testing.servers.postgres import available, drop_database, fresh_database, shared_server

if not available():
    pytest.skip("PostgreSQL 15 is not installed", allow_module_level=True)
psycopg2 = pytest.importorskip("psycopg2")
sqlalchemy = pytest.importorskip("sqlalchemy")


@pytest.fixture(params=["psycopg2", "psycopg"])
def session(request: pytest.FixtureRequest) -> Iterator[Any]:
    from sqlalchemy.orm import Session

    server = shared_server()
    name = fresh_database(server)
    dsn = server.dsn_of(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        pg.install(conn, keys=KEYS)
        conn.execute("CREATE TABLE kv (key text PRIMARY KEY, value text NOT NULL)")
    connect = psycopg2.connect if request.param == "psycopg2" else psycopg.connect
    engine = sqlalchemy.create_engine(f"postgresql+{request.param}://", creator=lambda: connect(dsn))
    try:
        with Session(engine) as db:
            yield db
    finally:
        engine.dispose()
        drop_database(server, name)


def _write(db: Any, token: Any, value: str, op_id: str | None = None) -> None:
    with pg.fenced_sqlalchemy(db, token, op_id=op_id):
        db.execute(sqlalchemy.text("INSERT INTO kv VALUES ('k', :v) ON CONFLICT (key) DO UPDATE SET "
                                   "value = excluded.value"), {"v": value})


def _value(db: Any) -> Any:
    return db.execute(sqlalchemy.text("SELECT value FROM kv WHERE key = 'k'")).scalar()


def test_the_fence_s_refusals_are_typed_through_psycopg2(session: Any) -> None:
    _write(session, tok(5), "five", op_id="op-1")
    with pytest.raises(StaleToken) as stale:
        _write(session, tok(4), "four")
    assert stale.value.high_water == 5
    with pytest.raises(TokenMismatch):
        _write(session, tok(6, keys=ROGUE_KEYS), "rogue")
    with pytest.raises(AlreadyApplied):
        _write(session, tok(5), "again", op_id="op-1")
    assert _value(session) == "five"


def test_the_control_reads_only_psycopg3_s_sqlstate(session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The edge as it was (``sqlstate`` only): through psycopg2 the stale token is SQLAlchemy's raw error."""
    from stockade.resources.postgres import _errors as _postgres_edge

    monkeypatch.setattr(_postgres_edge, "_sqlstate", lambda error: getattr(error, "sqlstate", None))
    _write(session, tok(5), "five")
    driver = session.get_bind().dialect.driver
    if driver == "psycopg2":
        with pytest.raises(sqlalchemy.exc.DBAPIError):
            _write(session, tok(4), "four")
    else:
        with pytest.raises(StaleToken):
            _write(session, tok(4), "four")
