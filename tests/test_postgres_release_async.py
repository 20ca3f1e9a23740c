"""The PostgreSQL coordinator's release does not wait for its WAL flush (schema 12); grants and renewals do.

The one-statement release (`stockade.coordinators.postgres._rows.RELEASE_ASYNC`) commits with
``synchronous_commit`` off for its own transaction. What that costs, shown with a real crash on a
PostgreSQL of its own (docs/coordinator-postgres.md, "A release does not wait for the disk"):

- The WAL writer is stopped (SIGSTOP: nothing else writes the WAL of an idle server with autovacuum
  and the background writer's page writes off), a lease is released, and its WAL is not flushed
  (the flush position is behind the insert position). Then the server crashes: the WAL writer is
  killed (SIGKILL), the postmaster ends every other server process and drops its shared memory
  (the WAL buffers with it), and the server starts again from its disk. The release is gone: the
  lease's row is held again, a new acquire waits, and is granted only once the old lease's deadline
  has passed on the server's clock (C3), with a higher token (C1).
- The same, but a grant of another scope commits after the release: it waits for its own flush,
  and WAL is flushed in order, so the release survives the crash.
- Control: schema 11's release (synchronous) survives the same crash, and its WAL is flushed when it
  answers; so does the durable release's test without the grant. Both would fail if the release
  waited for the disk again.

The setting is the release transaction's own: the grant's and the renewal's transactions wait (a
renewal's holder times its lease from it, K2), and the session's setting is untouched after it. With
synchronous standbys the release waits too (an unflushed commit is not sent to a standby).
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

import stockade
from stockade.coordinators.postgres._rows import (
    MIGRATIONS,
    RELEASE_ASYNC,
    RELEASE_ASYNC_LEAN,
    RULE_NAMES,
    SERVER_RULES,
    SERVER_RULES_11,
    SERVER_RULES_12,
    SERVER_RULES_13,
)
from stockade.coordinators.sqlite import new_lease_id
from stockade.testing.servers import postgres as pg_helper

if not pg_helper.available():
    if os.environ.get("CI") == "true":
        raise RuntimeError("PostgreSQL 15 is not installed (scripts/test.sh installs it)")
    pytest.skip("PostgreSQL 15 is not installed", allow_module_level=True)

from helpers.pg_cluster import Pair  # noqa: E402 - the binaries are there

#: The sha256 of migration 11's text as version 11 shipped it (a database that ran it must not see it change).
MIGRATION_11_SHA256 = "3612e9f1bbd308c256c71aaa8d65dadd6f7b03bb9ef9320e4c39d2ee3cf21a43"
#: The same for migration 12 (schema 13 replaced its functions' bodies with a migration of its own).
MIGRATION_12_SHA256 = "4e7ef09e7ca13dbb7237bfaef520873143f37fc0cc2a27d43a4d7b9e8c0738eb"
#: Long enough to outlast the crash and the restart on a busy host; the test waits for it once.
TTL_MS = 3_000
#: Nothing but the test's own statements writes WAL or pages: no autovacuum, no background page writes.
QUIET = {"autovacuum": "off", "bgwriter_lru_maxpages": "0", "checkpoint_timeout": "1h"}


def test_migration_11_is_the_text_version_11_shipped():
    assert hashlib.sha256(MIGRATIONS[10].encode()).hexdigest() == MIGRATION_11_SHA256
    assert MIGRATIONS[10] == SERVER_RULES_11 and "synchronous_commit" not in SERVER_RULES_11
    assert hashlib.sha256(MIGRATIONS[11].encode()).hexdigest() == MIGRATION_12_SHA256
    assert MIGRATIONS[11].endswith(SERVER_RULES_12) and RELEASE_ASYNC in SERVER_RULES_12
    assert MIGRATIONS[12] == SERVER_RULES_13 and RELEASE_ASYNC_LEAN in SERVER_RULES_13  # the same setting since 13
    assert MIGRATIONS[13].endswith(SERVER_RULES) and RELEASE_ASYNC_LEAN in SERVER_RULES  # test_postgres_schema14


@pytest.fixture
def server() -> Iterator[pg_helper.PostgresServer]:
    """A PostgreSQL of this test's own (its WAL writer is stopped and the server crashed)."""
    server = pg_helper.PostgresServer(QUIET)
    try:
        yield server
    finally:
        server.close()


@dataclass(frozen=True)
class AfterCrash:
    """What a crash right after a release left: whether its WAL was flushed when it answered, and the lease."""

    flushed_at_release: bool
    end_kind: str | None  # the released lease's row after the crash: 'release', or None (held again)
    token: int
    expires_ns: int
    next_token: int  # an acquire of the scope after the crash
    next_granted_ns: int


