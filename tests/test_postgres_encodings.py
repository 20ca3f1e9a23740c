"""Both PostgreSQL integrations on a database that is not UTF8 (docs/coordinator-postgres.md, docs/fence-postgres.md).

``initdb --locale=C`` makes SQL_ASCII databases, and psycopg hands their text
back as ``bytes``. The coordinator then failed on every connect after the
first (``int("b'8'")``, a raw ``ValueError`` out of `stockade.connect` and
``stockade status``), and the fence's `install` refused its own cluster id
(``this database is fenced for cluster b'29e1…'``). The conformance suites run
both integrations on a SQL_ASCII database of the shared server
(tests/test_coordinator_conformance.py ``SQL_ASCII_CASES``, stockade.testing.fences.postgres
``postgres-sql_ascii``); here:

- a real ``initdb --locale=C`` cluster: connect twice, a holder read back,
  ``stockade status --url``, then the fence with that coordinator's keys and
  tokens (install twice, a fenced write, a rejection, a floor); the control
  (the old text handling: the database's own client encoding, values read
  back unconverted) shows both failures;
- other encodings (all that stockade stores as text is ASCII): the coordinator
  works on LATIN1, EUC_JP and EUC_TW, and MULE_INTERNAL (no conversion to
  UTF8) is refused in one line naming it; the fence works on LATIN1 and
  EUC_JP, and refuses a user's connection Python cannot decode (EUC_TW,
  MULE_INTERNAL) in one line, while its own connections (UTF8) work there;
- what psycopg raises of its own never escapes as a non-stockade error: a url
  whose %-escapes are not UTF-8, a server message that is not UTF-8.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from conftest import python_env

import stockade
from stockade.coordinators.postgres import open_postgres
from stockade.core.errors import BackendUnavailable, InvalidArgument, StaleToken
from stockade.core.leases import LeasePolicy
from stockade.core.tokens import FencingToken
from stockade.resources import postgres as pg
from stockade.testing.conformance.fence import KEYS, tok
from stockade.testing.servers.postgres import PostgresServer, available, drop_database, shared_server
from stockade.transport import postgres as _postgres_errors
from stockade.transport.postgres import error_text

if not available():
    if os.environ.get("CI") == "true":
        raise RuntimeError("PostgreSQL 15 is not installed (scripts/test.sh installs it)")
    pytest.skip("PostgreSQL 15 is not installed", allow_module_level=True)

HOLDER = "worker-7@host"  # holders are printable ASCII; read back as bytes before the fix


@pytest.fixture(scope="module")
def c_cluster() -> Iterator[PostgresServer]:
    """A cluster made by ``initdb --locale C`` without ``-E``: its databases are SQL_ASCII."""
    server = PostgresServer(encoding=None)
    try:
        yield server
    finally:
        server.close()


def _database(server: PostgresServer, name: str, encoding: str | None = None) -> None:
    options = f" ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0" if encoding else ""
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"{options}')


def _status(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stockade", "status", "--url", url], capture_output=True, text=True,
                          env=python_env(), timeout=120)


def _connect_twice_and_status(url: str) -> list[str]:
    """The coordinator's round on ``url``: what went wrong, in words (empty: nothing)."""
    problems = []
    for attempt in (1, 2):
        try:
            with stockade.connect(url) as coord, coord.lock("reports", ttl_ms=5_000, holder=HOLDER) as lease:
                held = {info.scope: info for info in coord.scopes()}["reports"]
                if held.holder != HOLDER or lease.token.value != held.token.value:
                    problems.append(f"connect {attempt}: reads back {held.holder!r} {held.token}")
        except Exception as exc:  # noqa: BLE001 - what escapes is the finding
            problems.append(f"connect {attempt}: {type(exc).__name__}: {exc}")
    status = _status(url)
    if status.returncode != 0 or "reports" not in status.stdout or "Traceback" in status.stderr:
        problems.append(f"status {status.returncode}: {status.stderr.strip().splitlines()[-1:]}")
    return problems


