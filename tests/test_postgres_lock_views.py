"""The PostgreSQL coordinator's scope locks are views no other role can lock (docs/coordinator-postgres.md).

- **Another role cannot stall a scope.** A role with only ``LOGIN`` (and the ``CONNECT`` every role
  has by default) holds, in an idle session, every advisory key the coordinator ever used (the
  migration's, each test scope's of schema 9), tries to lock every table and lock view of the
  coordinator (``PREPARE ... FOR UPDATE``, ``LOCK TABLE``, ``SELECT ... FOR SHARE``) and to call its
  functions, then sits idle in its open transaction. Meanwhile the coordinator's role runs lock cycles
  on several scopes through every path that takes a scope's lock (the one-statement grant, renewal and
  release; a queued acquire, a renewal and a release with a waiter, a waiter's grant): N of N complete,
  none waits (each statement is bounded by a 1 s statement and lock timeout). Control: schema 9's
  advisory locks (`helpers.pg_schema9`): 0 of N.
- **Migration 9 -> 10 with leases held**: a held lease stays held (its holder renews and releases it),
  tokens keep rising; a process of schema 9 still running fails its next call, typed
  (BackendUnavailable), writing nothing, on both its paths (its functions are gone, its timeline key
  is renamed), instead of locking differently.
- **Privileges**: a role that may not create a schema in the database is refused with the statement
  to grant (nothing installed); an administrator's ``CREATE SCHEMA ... AUTHORIZATION`` is enough; a
  lock schema owned by another role is refused.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from helpers.pg_schema9 import GRANT_9, KEEP_9, as_schema_9

from stockade.coordinators.postgres import PostgresCoordinator
from stockade.coordinators.postgres._rows import (
    LOCK_SCHEMA,
    LOCK_SCOPE,
    MIGRATION_LOCK,
    MIGRATIONS,
    RULE_NAMES,
    SCOPE_LOCK_CLASS,
    SCOPE_LOCKS,
    TIMELINE_KEY,
)
from stockade.coordinators.sqlite import new_lease_id
from stockade.core.errors import BackendUnavailable
from stockade.core.leases import Granted, Queued
from stockade.testing.servers.postgres import keep_what_succeeds

SCOPES = ["billing", "orders", "mail"]
ROUNDS = 2
#: The bound on every statement and lock wait of the honest coordinator: a unit that waited for the outsider fails.
TIMEOUT_MS = 1_000


#: The sha256 of migration 9's text as version 9 shipped it: schema 10 parameterised the functions' SQL
#: (`server_rules`), and the migrations a database already ran must stay what they were.
MIGRATION_9_SHA256 = "aa130672700d893adee814f2aa31184c70534fe36db5f7cf7468b0f7b98f22d0"


def test_migration_9_is_the_text_version_9_shipped():
    assert hashlib.sha256(MIGRATIONS[8].encode()).hexdigest() == MIGRATION_9_SHA256
    assert "pg_advisory_xact_lock" in MIGRATIONS[8] and "pg_advisory_xact_lock" not in MIGRATIONS[9]


def _as_role(url: str, role: str) -> str:
    return url.replace("postgresql://postgres@", f"postgresql://{role}@", 1)


@pytest.fixture
def role(pg_coord_url: str) -> Iterator[str]:
    """A role that may log in, and nothing else (the database's CONNECT is PUBLIC's by default)."""
    name = f"stockade_other_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN")
    yield name
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
        conn.execute(f"DROP OWNED BY {name}")
        conn.execute(f"DROP ROLE {name}")


def _hold_what_it_can(conn: psycopg.Connection) -> list[str]:
    """As the other role: every advisory key, then every lock it can get on the coordinator's relations."""
    conn.execute("SET idle_in_transaction_session_timeout = 0")
    held = []
    keys = [f"pg_advisory_lock({MIGRATION_LOCK})"]
    keys += [f"pg_advisory_lock({SCOPE_LOCK_CLASS}, hashtext('{s}'))" for s in SCOPES]
    for key in keys:  # session locks: outside any transaction, no idle timeout applies
        conn.execute(f"SELECT {key}")
        held.append(key)
    relations = [r[0] for r in conn.execute(
        "SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind IN ('r', 'v') AND (c.relname LIKE 'stockade_coord%%' OR n.nspname = %s) ORDER BY 1",
        (LOCK_SCHEMA,)).fetchall()]
    relations += [f"{LOCK_SCHEMA}.scope_lock_{n}" for n in range(SCOPE_LOCKS)]  # even if it could not list them
    attempts = []
    for n, relation in enumerate(dict.fromkeys(relations)):
        attempts += [f"PREPARE p{n} AS SELECT * FROM {relation} FOR UPDATE", f"LOCK TABLE {relation} IN EXCLUSIVE MODE",
                     f"LOCK TABLE {relation} IN ACCESS SHARE MODE", f"SELECT 1 FROM {relation} FOR SHARE"]
    attempts += [f"SELECT {LOCK_SCOPE.format(scope=repr(s))}" for s in SCOPES]
    attempts += [f"SELECT * FROM {RULE_NAMES[0]}('{s}', 'x', 'x', 60000, 100000)" for s in SCOPES]
    conn.execute("BEGIN")
    return held + keep_what_succeeds(conn, attempts)