def _walwriter(conn: psycopg.Connection) -> int:
    return int(conn.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'").fetchone()[0])


def _after_recovery(server: pg_helper.PostgresServer, crashed_pid: int) -> psycopg.Connection:
    """A connection once the server has recovered from its crash (the WAL writer ``crashed_pid`` killed).

    The postmaster outlives a child killed by a signal: it ends every other server process, drops
    its shared memory (the WAL buffers with it) and starts again from the disk's WAL, as after a
    power cut, then accepts connections again. A connection made before the postmaster has seen
    the death would still read the old shared memory: the server has recovered once a WAL writer
    other than the killed one runs and recovery is over.
    """
    deadline = time.monotonic() + pg_helper.START_TIMEOUT_S
    while True:
        conn = None
        try:
            conn = psycopg.connect(server.dsn, autocommit=True)
            recovering, walwriter = conn.execute(
                "SELECT pg_is_in_recovery(), (SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter')"
            ).fetchone()
        except psycopg.OperationalError:
            if conn is not None:
                conn.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        if recovering is False and walwriter not in (None, crashed_pid):
            return conn
        conn.close()
        time.sleep(0.05)


def _crash_after_release(server: pg_helper.PostgresServer, *, rules: str | None, grant_after: bool) -> AfterCrash:
    """Grant and release a lease with the WAL writer stopped (then a grant of another scope if ``grant_after``),
    crash the server, start it again, and acquire the scope once more."""
    url = server.url()
    coord = stockade.connect(url)
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        if rules is not None:
            conn.execute(rules)
        lease = coord.acquire("s", ttl_ms=TTL_MS, keepalive=False)
        walwriter = _walwriter(conn)
        os.kill(walwriter, signal.SIGSTOP)
        try:
            lease.release()
            inserted, flushed = conn.execute(
                "SELECT pg_current_wal_insert_lsn(), pg_current_wal_flush_lsn()").fetchone()
            if grant_after:
                coord.acquire("t", ttl_ms=60_000, keepalive=False)
        finally:
            os.kill(walwriter, signal.SIGKILL)  # a crash: the WAL buffers in shared memory are lost
    coord.close()
    with _after_recovery(server, walwriter) as conn:
        end_kind, expires_ns = conn.execute("SELECT end_kind, expires_ns FROM stockade_coord_log WHERE token = %s",
                                            (lease.token.value,)).fetchone()
    coord = stockade.connect(url)
    try:
        again = coord.acquire("s", ttl_ms=TTL_MS, keepalive=False, wait_ms=60_000)
        again.release()
    finally:
        coord.close()
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        granted_ns = conn.execute("SELECT granted_ns FROM stockade_coord_log WHERE token = %s",
                                  (again.token.value,)).fetchone()[0]
    return AfterCrash(flushed >= inserted, end_kind, lease.token.value, expires_ns, again.token.value, granted_ns)


def test_a_release_lost_in_a_crash_leaves_the_lease_held_until_its_deadline(server):
    got = _crash_after_release(server, rules=None, grant_after=False)
    print(f"release not flushed, then a crash: {got}")
    assert not got.flushed_at_release  # it answered before its WAL was on disk
    assert got.end_kind is None  # the crash forgot it: the lease is held again, with its deadline
    assert got.next_granted_ns >= got.expires_ns  # granted again only once that deadline passed (C3)
    assert got.next_token > got.token  # and tokens go on above (C1)


def test_a_grant_after_the_release_makes_it_durable(server):
    got = _crash_after_release(server, rules=None, grant_after=True)
    assert not got.flushed_at_release
    assert got.end_kind == "release"  # the grant's flush wrote the release's WAL too: it survived the crash
    assert got.next_granted_ns < got.expires_ns and got.next_token > got.token  # free at once


def test_control_schema_11s_release_waits_for_the_disk_and_survives_the_crash(server):
    got = _crash_after_release(server, rules=SERVER_RULES_11, grant_after=False)
    assert got.flushed_at_release
    assert got.end_kind == "release"
    assert got.next_granted_ns < got.expires_ns and got.next_token > got.token


def _setting_in(conn: psycopg.Connection, call: str, params: tuple[object, ...]) -> str:
    """``synchronous_commit`` inside a transaction that made ``call``, just before it commits."""
    with conn.transaction():
        assert conn.execute(call, params).fetchone() is not None
        return str(conn.execute("SHOW synchronous_commit").fetchone()[0])


def test_only_the_release_commits_without_waiting_and_only_its_transaction(pg_coord_url):
    stockade.connect(pg_coord_url).close()  # the tables
    grant = f"SELECT token FROM {RULE_NAMES[0]}(%s, %s, 'h', 60000, 100000)"
    keep = f"SELECT scope FROM {RULE_NAMES[1]}(%s, %s)"
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        lease_id = new_lease_id()
        assert _setting_in(conn, grant, ("s", lease_id)) == "on"
        assert _setting_in(conn, keep, (lease_id, False)) == "on"  # a renewal waits (K2)
        assert _setting_in(conn, keep, (lease_id, True)) == "off"  # the release does not
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"  # its transaction's only
        # A release that did not happen (no such lease) writes nothing and changes nothing.
        assert _setting_in(conn, keep, (new_lease_id(), True)) == "on"


def test_with_a_synchronous_standby_the_release_waits_as_every_commit():
    """An unflushed commit is not sent to a standby: with synchronous standbys the release waits, or a failover
    would bring its lease back for a full TTL (test_coordinator_postgres.py's synchronous failover catches it)."""
    pair = Pair(synchronous=True)
    try:
        stockade.connect(pair.url).close()  # the tables
        with psycopg.connect(pair.primary.dsn, autocommit=True) as conn:
            lease_id = new_lease_id()
            assert conn.execute(f"SELECT token FROM {RULE_NAMES[0]}(%s, %s, 'h', 60000, 100000)",
                                ("s", lease_id)).fetchone() is not None
            assert _setting_in(conn, f"SELECT scope FROM {RULE_NAMES[1]}(%s, %s)", (lease_id, True)) == "on"
    finally:
        pair.close()
