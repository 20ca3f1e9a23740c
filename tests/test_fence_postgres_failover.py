"""PostgreSQL failover and the floor (R4): a promoted standby must not take back an old token.

A primary streams to a standby made with ``pg_basebackup -R``. The primary is
killed with SIGKILL after writes under token t, and the standby is promoted
with ``pg_ctl promote``.

- **Asynchronous standby**, behind the primary when it died: the promoted
  standby's mark is older than t, so an old token writes again. That is the
  control, and the test shows that it happens. After `raise_high_waters` to
  the coordinator's floor (its last issued token, t), 0 of 20 old-token writes
  are accepted, and the current holder (t) still writes.
- **Synchronous standby** (``synchronous_standby_names``): every acknowledged
  commit, marks included, reached the standby before the primary answered, so
  0 of 20 old-token writes are accepted with no floor at all.
"""

from __future__ import annotations

import os

import psycopg
import pytest

from stockade.core.errors import StaleToken
from stockade.resources import postgres as pg
from stockade.testing.conformance.fence import KEYS, tok
from stockade.testing.servers.postgres import PostgresServer, available

OLD_TOKEN_WRITES = 20
LAST_ISSUED = 60  # t: the coordinator's last issued token for scope "s"

if not available():
    if os.environ.get("CI") == "true":
        raise RuntimeError("PostgreSQL 15 is not installed (scripts/test.sh installs it)")
    pytest.skip("PostgreSQL 15 is not installed", allow_module_level=True)

from helpers.pg_cluster import promote as _promote  # noqa: E402 - shared with the coordinator's failover tests
from helpers.pg_cluster import standby_of as _standby_of  # noqa: E402
from helpers.pg_cluster import wait_until as _wait  # noqa: E402


def _write(server: PostgresServer, value: int) -> bool:
    """One fenced write under token ``value`` on ``server``; whether it was accepted."""
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        try:
            with pg.fenced(conn, tok(value, scope="s")):
                conn.execute("INSERT INTO kv VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET token = excluded.token",
                             (f"k{value % 3}", value))
        except StaleToken:
            return False
    return True


def _mark(server: PostgresServer) -> int:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        return pg.high_waters(conn).get("s", 0)


def _pair() -> tuple[PostgresServer, PostgresServer]:
    primary = PostgresServer()
    with psycopg.connect(primary.dsn, autocommit=True) as conn:
        pg.install(conn, keys=KEYS)
        conn.execute("CREATE TABLE kv (key text PRIMARY KEY, token bigint NOT NULL)")
    try:
        return primary, _standby_of(primary)
    except BaseException:
        primary.close()
        raise


def test_async_standby_old_tokens_write_again_until_the_floor_is_raised() -> None:
    primary, standby = _pair()
    try:
        for value in range(1, 6):
            assert _write(primary, value)
        _wait(lambda: _mark(standby) == 5, "the standby to replay token 5")
        standby.stop()  # the standby falls behind: what an async standby may be when the primary dies
        for value in range(6, LAST_ISSUED + 1):
            assert _write(primary, value)  # acknowledged by the primary alone
        primary.kill9()
        standby.start()
        _promote(standby)
        assert _mark(standby) == 5  # the promoted standby forgot the marks 6..t

        # The control: before the floor, old tokens (issued before t, fenced out on the old primary) write again.
        old = range(LAST_ISSUED - 2 * OLD_TOKEN_WRITES, LAST_ISSUED - OLD_TOKEN_WRITES)
        accepted_before = sum(_write(standby, value) for value in old)
        print(f"async standby, before the floor: {accepted_before} of {len(old)} old-token writes accepted")
        assert accepted_before > 0

        with psycopg.connect(standby.dsn, autocommit=True) as conn:  # what `stockade floor` does
            assert pg.raise_high_waters(conn, {"s": LAST_ISSUED}) == {"s": LAST_ISSUED}
        old = range(LAST_ISSUED - OLD_TOKEN_WRITES, LAST_ISSUED)
        accepted_after = sum(_write(standby, value) for value in old)
        print(f"async standby, after the floor: {accepted_after} of {len(old)} old-token writes accepted")
        assert accepted_after == 0 and len(old) >= 20
        assert _write(standby, LAST_ISSUED)  # the current holder carries on
    finally:
        standby.close()
        primary.close()


def test_sync_standby_old_tokens_are_refused_without_a_floor() -> None:
    primary, standby = _pair()
    try:
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")
            _wait(lambda: conn.execute("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
                  .fetchone()[0] == 1, "the standby to be synchronous")
        for value in range(1, LAST_ISSUED + 1):
            assert _write(primary, value)  # each commit returned after the standby flushed it
        primary.kill9()
        _promote(standby)
        assert _mark(standby) == LAST_ISSUED
        old = range(LAST_ISSUED - OLD_TOKEN_WRITES, LAST_ISSUED)
        accepted = sum(_write(standby, value) for value in old)
        print(f"sync standby, no floor: {accepted} of {len(old)} old-token writes accepted")
        assert accepted == 0 and len(old) >= 20
        assert _write(standby, LAST_ISSUED)
    finally:
        standby.close()
        primary.close()