def _fence_round(conninfo: str, keys: object, token: FencingToken, stale: FencingToken) -> list[str]:
    """install twice, a fenced write, a stale one refused, the marks, a floor; what went wrong (empty: nothing)."""
    problems = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        try:
            pg.install(conn, keys=keys)
            pg.install(conn, keys=keys)  # idempotent: reads its cluster id back
            conn.execute("CREATE TABLE IF NOT EXISTS report (scope text PRIMARY KEY, body text)")
            with pg.fenced(conn, token):
                conn.execute("INSERT INTO report VALUES (%s, 'paid') ON CONFLICT (scope) DO UPDATE SET body = "
                             "excluded.body", (token.scope,))
            try:
                with pg.fenced(conn, stale):
                    conn.execute("UPDATE report SET body = 'zombie'")
                problems.append("the stale write was admitted")
            except StaleToken as exc:
                if exc.high_water != token.value:
                    problems.append(f"stale write refused with high_water {exc.high_water}")
            marks = pg.high_waters(conn)
            if marks != {token.scope: token.value}:
                problems.append(f"marks read back as {marks}")
            floored = pg.open_floor_target(conninfo, cluster_id=token.cluster).raise_high_waters({"other": 9})
            if floored != {"other": 9}:  # what `stockade floor` does, on a connection of its own
                problems.append(f"the floor read back {floored}")
        except Exception as exc:  # noqa: BLE001 - what escapes is the finding
            problems.append(f"{type(exc).__name__}: {exc}")
    return problems


def _round_on_c_cluster(server: PostgresServer) -> list[str]:
    """The coordinator, then the fence with that coordinator's keys and tokens, on one SQL_ASCII database."""
    _database(server, "app")
    url = server.url("app")
    with psycopg.connect(server.dsn_of("app")) as conn:
        assert conn.info.parameter_status("server_encoding") == "SQL_ASCII"
    problems = _connect_twice_and_status(url)
    keys: object = KEYS
    first, second = tok(4, scope="orders"), tok(5, scope="orders")
    try:
        coordinator = open_postgres(url, LeasePolicy())
        try:
            keys = coordinator.signer
            with stockade.connect(url) as coord:
                first = coord.acquire("orders", ttl_ms=5_000)
                first.release()
                second = coord.acquire("orders", ttl_ms=5_000)
                second.release()
                first, second = first.token, second.token
        finally:
            coordinator.close()
    except Exception as exc:  # noqa: BLE001 - the fence round still runs, with the suite's keys
        problems.append(f"open: {type(exc).__name__}: {exc}")
        keys, first, second = KEYS, tok(4, scope="orders"), tok(5, scope="orders")
    return problems + _fence_round(server.dsn_of("app"), keys, second, first)


def test_both_integrations_work_on_an_initdb_locale_c_cluster(c_cluster: PostgresServer) -> None:
    assert _round_on_c_cluster(c_cluster) == []