def _cycle(coord: PostgresCoordinator, scope: str) -> float:
    """One lock cycle on ``scope`` through every path that locks it; the slowest step's time (s)."""
    a, b = new_lease_id(), new_lease_id()
    times = []

    def timed(ok: object) -> None:
        times.append(time.monotonic())
        assert ok, f"step {len(times)} of {scope}"

    def queue_b() -> object:  # the engine's path: the scope's lock comes with BEGIN
        return coord.attempt(scope, lease_id=b, holder="b", ttl_ms=60_000, wait_ms=60_000,
                             wait_deadline_ns=coord.clock.now_ns() + 60_000_000_000).outcome

    times.append(time.monotonic())
    timed(isinstance(coord.attempt(scope, lease_id=a, holder="a", ttl_ms=60_000, wait_ms=0).outcome, Granted))
    timed(coord.renew(a).lease_id == a)  # one statement each (the server's grant and renewal)
    timed(isinstance(queue_b(), Queued))
    timed(coord.renew(a).lease_id == a)  # with a waiter: the engine's path, locked by the lease id
    timed(coord.release(a).released)
    timed(isinstance(queue_b(), Granted))
    timed(coord.release(b).released)  # one statement
    return max(later - earlier for earlier, later in zip(times, times[1:], strict=False))


def _honest_cycles(url: str) -> tuple[int, int, float, list[str]]:
    """Lock cycles on `SCOPES` by a coordinator opened now; (completed, tried, slowest step s, failures)."""
    coord = PostgresCoordinator(url, statement_timeout_ms=TIMEOUT_MS)
    completed = tried = 0
    slowest = 0.0
    failures: list[str] = []
    try:
        for _ in range(ROUNDS):
            for scope in SCOPES:
                tried += 1
                try:
                    slowest = max(slowest, _cycle(coord, scope))
                    completed += 1
                except BackendUnavailable as exc:
                    failures.append(f"{scope}: {exc}")
    finally:
        coord.close()
    return completed, tried, slowest, failures


@pytest.mark.parametrize("schema", ["views", "advisory"])
def test_another_role_cannot_stall_a_scope(pg_coord_url, role, schema, monkeypatch):
    if schema == "advisory":
        as_schema_9(monkeypatch)  # the control: schema 9, whose locks any role can take
    PostgresCoordinator(pg_coord_url).close()  # installed by the coordinator's role
    with psycopg.connect(_as_role(pg_coord_url, role), autocommit=True) as other:
        held = _hold_what_it_can(other)
        completed, tried, slowest, failures = _honest_cycles(pg_coord_url)
        other.execute("ROLLBACK")
    print(f"\n{schema}: {completed} of {tried} lock cycles completed (slowest step {slowest * 1000:.0f} ms); "
          f"the other role held {held}; {failures[:1]}")
    assert any("pg_advisory_lock" in h for h in held) and any("PREPARE" in h for h in held)
    assert not [h for h in held if LOCK_SCHEMA in h or RULE_NAMES[0] in h]  # no lock view, no function
    if schema == "views":
        assert (completed, tried) == (len(SCOPES) * ROUNDS,) * 2, failures
    else:
        assert completed == 0 and len(failures) == tried, failures


def _new_process_connects(url: str) -> None:
    """The upgrade, by a process of the current version (a real one: this one runs schema 9)."""
    src = os.path.join(os.path.dirname(__file__), os.pardir, "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.abspath(src), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", f"import stockade; stockade.connect({url!r}).close()"],
                   check=True, env=env, timeout=120)


