"""PostgreSQL fence adapter, beyond the shared conformance suite (docs/fence-postgres.md).

- Protected tables: writes with no token, a stale, forged or another scope's
  token are refused by PostgreSQL itself, from a psycopg session with no
  stockade code and from a plain ``psql`` process (control: the same attempts
  on the table unprotected are all accepted).
- S16: kill -9 of the postmaster during fenced writes, restarted each time:
  HWM rollbacks and acknowledged writes lost (control: ``synchronous_commit=off``
  loses acknowledged writes, which the same check sees).
- A writer process paused with SIGSTOP: inside its fenced transaction (a
  higher token waits; the server's idle timeout, shorter than the supersession
  bound, ends the idle transaction; the resumed commit applies nothing; the
  supersession itself is tests/test_fence_postgres_supersede.py) and before it (the resumed write is refused; control: a
  check-then-write writer's stale write lands).
- install twice at once, the SQLAlchemy async twin, `PostgresFence` by url.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from stockade.core.errors import BackendUnavailable, InvalidArgument, StaleToken, TokenMismatch
from stockade.core.tokens import FencingToken
from stockade.resources import postgres as pg
from stockade.resources.postgres import _sql as q
from stockade.resources.postgres._sync import fence as sync_fence
from stockade.testing.conformance.fence import CLUSTER, KEYS, ROGUE_KEYS, tok
from stockade.testing.servers.postgres import PostgresServer, available, drop_database, fresh_database, shared_server

ROOT = Path(__file__).resolve().parent.parent
LONG = int(os.environ.get("STOCKADE_LONG", "0") or 0)
ATTEMPTS = 100 * (10 if LONG else 1)  # per kind of bad write, per client
RESTARTS = 50 if LONG else 5
WAIT_S = 30.0

if not available():
    if os.environ.get("CI") == "true":
        raise RuntimeError("PostgreSQL 15 is not installed (scripts/test.sh installs it)")
    pytest.skip("PostgreSQL 15 is not installed", allow_module_level=True)


@pytest.fixture
def db() -> Iterator[tuple[PostgresServer, str, psycopg.Connection]]:
    server = shared_server()
    name = fresh_database(server)
    conn = psycopg.connect(server.dsn_of(name), autocommit=True)
    pg.install(conn, keys=KEYS)
    pg.install_ddl_guard(conn)  # the server's superuser: protect covers tables added later
    conn.execute("CREATE TABLE orders (id int PRIMARY KEY, state text NOT NULL)")
    try:
        yield server, name, conn
    finally:
        conn.close()
        drop_database(server, name)


# -- protected tables ----------------------------------------------------------------------------------


def _bad_transactions(current: int) -> dict[str, list[str]]:
    """SQL transactions, by kind, that try to write to ``orders`` (scope "orders") without a current token."""
    stale = tok(current - 1, scope="orders").encode()
    forged = [tok(current + 5, scope="orders", keys=ROGUE_KEYS).encode(),
              tok(current + 5, scope="orders", keys=None).encode(),
              _bad_mac(current + 5)]
    other = tok(current + 5, scope="other").encode()
    writes = ["INSERT INTO orders VALUES ({i}, 'evil')", "UPDATE orders SET state = 'evil'",
              "DELETE FROM orders", "TRUNCATE orders"]

    def each(prefix: str) -> list[str]:
        return [f"BEGIN; {prefix}{writes[i % len(writes)].format(i=1000 + i)}; COMMIT;" for i in range(ATTEMPTS)]

    def setting(token: str, scope: str = "orders") -> str:
        return f"""SET LOCAL stockade.tokens = '{{"{scope}": "{token}"}}'; """

    return {
        "no token": each(""),
        "stale (fence)": each(f"SELECT stockade.fence('{stale}', 'orders'); "),
        "stale (SET LOCAL)": each(setting(stale)),
        "forged (fence)": [t for f in forged for t in each(f"SELECT stockade.fence('{f}', 'orders'); ")][:ATTEMPTS],
        "forged (SET LOCAL)": [t for f in forged for t in each(setting(f))][:ATTEMPTS],
        "other scope (fence)": each(f"SELECT stockade.fence('{other}', 'other'); "),
        "other scope (SET LOCAL)": each(setting(other)),
    }


def _bad_mac(value: int) -> str:
    """A token whose MAC is a real one, of another value."""
    real = tok(value - 1, scope="orders")
    return FencingToken(CLUSTER, "orders", value, real.kid, real.mac).encode()


def _orders(conn: psycopg.Connection) -> list[tuple[int, str]]:
    return conn.execute("SELECT id, state FROM orders ORDER BY id").fetchall()


def _accepted_via_psycopg(conn: psycopg.Connection, transactions: list[str]) -> int:
    accepted = 0
    for text in transactions:
        try:
            conn.execute(text.replace("BEGIN; ", "").replace(" COMMIT;", ""))  # one implicit transaction
            accepted += 1
        except psycopg.Error:
            pass
    return accepted


def _accepted_via_psql(server: PostgresServer, dbname: str, transactions: list[str]) -> int:
    """Runs every transaction in one plain psql session; counts the COMMITs that committed."""
    script = "\\set ON_ERROR_STOP 0\n" + "\n".join(transactions) + "\n"
    result = subprocess.run(
        [*server.psql_argv(dbname), "-f", "-"], input=script, capture_output=True, text=True, timeout=120,
    )
    return result.stdout.split().count("COMMIT")  # a failed transaction's COMMIT prints ROLLBACK


def test_protected_table_refuses_writes_without_a_current_token(db: tuple[PostgresServer, str, psycopg.Connection]
                                                                ) -> None:
    server, dbname, conn = db
    with pg.fenced(conn, tok(10, scope="orders")):
        conn.execute("INSERT INTO orders VALUES (1, 'new')")
    pg.protect(conn, "orders", scope="orders")
    with pg.fenced(conn, tok(11, scope="orders")):  # the current holder still writes
        conn.execute("UPDATE orders SET state = 'paid' WHERE id = 1")
    before = _orders(conn)
    attempts = accepted = 0
    with psycopg.connect(server.dsn_of(dbname), autocommit=True) as plain:  # no stockade code in this session
        for kind, transactions in _bad_transactions(11).items():
            psql_accepted = _accepted_via_psql(server, dbname, transactions)
            psycopg_accepted = _accepted_via_psycopg(plain, transactions)
            print(f"protected table, {kind}: psql accepted {psql_accepted} of {len(transactions)}, "
                  f"psycopg accepted {psycopg_accepted} of {len(transactions)}")
            attempts += 2 * len(transactions)
            accepted += psql_accepted + psycopg_accepted
    assert _orders(conn) == before == [(1, "paid")]
    assert pg.high_waters(conn) == {"orders": 11}
    print(f"protected table: {accepted} of {attempts} bad writes accepted")
    assert accepted == 0 and attempts >= 1400


def test_control_the_same_writes_on_an_unprotected_table_are_accepted(
        db: tuple[PostgresServer, str, psycopg.Connection]) -> None:
    server, dbname, conn = db
    pg.protect(conn, "orders", scope="orders")
    pg.unprotect(conn, "orders")
    transactions = _bad_transactions(11)["no token"]
    assert _accepted_via_psql(server, dbname, transactions) == len(transactions)


def test_protected_table_a_fenced_block_of_another_scope_does_not_open_it(
        db: tuple[PostgresServer, str, psycopg.Connection]) -> None:
    _, _, conn = db
    pg.protect(conn, "orders", scope="orders")
    with pytest.raises(psycopg.Error) as info:
        with pg.fenced(conn, tok(3, scope="other")):
            conn.execute("INSERT INTO orders VALUES (2, 'x')")
    assert info.value.sqlstate == pg.NO_TOKEN_SQLSTATE
    with pytest.raises(TokenMismatch):  # the database's refusal, as the typed error
        with pg.fenced(conn, tok(3, scope="other"), "orders"):
            conn.execute("INSERT INTO orders VALUES (2, 'x')")
    assert _orders(conn) == []


# -- S16: kill -9 of PostgreSQL during fenced writes ---------------------------------------------------


def _crash_run(settings: dict[str, str], restarts: int, seed: int) -> tuple[int, int, int]:
    """Writes under rising tokens while the postmaster is killed ``restarts`` times.

    Returns (HWM rollbacks, acknowledged writes lost, acknowledged writes).
    """
    rng = random.Random(seed)
    server = PostgresServer(settings)
    try:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            pg.install(conn, keys=KEYS)
            conn.execute("CREATE TABLE kv (key int PRIMARY KEY, token bigint NOT NULL)")
            # The set-up made durable whatever the settings: with synchronous_commit off the first kill -9 could
            # lose the fence's own tables (the control once failed with "stockade.high_water does not exist").
            conn.execute("CHECKPOINT")
        acknowledged: dict[int, int] = {}  # key -> token of its acknowledged commit
        rollbacks = 0
        lost: set[int] = set()
        value = 0
        for _ in range(restarts):
            target = len(acknowledged) + rng.randint(5, 40)
            stop = threading.Event()

            def writer(stop: threading.Event = stop) -> None:
                nonlocal value
                try:
                    conn = psycopg.connect(server.dsn, autocommit=True)
                except psycopg.Error:
                    return
                with conn:
                    while not stop.is_set():
                        value += 1
                        try:
                            with pg.fenced(conn, tok(value, scope="s"), keys=KEYS):
                                conn.execute("INSERT INTO kv VALUES (%s, %s)", (value, value))
                        except (BackendUnavailable, psycopg.Error):
                            return
                        acknowledged[value] = value  # the commit returned

            thread = threading.Thread(target=writer)
            thread.start()
            deadline = time.monotonic() + WAIT_S
            while len(acknowledged) < target and thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.001)
            server.kill9()  # while the writer is in the middle of its next transactions
            stop.set()
            thread.join(WAIT_S)
            server.start()
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                mark = pg.high_waters(conn).get("s", 0)
                rows = dict(conn.execute("SELECT key, token FROM kv").fetchall())
            last = max(acknowledged, default=0)
            rollbacks += mark < last
            lost |= {key for key, token in acknowledged.items() if rows.get(key) != token}
        return rollbacks, len(lost), len(acknowledged)
    finally:
        server.close()


def test_s16_kill_9_of_postgres_during_fenced_writes() -> None:
    rollbacks, lost, acked = _crash_run({}, RESTARTS, seed=16)
    print(f"S16 postgres: HWM rollbacks {rollbacks} of {RESTARTS} restarts, "
          f"acknowledged writes lost {lost} of {acked}")
    assert (rollbacks, lost) == (0, 0) and acked >= RESTARTS * 5


def test_s16_control_asynchronous_commit_loses_acknowledged_writes() -> None:
    # With synchronous_commit off, a commit returns before its WAL is written; the WAL writer
    # is held back, so the last commits before each kill are in shared memory only.
    rollbacks, lost, acked = _crash_run({"synchronous_commit": "off", "wal_writer_delay": "10000ms"}, 3, seed=17)
    print(f"S16 control (synchronous_commit=off): HWM rollbacks {rollbacks} of 3, lost {lost} of {acked}")
    assert lost > 0


# -- a writer paused with SIGSTOP ----------------------------------------------------------------------

WRITER = r"""
import sys, psycopg
from stockade.core.errors import StaleToken, BackendUnavailable
from stockade.resources import postgres as pg
dsn, token, mode = sys.argv[1:4]
conn = psycopg.connect(dsn, autocommit=True)
conn.execute("SET idle_in_transaction_session_timeout = '1s'")  # shorter than the supersession bound (2 s)
def out(line):
    print(line, flush=True)