def test_control_the_old_text_handling_fails_on_the_same_cluster(c_cluster: PostgresServer,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The database's own client encoding, values read back as psycopg returns them: both failures."""
    monkeypatch.setattr(_postgres_errors, "CLIENT_ENCODING", None)
    monkeypatch.setattr(pg, "text_of", lambda value: value)
    problems = _round_on_c_cluster(c_cluster)
    assert any(p.startswith("connect 2: ValueError: invalid literal for int()") for p in problems), problems
    assert any("this database is fenced for cluster b'" in p for p in problems), problems


@pytest.mark.parametrize("encoding", ["LATIN1", "EUC_JP", "EUC_TW"])
def test_the_coordinator_works_on_other_encodings(encoding: str) -> None:
    server = shared_server()
    name = f"coord_{encoding.lower()}_{os.getpid()}"
    _database(server, name, encoding)
    try:
        assert _connect_twice_and_status(server.url(name)) == []
    finally:
        drop_database(server, name)


def test_the_coordinator_refuses_mule_internal_in_one_line() -> None:
    """MULE_INTERNAL has no conversion to UTF8: the server refuses the connection, and says so."""
    server = shared_server()
    name = f"coord_mule_{os.getpid()}"
    _database(server, name, "MULE_INTERNAL")
    try:
        with pytest.raises(BackendUnavailable, match="UTF8 and MULE_INTERNAL") as refused:
            stockade.connect(server.url(name)).close()
        assert "\n" not in str(refused.value)
        status = _status(server.url(name))
        assert status.returncode != 0 and "MULE_INTERNAL" in status.stderr and "Traceback" not in status.stderr
    finally:
        drop_database(server, name)


@pytest.mark.parametrize("encoding", ["LATIN1", "EUC_JP"])
def test_the_fence_works_on_other_encodings(encoding: str) -> None:
    server = shared_server()
    name = f"fence_{encoding.lower()}_{os.getpid()}"
    _database(server, name, encoding)
    try:
        assert _fence_round(server.dsn_of(name), KEYS, tok(5, scope="orders"), tok(4, scope="orders")) == []
    finally:
        drop_database(server, name)


def test_the_fence_refuses_a_connection_python_cannot_decode_in_one_line() -> None:
    """EUC_TW has no Python codec: the user's connection in it is refused; `PostgresFence`'s (UTF8) works."""
    server = shared_server()
    name = f"fence_euc_tw_{os.getpid()}"
    _database(server, name, "EUC_TW")
    try:
        with psycopg.connect(server.dsn_of(name), autocommit=True) as conn:
            with pytest.raises(InvalidArgument, match="'EUC_TW'.*client_encoding") as refused:
                pg.install(conn, keys=KEYS)
            assert "\n" not in str(refused.value)
        fence = pg.PostgresFence(server.url(name), keys=KEYS)
        fence.install()
        assert fence.raise_high_waters({"orders": 7}) == {"orders": 7}
        assert fence.high_waters() == {"orders": 7}
    finally:
        drop_database(server, name)


def test_a_url_whose_escapes_are_not_utf8_is_invalid_argument() -> None:
    """psycopg decodes a url's %-escapes as UTF-8 and raised a raw UnicodeDecodeError (connect, status)."""
    url = shared_server().url("caf%E9")
    with pytest.raises(InvalidArgument, match="not UTF-8"):
        stockade.connect(url)
    with pytest.raises(InvalidArgument, match="not UTF-8"):
        pg.PostgresFence(url).connect()
    status = _status(url)
    assert status.returncode != 0 and "not UTF-8" in status.stderr and "Traceback" not in status.stderr


def test_a_server_message_that_is_not_utf8_reaches_the_user_in_one_line(c_cluster: PostgresServer) -> None:
    """A SQL_ASCII database's message may hold any byte (here 0xE9): psycopg replaces what is not UTF-8."""
    _database(c_cluster, "messages")
    with psycopg.connect(c_cluster.dsn_of("messages"), autocommit=True) as conn:  # a user's, in SQL_ASCII
        with pytest.raises(psycopg.Error) as raised:
            conn.execute("DO $$ BEGIN RAISE EXCEPTION E'caf\\351 ferm\\351'; END $$")
    text = error_text(raised.value)
    assert text.startswith("caf\ufffd ferm\ufffd") and text.endswith("[SQLSTATE P0001]")
    # stockade's own connections (client_encoding UTF8): the server cannot convert the message and
    # sends its own error instead, still one line with its SQLSTATE.
    with psycopg.connect(c_cluster.dsn_of("messages"), autocommit=True, client_encoding="UTF8") as conn:
        with pytest.raises(psycopg.Error) as raised:
            conn.execute("DO $$ BEGIN RAISE EXCEPTION E'caf\\351 ferm\\351'; END $$")
    text = error_text(raised.value)
    assert "\n" not in text and text.endswith("[SQLSTATE 22021]"), text