def test_migration_9_to_10_with_leases_held(pg_coord_url, monkeypatch):
    as_schema_9(monkeypatch)
    old = PostgresCoordinator(pg_coord_url)  # a process of schema 9, with a lease held and a scope cycled
    try:
        held = old.attempt("held", lease_id=new_lease_id(), holder="h", ttl_ms=600_000, wait_ms=0).outcome
        assert isinstance(held, Granted)
        cycled = []
        for _ in range(3):
            lease = old.attempt("cycled", lease_id=new_lease_id(), holder="c", ttl_ms=60_000, wait_ms=0).outcome
            assert isinstance(lease, Granted) and old.release(lease.lease.lease_id).released
            cycled.append(lease.lease.token.value)
        _new_process_connects(pg_coord_url)
        with psycopg.connect(pg_coord_url, autocommit=True) as conn:
            before = conn.execute("SELECT scope, last_token FROM stockade_coord_scopes ORDER BY scope").fetchall()
        # The process of schema 9 fails its next call on both its paths, typed, and writes nothing.
        for statement, params in [(GRANT_9, ("s2", new_lease_id(), "old", 30_000, 100_000)),
                                  (KEEP_9, (held.lease.lease_id, False))]:
            with pytest.raises(BackendUnavailable, match="does not exist") as caught:
                old.records.call(statement, params)
            assert caught.value.certain_no_effect
        with pytest.raises(BackendUnavailable, match="not initialised"):  # its engine's path (advisory locks)
            old.attempt("s3", lease_id=new_lease_id(), holder="old", ttl_ms=30_000, wait_ms=1_000,
                        wait_deadline_ns=old.clock.now_ns() + 1_000_000_000)
        with psycopg.connect(pg_coord_url, autocommit=True) as conn:
            after = conn.execute("SELECT scope, last_token FROM stockade_coord_scopes ORDER BY scope").fetchall()
        assert after == before
    finally:
        old.close()
    monkeypatch.undo()
    new = PostgresCoordinator(pg_coord_url)
    try:
        assert new.inspect("held").token.value == held.lease.token.value  # still held, by its holder
        late = new.attempt("held", lease_id=new_lease_id(), holder="late", ttl_ms=60_000, wait_ms=0).outcome
        assert not isinstance(late, Granted)
        assert new.renew(held.lease.lease_id).token.value == held.lease.token.value
        assert new.release(held.lease.lease_id).released
        tokens = {s: new.attempt(s, lease_id=new_lease_id(), holder="n", ttl_ms=60_000, wait_ms=0).outcome
                  for s in ("held", "cycled")}
        assert tokens["held"].lease.token.value > held.lease.token.value
        assert tokens["cycled"].lease.token.value > max(cycled)
    finally:
        new.close()
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        meta = dict(conn.execute("SELECT k, v FROM stockade_coord_meta").fetchall())
    assert meta["schema_version"] == str(len(MIGRATIONS)) == "14" and "timeline" not in meta and TIMELINE_KEY in meta


def test_a_role_that_may_not_create_a_schema_is_told_what_to_grant(pg_coord_url, role):
    db = pg_coord_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        conn.execute(f"GRANT CREATE ON SCHEMA public TO {role}")  # its tables, as an application's role has
    url = _as_role(pg_coord_url, role)
    with pytest.raises(BackendUnavailable, match=f"GRANT CREATE ON DATABASE {db} TO {role}") as caught:
        PostgresCoordinator(url)
    assert caught.value.certain_no_effect
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:  # nothing installed: one transaction
        assert conn.execute("SELECT to_regclass('stockade_coord_meta')").fetchone()[0] is None
        conn.execute(f"CREATE SCHEMA {LOCK_SCHEMA} AUTHORIZATION {role}")  # the documented alternative
    coord = PostgresCoordinator(url)
    try:
        outcome = coord.attempt("s", lease_id=new_lease_id(), holder="h", ttl_ms=10_000, wait_ms=0).outcome
        assert isinstance(outcome, Granted) and coord.release(outcome.lease.lease_id).released
    finally:
        coord.close()


def test_a_lock_schema_of_another_role_is_refused(pg_coord_url, role):
    with psycopg.connect(pg_coord_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {LOCK_SCHEMA} AUTHORIZATION {role}")  # whoever owns it could take the locks
    with pytest.raises(BackendUnavailable, match=f"ALTER SCHEMA {LOCK_SCHEMA} OWNER TO postgres"):
        PostgresCoordinator(pg_coord_url)


def test_a_scope_locks_its_view_exclusively_and_writes_no_wal(pg_coord_url):
    """The lock a unit holds: EXCLUSIVE on one view, no advisory lock; taking it assigns no transaction id,
    so it writes nothing (the WAL a whole lock cycle writes is counted in tests/test_postgres_wal_per_cycle.py)."""
    PostgresCoordinator(pg_coord_url).close()
    with psycopg.connect(pg_coord_url) as conn:
        conn.execute(f"SELECT {LOCK_SCOPE.format(scope='%s')}", ("billing",))
        locks = conn.execute(
            "SELECT l.locktype, l.mode, c.relname FROM pg_locks l LEFT JOIN pg_class c ON c.oid = l.relation "
            "WHERE l.pid = pg_backend_pid() AND (l.locktype = 'advisory' OR c.relname LIKE 'scope_lock%%')"
        ).fetchall()
        xid = conn.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()[0]
        view = conn.execute(f"SELECT hashtext('billing') & {SCOPE_LOCKS - 1}").fetchone()[0]
        conn.rollback()
    assert locks == [("relation", "ExclusiveLock", f"scope_lock_{view}")] and xid is None