try:
    if mode == "inside":
        with pg.fenced(conn, token):
            conn.execute("INSERT INTO kv VALUES ('A', 'paused')")
            out("in-transaction")
            sys.stdin.readline()
    elif mode == "before":
        out("ready")
        sys.stdin.readline()
        with pg.fenced(conn, token):
            conn.execute("INSERT INTO kv VALUES ('A', 'paused')")
    else:  # check-then-write: read the mark, then write in another transaction
        from stockade.core.fence import decide, Accept
        from stockade.core.tokens import FencingToken
        t = FencingToken.decode(token)
        mark = pg.high_waters(conn).get(t.scope, 0)
        assert isinstance(decide(t, cluster=t.cluster, scope=t.scope, high_water=mark), Accept)
        out("ready")
        sys.stdin.readline()
        conn.execute("INSERT INTO kv VALUES ('A', 'paused')")
    out("committed")
except StaleToken as e:
    out(f"refused stale {e.high_water}")
except BackendUnavailable:
    out("connection lost")
except psycopg.Error as e:  # a driver error must reach the user typed, never raw
    out(f"raw driver error {e.sqlstate}")
"""


def _start_writer(server: PostgresServer, dbname: str, token: str, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen([sys.executable, "-c", WRITER, server.dsn_of(dbname), token, mode], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _resume(writer: subprocess.Popen[str]) -> str:
    os.kill(writer.pid, signal.SIGCONT)
    assert writer.stdin is not None and writer.stdout is not None
    writer.stdin.write("go\n")
    writer.stdin.flush()
    answer = writer.stdout.readline().strip()
    writer.wait(WAIT_S)
    return answer


@pytest.fixture
def kv_db(db: tuple[PostgresServer, str, psycopg.Connection]) -> tuple[PostgresServer, str, psycopg.Connection]:
    server, name, conn = db
    conn.execute("CREATE TABLE kv (key text PRIMARY KEY, value text NOT NULL)")
    with pg.fenced(conn, tok(1, scope="s")):
        pass
    return server, name, conn


def test_writer_paused_inside_its_transaction_blocks_the_higher_token_until_the_server_ends_it(
        kv_db: tuple[PostgresServer, str, psycopg.Connection]) -> None:
    server, dbname, conn = kv_db
    writer = _start_writer(server, dbname, tok(2, scope="s").encode(), "inside")
    assert writer.stdout is not None and writer.stdout.readline().strip() == "in-transaction"
    os.kill(writer.pid, signal.SIGSTOP)
    done = threading.Event()

    def higher() -> None:
        with psycopg.connect(server.dsn_of(dbname), autocommit=True) as other:
            with pg.fenced(other, tok(3, scope="s")):
                other.execute("INSERT INTO kv VALUES ('B', 'current') ON CONFLICT (key) DO UPDATE SET value = "
                              "excluded.value")
        done.set()

    thread = threading.Thread(target=higher)
    thread.start()
    waited = False
    deadline = time.monotonic() + WAIT_S
    while not done.is_set() and time.monotonic() < deadline:  # B is seen waiting on the scope lock (R6)
        waited |= bool(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                    "AND datname = current_database()").fetchone()[0])
        time.sleep(0.01)
    thread.join(WAIT_S)
    assert waited and done.is_set()  # B waited, then went on once the server ended A's idle transaction
    assert _resume(writer) == "connection lost"  # A's commit applied nothing
    assert dict(conn.execute("SELECT key, value FROM kv").fetchall()) == {"B": "current"}
    assert pg.high_waters(conn) == {"s": 3}


@pytest.mark.parametrize("mode, expected", [("before", "refused stale 3"), ("check-then-write", "committed")],
                         ids=["fenced", "control-check-then-write"])
def test_writer_paused_before_its_transaction_is_refused_on_resume(
        kv_db: tuple[PostgresServer, str, psycopg.Connection], mode: str, expected: str) -> None:
    server, dbname, conn = kv_db
    writer = _start_writer(server, dbname, tok(2, scope="s").encode(), mode)
    assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
    os.kill(writer.pid, signal.SIGSTOP)
    with pg.fenced(conn, tok(3, scope="s")):
        conn.execute("INSERT INTO kv VALUES ('B', 'current')")
    assert _resume(writer) == expected
    rows = dict(conn.execute("SELECT key, value FROM kv").fetchall())
    stale_applied = "A" in rows
    assert stale_applied == (mode == "check-then-write")  # the control's stale write lands: the test sees it


# -- install, SQLAlchemy async, the floor by url -------------------------------------------------------


def test_install_twice_at_once_and_again_is_harmless() -> None:
    server = shared_server()
    name = fresh_database(server)
    try:
        errors: list[BaseException] = []

        def run() -> None:
            try:
                with psycopg.connect(server.dsn_of(name), autocommit=True) as conn:
                    pg.install(conn, keys=KEYS)
            except BaseException as error:  # noqa: BLE001
                errors.append(error)

        threads = [threading.Thread(target=run) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        with psycopg.connect(server.dsn_of(name), autocommit=True) as conn:
            assert conn.execute("SELECT version FROM stockade.version").fetchone()[0] == q.SCHEMA_VERSION
            with pg.fenced(conn, tok(4)):
                pass
            pg.install(conn, keys=KEYS)  # again, with a mark in place: it stays
            assert pg.high_waters(conn) == {"a": 4}
            from stockade.keys import FixedKeys, ephemeral_keyring

            with pytest.raises(Exception, match="another|cluster"):
                pg.install(conn, keys=FixedKeys(ephemeral_keyring("0123456789abcdef")))
    finally:
        drop_database(server, name)



def test_install_replaces_an_earlier_check_in_place(db: tuple[PostgresServer, str, psycopg.Connection]) -> None:
    """The check's SQL is upgraded where it is installed, by `install` itself: ``CREATE OR REPLACE`` of the
    functions in the install's transaction (the tables alone have migrations). A database whose
    ``stockade.fence`` is an earlier one (schema 1's, the one earlier text this project keeps) gets the
    current one, and its marks stay. Control: before the install, the earlier function is the one that runs."""
    _, _, conn = db

    def source() -> str:
        return str(conn.execute("SELECT prosrc FROM pg_proc WHERE oid = 'stockade.fence(text, text)'::regprocedure")
                   .fetchone()[0])

    pg._install(conn, KEYS.keyring, CLUSTER, q.STALE_WHEN["decide"], body="advisory")
    with pg.fenced(conn, tok(5)):
        pass
    assert "pg_advisory_xact_lock" in source() and "h.ctid" not in source()  # the control: the earlier check
    pg.install(conn, keys=KEYS)
    assert "pg_advisory_xact_lock" not in source() and "h.ctid" in source()
    assert pg.high_waters(conn) == {"a": 5}
    with pytest.raises(StaleToken):
        with pg.fenced(conn, tok(4)):
            pass
    for value in (5, 6):
        with pg.fenced(conn, tok(value)):
            pass
    assert pg.high_waters(conn) == {"a": 6}

def test_install_in_place_keeps_the_tokens_an_open_transaction_recorded(
        db: tuple[PostgresServer, str, psycopg.Connection]) -> None:
    """Issue 29's check records its tokens as a list, where the check before it wrote a JSON map: a
    transaction that passed the earlier check and writes to a protected table after `install` replaced
    the functions in place is admitted by the new trigger, which reads either; and the new check, the
    mark kept, admits the next transaction and refuses a stale token. Control: a trigger that reads only
    the list refuses that transaction's write."""
    server, dbname, conn = db
    pg.protect(conn, "orders", scope="orders")
    with pg.fenced(conn, tok(5, scope="orders")):
        conn.execute("INSERT INTO orders VALUES (1, 'new')")

    def open_transaction() -> psycopg.Connection:
        """A transaction that passed the earlier check (schema 1's, which writes the JSON map), still open."""
        pg._install(conn, KEYS.keyring, CLUSTER, q.STALE_WHEN["decide"], body="advisory")
        writer = psycopg.connect(server.dsn_of(dbname))
        writer.execute("SELECT stockade.fence(%s, 'orders')", (tok(5, scope="orders").encode(),))
        assert str(writer.execute("SELECT current_setting('stockade.tokens')").fetchone()[0]).startswith("{")
        return writer

    writer = open_transaction()
    pg.install(conn, keys=KEYS)  # in place, while the writer's transaction is open
    assert "'escape'" in str(conn.execute("SELECT prosrc FROM pg_proc WHERE oid = 'stockade.fence(text, text)'"
                                          "::regprocedure").fetchone()[0])
    writer.execute("UPDATE orders SET state = 'paid' WHERE id = 1")
    writer.commit()
    writer.close()
    assert _orders(conn) == [(1, "paid")]
    assert pg.high_waters(conn) == {"orders": 5}
    with pg.fenced(conn, tok(5, scope="orders")):
        conn.execute("UPDATE orders SET state = 'shipped' WHERE id = 1")
    with pytest.raises(StaleToken), pg.fenced(conn, tok(4, scope="orders")):
        conn.execute("UPDATE orders SET state = 'stale' WHERE id = 1")
    assert _orders(conn) == [(1, "shipped")]

    writer = open_transaction()  # the control: the new trigger without its reading of the JSON map
    json_read = "        IF v_token IS NULL AND left(v_setting, 1) = '{' THEN"
    guard = q.guard_function()
    assert guard.count(json_read) == 1
    pg.install(conn, keys=KEYS)
    conn.execute(guard.replace(json_read, "        IF false THEN"))
    with pytest.raises(psycopg.Error) as refused:
        writer.execute("UPDATE orders SET state = 'lost' WHERE id = 1")
    assert refused.value.sqlstate == q.NO_TOKEN_SQLSTATE
    writer.close()
    assert _orders(conn) == [(1, "shipped")]


def test_the_trigger_finds_its_scope_s_token_behind_a_newer_one_whose_scope_ends_like_it(
        db: tuple[PostgresServer, str, psycopg.Connection]) -> None:
    """``stockade.tokens`` lists the transaction's tokens; the trigger of a table protected with scope
    ``orders`` takes the newest token whose scope is ``orders``, read at its place in the token, not a
    newer one of ``x.orders`` that ends the same way: the write is admitted, in either order of the two
    checks. Control: a trigger that takes the newest token ending in ``.orders`` tries the ``x.orders``
    one and refuses the write."""
    _, _, conn = db
    pg.protect(conn, "orders", scope="orders")

    def write(row: int) -> None:
        with pg.fenced(conn, tok(5, scope="orders")), pg.fenced(conn, tok(3, scope="x.orders")):
            conn.execute("INSERT INTO orders VALUES (%s, 'new')", (row,))
        with pg.fenced(conn, tok(3, scope="x.orders")), pg.fenced(conn, tok(5, scope="orders")):
            conn.execute("INSERT INTO orders VALUES (%s, 'new')", (row + 1,))

    write(1)
    assert _orders(conn) == [(1, "new"), (2, "new")]
    exact = ("    IF substr(v_token, CASE left(v_token, 5) WHEN 'stk2.' THEN 56 ELSE 24 END\n"
             "              + length(split_part(v_token, '.', 3))) IS DISTINCT FROM v_scope THEN")
    guard = q.guard_function()
    assert guard.count(exact) == 1
    suffix = "    IF right(v_token, length(v_scope) + 1) IS DISTINCT FROM '.' || v_scope THEN"
    conn.execute(guard.replace(exact, suffix))
    with pytest.raises(TokenMismatch):
        write(3)
    assert _orders(conn) == [(1, "new"), (2, "new")]


def test_sqlalchemy_async_session(db: tuple[PostgresServer, str, psycopg.Connection]) -> None:
    pytest.importorskip("greenlet", reason="SQLAlchemy's asyncio needs greenlet (sqlalchemy[asyncio])")
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    server, dbname, conn = db

    async def main() -> None:
        engine = create_async_engine("postgresql+psycopg://" + server.url(dbname).removeprefix("postgresql://"))
        async with AsyncSession(engine) as session:
            async with pg.fenced_sqlalchemy_async(session, tok(5, scope="orders")):
                await session.execute(text("INSERT INTO orders VALUES (1, 'new')"))
            with pytest.raises(StaleToken):
                async with pg.fenced_sqlalchemy_async(session, tok(4, scope="orders")):
                    await session.execute(text("INSERT INTO orders VALUES (2, 'stale')"))
        async with engine.connect() as aconn:
            async with pg.fenced_sqlalchemy_async(aconn, tok(5, scope="orders")):
                await aconn.execute(text("INSERT INTO orders VALUES (3, 'again')"))
        await engine.dispose()

    asyncio.run(main())
    assert _orders(conn) == [(1, "new"), (3, "again")]


def test_postgres_fence_by_url_raises_floors(db: tuple[PostgresServer, str, psycopg.Connection]) -> None:
    from stockade.core.values import FenceFloors

    server, dbname, conn = db
    with pg.fenced(conn, tok(5, scope="orders")):
        pass
    fence = pg.PostgresFence(server.url(dbname))
    assert fence.high_waters() == {"orders": 5}
    assert fence.raise_high_waters(FenceFloors({"orders": 9, "new": 2}, default=3)) == {"orders": 9, "new": 3}
    assert fence.high_waters() == {"new": 3, "orders": 9} and fence.default_floor() == 3
    with pytest.raises(StaleToken):
        with pg.fenced(conn, tok(8, scope="orders")):
            pass
    with pg.fenced(conn, tok(9, scope="orders")):
        pass


def test_repeatable_read_a_mark_raised_after_the_snapshot_is_never_a_stale_admission(
        kv_db: tuple[PostgresServer, str, psycopg.Connection]) -> None:
    server, dbname, conn = kv_db
    with pg.fenced(conn, tok(2, scope="s")):
        pass
    with psycopg.connect(server.dsn_of(dbname)) as old:  # not autocommit: psycopg begins the transaction
        old.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        old.execute("SELECT count(*) FROM kv")  # its snapshot: the mark is 2
        with pg.fenced(conn, tok(3, scope="s")):  # a newer holder raises it and commits
            conn.execute("INSERT INTO kv VALUES ('B', 'current')")
        with pytest.raises((StaleToken, psycopg.errors.SerializationFailure)):
            with pg.fenced(old, tok(2, scope="s")):
                old.execute("INSERT INTO kv VALUES ('A', 'stale')")
        old.rollback()
    assert dict(conn.execute("SELECT key, value FROM kv").fetchall()) == {"B": "current"}


def test_sync_keys_follows_a_rotation(db: tuple[PostgresServer, str, psycopg.Connection]) -> None:
    import secrets

    from stockade.core.signing import Keyring, SigningKey
    from stockade.keys import FixedKeys

    _, _, conn = db
    old = KEYS.keyring.current
    new = SigningKey("0badc0de", secrets.token_bytes(32), 0, None)
    rotated = FixedKeys(Keyring(CLUSTER, [SigningKey(old.kid, old.secret, 0, 1), new]))  # old retired in 1970
    with pg.fenced(conn, tok(3)):  # the old key, before the rotation reached the database
        pass
    with pytest.raises(TokenMismatch, match="unknown-key"):
        with pg.fenced(conn, rotated.sign(FencingToken(CLUSTER, "a", 4))):
            pass
    pg.sync_keys(conn, rotated)
    with pg.fenced(conn, rotated.sign(FencingToken(CLUSTER, "a", 4))):
        pass
    with pytest.raises(TokenMismatch, match="retired-key"):  # checked by the database (no keys= here)
        with pg.fenced(conn, tok(5)):
            pass
    assert pg.high_waters(conn) == {"a": 4}


def test_a_database_that_verified_refuses_unsigned_install_and_sync(
        db: tuple[PostgresServer, str, psycopg.Connection]) -> None:
    """L2: ``verify_macs`` is set only by keys, so install or sync_keys with ``keys="unsigned"`` on a database
    installed with keys is refused in one line, and the database keeps its keys and keeps verifying."""
    _, _, conn = db
    for attempt in (lambda: pg.install(conn, keys="unsigned", cluster_id=CLUSTER),
                    lambda: pg.sync_keys(conn, "unsigned")):
        with pytest.raises(InvalidArgument, match="has verified signed tokens before") as info:
            attempt()
        assert "\n" not in str(info.value)
    assert conn.execute("SELECT verify_macs, (SELECT count(*) FROM stockade.keys) > 0 FROM stockade.settings"
                        ).fetchone() == (True, True)
    with pytest.raises(TokenMismatch), pg.fenced(conn, tok(5, scope="orders", keys=None)):
        conn.execute("INSERT INTO orders VALUES (1, 'forged')")
    pg.install(conn, keys=KEYS)  # with keys, as often as wanted


# -- the database's own check, without the Python side -----------------------------------------------


def _verdict(conn: psycopg.Connection, token: str, scope: str = "orders") -> str:
    """``stockade.fence`` called as any SQL client would: ``admitted <mark>``, or the refusal it raised."""
    try:
        with conn.transaction():
            return f"admitted {conn.execute('SELECT stockade.fence(%s, %s)', (token, scope)).fetchone()[0]}"
    except psycopg.Error as error:
        detail = error.diag.message_detail or ""
        reason = dict(part.split("=", 1) for part in detail.split() if "=" in part)
        return f"{error.sqlstate} {reason.get('reason', '')} {reason.get('detail', '')}".strip()


def _fast_path_without_mac(conn: psycopg.Connection) -> None:
    """The control: ``stockade.fence`` whose common path takes any signed token whose MAC it computes."""
    schema = conn.execute("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n "
                          "ON n.oid = e.extnamespace WHERE e.extname = 'pgcrypto'").fetchone()[0]
    text = q.fence_function(pgcrypto_schema=schema, stale_when=q.STALE_WHEN["decide"])
    check = "'/', '_')\n               = split_part(token, '.', 5) || '==',"
    assert text.count(check) == 1
    conn.execute(text.replace(check, "'/', '_') IS NOT NULL,"))


@pytest.mark.parametrize("function", ["installed", "control-fast-path-without-mac"])
def test_the_database_refuses_what_the_python_side_would(db: tuple[PostgresServer, str, psycopg.Connection],
                                                         function: str) -> None:
    """Each token SQL can send, through ``stockade.fence`` alone: a signed token of this cluster and scope
    is admitted on the common path; a bad MAC, a token with more after its scope, a value with a leading
    zero, another scope's, an unsigned one, a malformed one and one of neither kind (stk2, stk1) are refused
    as the full check says. Control: a common path that does not compare the MAC admits the bad MAC."""
    _, _, conn = db
    if function != "installed":
        _fast_path_without_mac(conn)
    good = tok(7, scope="orders").encode()
    cases = {
        "good": (good, "orders"),
        "bad-mac": (_bad_mac(8), "orders"),
        "more after the scope": (good + ".x", "orders"),
        "the longer scope asked": (good + ".x", "orders.x"),
        "leading zero": (good.replace(".7.", ".07.", 1), "orders"),
        "another scope": (good, "other"),
        "unsigned": (tok(8, scope="orders", keys=None).encode(), "orders"),
        "malformed": ("stk2.nonsense", "orders"),
        "neither stk2 nor stk1": ("stk3." + good[5:], "orders"),
    }
    verdicts = {name: _verdict(conn, token, scope) for name, (token, scope) in cases.items()}
    expected = {
        "good": "admitted 7",
        "bad-mac": "SKF01 forged bad-mac",
        "more after the scope": "SKF01 forged bad-mac",
        "the longer scope asked": "SKF01 forged bad-mac",
        "leading zero": "22023",
        "another scope": "SKF01 wrong-scope",
        "unsigned": "SKF01 forged unsigned",
        "malformed": "22023",
        "neither stk2 nor stk1": "22023",
    }
    if function != "installed":
        assert verdicts["bad-mac"] == "admitted 8", "the control: a common path without the MAC admits a bad one"
        return
    assert verdicts == expected
    assert conn.execute("SELECT high_water FROM stockade.high_water WHERE scope = 'orders'").fetchone()[0] == 7


def test_a_fenced_block_in_pipeline_mode_begins_its_transaction_apart(
        db: tuple[PostgresServer, str, psycopg.Connection], monkeypatch: pytest.MonkeyPatch) -> None:
    """psycopg's pipeline mode refuses a query of two statements, so there `fenced` begins the transaction
    with ``conn.transaction()`` and checks in it: a current token writes, a stale one is refused and its
    write rolled back. Control: the one-query path (``BEGIN; SELECT stockade.fence(...)``) in pipeline mode
    fails and writes nothing (libpq refuses a simple query there; through a cursor, which the path used
    before, PostgreSQL refused the two statements: every fenced block in pipeline mode failed)."""
    _, _, conn = db
    with conn.pipeline():
        with pg.fenced(conn, tok(7, scope="orders")):
            conn.execute("INSERT INTO orders VALUES (1, 'paid')")
        with pytest.raises(StaleToken), pg.fenced(conn, tok(6, scope="orders")):
            conn.execute("INSERT INTO orders VALUES (2, 'stale')")
    assert conn.execute("SELECT id FROM orders ORDER BY id").fetchall() == [(1,)]
    assert pg.high_waters(conn) == {"orders": 7}

    idle = psycopg.pq.TransactionStatus.IDLE
    monkeypatch.setattr(sync_fence, "_owns_transaction",
                        lambda c: bool(c.autocommit) and c.info.transaction_status == idle)
    with (conn.pipeline(), pytest.raises(BackendUnavailable, match="not allowed in pipeline mode"),
          pg.fenced(conn, tok(7, scope="orders"))):
        conn.execute("INSERT INTO orders VALUES (3, 'control')")
    assert conn.execute("SELECT id FROM orders ORDER BY id").fetchall() == [(1,)]
