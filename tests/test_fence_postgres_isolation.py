"""The PostgreSQL fence at every isolation level, and against a role that may only connect (docs/fence-postgres.md).

- A transaction that took its snapshot before `raise_high_waters` committed, then
  fences a scope the floor covers only through its default: refused (StaleToken)
  or a serialization failure, never committed, at REPEATABLE READ and
  SERIALIZABLE (`ROUNDS` per level; ``STOCKADE_FLOOR_ROUNDS`` or
  ``STOCKADE_LONG=1`` for the figure). The same when the check itself waited
  at the floor's gate while the raise committed, at all three levels.
- An aborted raise leaves no trace: REPEATABLE READ checks after it are admitted.
- What a role that may only connect can hold, and what it cannot: the views the
  check locks and the mark rows are out of its reach, so 6 of 6 honest writes
  and a floor raise complete.
- A check holds the floor's gate and no advisory lock; the WAL a fenced
  transaction writes, counted (the locks write nothing).
- A higher token is not starved by writers of the current one that keep
  overlapping transactions open (control: the row lock, FOR SHARE).
- Installs at once on a database whose default isolation is REPEATABLE READ or
  SERIALIZABLE: none fails (control: the install's transaction at that default);
  key syncs at once, at any default: none fails (control: without the install's
  lock, at the session's level); `protect`, `unprotect` and `install_ddl_guard`
  at once, at any default: none fails (control: without the lock, at the
  session's level). `protect`s of two different trees at once, at any default:
  none fails, and one waits for the other (the lock is the database's), even
  while the other waits for its tree's writers (control: without the lock, it
  does not wait).

Control, unless a test says otherwise: schema 1's function (``advisory``,
`_postgres_sql.FENCE_BODIES`), which read the floor through the snapshot and
locked with advisory keys.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable, Iterator

import psycopg
import pytest
from conftest import PG_ISOLATION_VARIANTS, PG_VARIANTS, fresh_pg_url
from helpers.at_once import errors_at_once

from stockade.core.errors import StaleToken
from stockade.resources import postgres as pg
from stockade.resources.postgres import _sql as q
from stockade.testing.conformance.fence import CLUSTER, KEYS, tok
from stockade.testing.conformance.fence_isolation import check_floor_raised_mid_transaction, check_outsider_cannot_stall
from stockade.testing.fences.postgres import OUTSIDER_ROLE, PgHarness, make_postgres_harness
from stockade.testing.servers.postgres import available

if not available():
    if os.environ.get("CI") == "true":
        raise RuntimeError("PostgreSQL 15 is not installed (scripts/test.sh installs it)")
    pytest.skip("PostgreSQL 15 is not installed", allow_module_level=True)

#: Rounds per isolation level (the figure: >= 30 per level, >= 60 in all).
ROUNDS = int(os.environ.get("STOCKADE_FLOOR_ROUNDS", "0") or 0) or (
    30 if os.environ.get("STOCKADE_LONG") == "1" else 10)
LEVELS = {"read committed": psycopg.IsolationLevel.READ_COMMITTED,
          "repeatable read": psycopg.IsolationLevel.REPEATABLE_READ,
          "serializable": psycopg.IsolationLevel.SERIALIZABLE}
WAIT_S = 30.0


@pytest.fixture(params=["private", "advisory"])
def harness(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[PgHarness]:
    opened = make_postgres_harness("postgres")(tmp_path, CLUSTER, KEYS,
                                               None if request.param == "private" else "advisory-locks")
    yield opened
    opened.close()


@pytest.fixture
def rows(tmp_path: object) -> Iterator[PgHarness]:
    opened = make_postgres_harness("postgres")(tmp_path, CLUSTER, KEYS, None)
    yield opened
    opened.close()


def _body(harness: PgHarness) -> str:
    return "advisory" if harness.mutant == "advisory-locks" else "private"


def test_a_floor_raised_after_the_snapshot_is_never_committed_below(harness: PgHarness) -> None:
    admitted = check_floor_raised_mid_transaction(harness, rounds=ROUNDS)
    total = sum(admitted.values())
    print(f"\n{_body(harness)}: admitted below the floor {total} of {ROUNDS * len(admitted)} {admitted}")
    if _body(harness) == "private":
        assert total == 0, admitted
    else:  # the control: schema 1 read the default floor through the old snapshot
        assert admitted == {level: ROUNDS for level in admitted}


def _waiting(admin: psycopg.Connection, pid: int) -> bool:
    row = admin.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row is not None and row[0] == "Lock"


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_a_floor_raised_while_the_check_waits_at_the_gate(harness: PgHarness, level: str) -> None:
    """The raise holds the gate (and schema 1's key, for the control); the check, the first
    statement of its transaction, waits for it; the raise commits; the check must refuse."""
    admin, dsn = harness.admin, harness.server.dsn_of(harness.dbname)
    admitted = rounds = 0
    for i in range(ROUNDS // 2 or 1):
        scope, floor = f"gate-{i}", 100 * (i + 1)
        rounds += 1
        with psycopg.connect(dsn) as raiser, psycopg.connect(dsn) as old:
            raiser.execute(f"LOCK TABLE {q.FLOOR_GATE} IN ACCESS EXCLUSIVE MODE")
            raiser.execute("SELECT pg_advisory_xact_lock(%s)", (q.FLOOR_LOCK_KEY,))
            raiser.execute("UPDATE stockade.settings SET default_floor = greatest(default_floor, %s)", (floor,))
            old.isolation_level = LEVELS[level]
            outcome: list[object] = []

            def check(old: psycopg.Connection = old, scope: str = scope, floor: int = floor,
                      outcome: list[object] = outcome) -> None:
                try:
                    with pg.fenced(old, tok(floor - 1, scope=scope)):
                        old.execute("INSERT INTO kv VALUES (%s, 'k', 'below')", (scope,))
                    old.commit()
                    outcome.append("committed")
                except (StaleToken, psycopg.errors.SerializationFailure) as error:
                    old.rollback()
                    outcome.append(error)

            pid = old.info.backend_pid
            thread = threading.Thread(target=check)
            thread.start()
            for _ in range(int(WAIT_S / 0.01)):  # until the check waits for the raise's lock
                if _waiting(admin, pid):
                    break
                thread.join(0.01)
            assert _waiting(admin, pid), "the check did not wait at the gate"
            raiser.commit()
            thread.join(WAIT_S)
            assert outcome, "the check did not end"
            admitted += outcome[0] == "committed"
    print(f"\n{_body(harness)}, {level}: admitted below the floor {admitted} of {rounds}")
    if _body(harness) == "private" or level == "read committed":
        assert admitted == 0
    else:  # the control: its statement's snapshot was taken before it waited
        assert admitted == rounds


def test_an_aborted_raise_leaves_no_trace_at_repeatable_read(rows: PgHarness) -> None:
    """A raise that rolled back leaves its xmax on the settings row: the check sees it aborted."""
    harness = rows
    dsn = harness.server.dsn_of(harness.dbname)
    with psycopg.connect(dsn) as raiser:
        raiser.execute("UPDATE stockade.settings SET default_floor = 50")
        raiser.rollback()
    for n in range(3):
        with psycopg.connect(dsn) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            with pg.fenced(conn, tok(n + 1, scope="after-abort")):
                conn.execute("INSERT INTO kv VALUES ('after-abort', %s, 'ok')", (str(n),))
            conn.commit()
    assert harness.high_water("after-abort") == 3


def test_what_a_role_that_may_only_connect_can_hold(rows: PgHarness) -> None:
    """6 of 6 honest writes and the floor raise complete, and the role holds none of what they need.

    The control (schema 1's advisory keys, held by the outsider, freeze 6 of 6) is the conformance
    kit's, at the same size: test_fence_conformance.py, test_the_optional_capabilities_catch_their_control."""
    harness = rows
    completed, tried, floor_raised, held = check_outsider_cannot_stall(harness, write_s=20.0)
    privileges = harness.admin.execute(
        "SELECT rolsuper, rolcreatedb, rolcreaterole, has_database_privilege(%s, current_database(), 'CREATE'), "
        "has_database_privilege(%s, current_database(), 'TEMP'), "
        "has_schema_privilege(%s, 'stockade_private', 'USAGE') FROM pg_roles WHERE rolname = %s",
        (OUTSIDER_ROLE,) * 4).fetchone()
    print(f"\nhonest writes completed {completed} of {tried}, floor raised {floor_raised}; the outsider held {held}")
    assert privileges == (False, False, False, False, False, False)
    assert not [h for h in held if "floor_gate" in h or "FOR " in h]  # the gate and the mark rows are out of reach
    assert any("pg_advisory_lock" in h for h in held) and any("PREPARE" in h for h in held)
    assert (completed, tried, floor_raised) == (6, 6, True)


def test_a_check_holds_the_gate_and_only_its_identity_advisory_locks(rows: PgHarness) -> None:
    """The only advisory locks a check holds are its identity (scope, token) for supersession: two,
    shared, taken without waiting (pg_try_advisory_xact_lock_shared), so no other role can stall it."""
    conn = rows.conn
    with pg.fenced(conn, tok(3, scope="held")):
        rows = conn.execute("SELECT locktype, relation::regclass::text, mode, objid::bigint FROM pg_locks "
                            "WHERE pid = pg_backend_pid() AND locktype IN ('relation', 'advisory')").fetchall()
    assert ("relation", q.FLOOR_GATE, "AccessShareLock", None) in rows
    assert sorted((r[2], r[3]) for r in rows if r[0] == "advisory") == [("ShareLock", 0), ("ShareLock", 3)]


#: WAL records per fenced transaction of one upsert into ``kv`` (the user's own upsert writes a LOCK
#: and a HOT_UPDATE), by token: equal to the mark, or raising it (the mark's upsert: a LOCK and a
#: HOT_UPDATE more). The same for schema 1's function: the locks write nothing.
_EQUAL = {"Heap/HOT_UPDATE": 1.0, "Heap/LOCK": 1.0, "Transaction/COMMIT": 1.0}
_HIGHER = {"Heap/HOT_UPDATE": 2.0, "Heap/LOCK": 2.0, "Transaction/COMMIT": 1.0}
WAL_PER_TRANSACTION = {("private", "equal"): _EQUAL, ("advisory", "equal"): _EQUAL,
                       ("private", "higher"): _HIGHER, ("advisory", "higher"): _HIGHER}
WAL_TRANSACTIONS = 100


@pytest.mark.parametrize("kind", ["equal", "higher"])
def test_the_wal_a_fenced_transaction_writes(harness: PgHarness, kind: str) -> None:
    """Counted, not timed: the views' locks write nothing, as schema 1's advisory locks did (a row
    lock, FOR SHARE, would write a Heap/LOCK record in every transaction)."""
    admin, conn = harness.admin, harness.conn
    admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    upsert = ("INSERT INTO kv VALUES ('a', 'k', 'v') ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value")
    for _ in range(20):  # warm up: the rows exist, the plans are cached
        with pg.fenced(conn, tok(9)):
            conn.execute(upsert)
    start = admin.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    xids = []  # this test's own transactions: the server is shared with other tests running meanwhile
    for i in range(WAL_TRANSACTIONS):
        with pg.fenced(conn, tok(9 if kind == "equal" else 10 + i)):
            conn.execute(upsert)
            xids.append(conn.execute("SELECT txid_current() % 4294967296").fetchone()[0])
    end = admin.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
    rows = admin.execute(
        "SELECT resource_manager || '/' || record_type, count(*) FROM pg_get_wal_records_info(%s, %s) "
        "WHERE xid::text::bigint = ANY(%s) AND resource_manager <> 'Heap2' GROUP BY 1",
        (str(start), str(end), xids)).fetchall()
    got = {name: round(n / WAL_TRANSACTIONS, 2) for name, n in rows}  # Heap2: a prune now and then
    assert got == WAL_PER_TRANSACTION[(_body(harness), kind)]


#: The row-lock design this replaced, as a mutant of the function: FOR SHARE lockers do not queue
#: behind a waiting FOR NO KEY UPDATE (the control of the fairness test).
_ROW_LOCK = ("IF v_value > v_own THEN PERFORM 1 FROM stockade.high_water h WHERE h.scope = fence.scope "
             "FOR NO KEY UPDATE; ELSE PERFORM 1 FROM stockade.high_water h WHERE h.scope = fence.scope FOR SHARE; "
             "END IF;")
WRITERS = 8


def _install_row_locks(harness: PgHarness) -> None:
    schema = harness.admin.execute("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n "
                                   "ON n.oid = e.extnamespace WHERE e.extname = 'pgcrypto'").fetchone()[0]
    text = q.fence_function(pgcrypto_schema=schema, stale_when=q.STALE_WHEN["decide"])
    start = text.index("    IF v_value > v_own THEN\n        v_void := stockade_private.raise_lock")
    end = text.index("END IF;", start) + len("END IF;")
    harness.admin.execute(text[:start] + "    " + _ROW_LOCK + text[end:])


#: The control's rounds: its starvation depends on the writers keeping the row lock held between them,
#: which a loaded host sometimes fails to do (once 8 jumped, not more): it must show in one of them.
CONTROL_ROUNDS = 3


@pytest.mark.parametrize("locks", ["private", "row-locks"])
def test_a_higher_token_is_not_starved_by_overlapping_writers_of_the_current_one(rows: PgHarness,
                                                                                 locks: str) -> None:
    """8 writers of the current token keep overlapping transactions open; a higher token comes.

    Counted: the current token's commits after the higher token was seen waiting for its lock, until
    it committed or more than 10 x 8 had jumped it. First come, first served, only the transactions
    open when it arrived may commit before it (at most 8). Control: a row lock (FOR SHARE), whose
    lockers jump the queue (more than 8 jump it in one of `CONTROL_ROUNDS` rounds, each with a new scope).
    """
    if locks == "row-locks":
        _install_row_locks(rows)
    for round_ in range(1 if locks == "private" else CONTROL_ROUNDS):
        jumped, outcome = _starvation_round(rows, f"busy{round_}")
        print(f"\n{locks}: {jumped} commits of the current token after the higher one waited; {outcome}")
        if locks == "private":
            assert outcome == ["committed"] and jumped <= WRITERS
        elif jumped > WRITERS:  # the property's negation: more jumped it than were open when it came (50-83 seen)
            return
    if locks != "private":
        pytest.fail(f"the row-lock control never starved the raise in {CONTROL_ROUNDS} rounds")


def _starvation_round(harness: PgHarness, scope: str) -> tuple[int, list[object]]:
    with pg.fenced(harness.conn, tok(5, scope=scope)):
        pass
    stop, committed, lock = threading.Event(), [0], threading.Lock()

    def writer() -> None:
        with psycopg.connect(harness.server.dsn_of(harness.dbname), autocommit=True) as conn:
            while not stop.is_set():
                try:
                    with pg.fenced(conn, tok(5, scope=scope)):
                        conn.execute("SELECT pg_sleep(0.02)")  # a transaction that does some work
                except StaleToken:
                    return
                with lock:
                    committed[0] += 1

    threads = [threading.Thread(target=writer) for _ in range(WRITERS)]
    for thread in threads:
        thread.start()
    raiser = psycopg.connect(harness.server.dsn_of(harness.dbname), autocommit=True)
    raiser.execute("SET lock_timeout = '20s'")  # the control's bound: a starved raise gives up
    done, outcome = threading.Event(), []

    def raise_it() -> None:
        try:
            with pg.fenced(raiser, tok(6, scope=scope)):
                pass
            outcome.append("committed")
        except psycopg.Error as error:
            outcome.append(error)
        done.set()

    try:
        while committed[0] < 3 * WRITERS:  # all writers under way
            stop.wait(0.01)
        pid = raiser.info.backend_pid
        raising = threading.Thread(target=raise_it)
        raising.start()
        while not done.is_set() and not _waiting(harness.admin, pid):
            done.wait(0.001)
        seen_waiting = committed[0]
        # Until the raise is done, or more than 10 x WRITERS commits jumped it (either assertion is then
        # decided): the control's raise would otherwise wait out its 20 s lock_timeout, or all 60 s.
        for _ in range(6000):
            if done.wait(0.01) or committed[0] - seen_waiting > 10 * WRITERS:
                break
        jumped = committed[0] - seen_waiting
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        raising.join(60)
        raiser.close()
    return jumped, outcome


#: The installs at once on a database whose default isolation is stricter (conftest's `PG_ISOLATION_VARIANTS`),
#: and the control's rounds at most.
INSTALLERS = 4
CONTROL_ROUNDS_MAX = 5


def _installs_at_once(url: str) -> collections.Counter[str]:
    """`INSTALLERS` installs at once on a fresh database, then as many on the installed one: the failures."""
    def install(index: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            pg.install(conn, keys=KEYS)

    return errors_at_once(INSTALLERS, install) + errors_at_once(INSTALLERS, install)


@pytest.mark.parametrize("variant", PG_ISOLATION_VARIANTS)
def test_installs_at_once_on_a_stricter_default_isolation(variant: str) -> None:
    """Installs are serialised by a lock, then read the version the one before wrote; at a default of
    REPEATABLE READ or SERIALIZABLE their snapshot was of before the lock (installs at once failed: the
    version row unseen, a TypeError, on a fresh database; 40001 on an installed one). The install's own
    transaction is READ COMMITTED now: 0 failures in 8 installs."""
    with fresh_pg_url(*PG_VARIANTS[variant]) as url:
        errors = _installs_at_once(url)
    assert not errors, dict(errors)


@pytest.mark.parametrize("variant", PG_ISOLATION_VARIANTS)
def test_control_installs_at_the_default_isolation_fail(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the install's transaction at the database's default level, as before."""
    monkeypatch.setattr(pg, "_read_committed_transaction", lambda conn: conn.transaction())
    for _ in range(CONTROL_ROUNDS_MAX):
        with fresh_pg_url(*PG_VARIANTS[variant]) as url:
            errors = _installs_at_once(url)
        if errors:
            break
    print(f"\ncontrol, {variant}: {dict(errors)}")
    assert any("40001" in error or "NoneType" in error for error in errors), dict(errors)


#: The key syncs at once (each of `KEY_SYNCS` rounds) per thread, after a rotation on every host.
KEY_SYNCS = 10


def _syncs_at_once(url: str, sync: Callable[[psycopg.Connection, object], None]) -> collections.Counter[str]:
    """`INSTALLERS` threads, each `KEY_SYNCS` times ``sync(conn, KEYS)``, at once on an installed database."""
    with psycopg.connect(url, autocommit=True) as conn:
        pg.install(conn, keys=KEYS)

    def syncs(index: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(KEY_SYNCS):
                sync(conn, KEYS)

    return errors_at_once(INSTALLERS, syncs)


def _sync_keys_before(conn: psycopg.Connection, keys: object) -> None:
    """The control: `pg.sync_keys` as it was, without the install's lock, at the session's level."""
    with conn.transaction():
        installed = conn.execute("SELECT cluster_id FROM stockade.settings").fetchone()[0]
        keyring, _ = pg._keyring_of(keys, installed)
        pg._write_keys(conn, keyring)


@pytest.mark.parametrize("variant", ["postgres", *PG_ISOLATION_VARIANTS])
def test_key_syncs_at_once_all_succeed(variant: str) -> None:
    """After a rotation every host may sync the keys at once: each deleted the keys and inserted them again,
    and two at once failed (a unique violation under READ COMMITTED, 40001 under the stricter defaults). The
    install's lock first, then READ COMMITTED: 0 failures in 40 syncs."""
    with fresh_pg_url(*PG_VARIANTS.get(variant, ("UTF8", {}))) as url:
        errors = _syncs_at_once(url, pg.sync_keys)
    assert not errors, dict(errors)


@pytest.mark.parametrize("variant", ["postgres", *PG_ISOLATION_VARIANTS])
def test_control_key_syncs_without_the_lock_fail(variant: str) -> None:
    for _ in range(CONTROL_ROUNDS_MAX):
        with fresh_pg_url(*PG_VARIANTS.get(variant, ("UTF8", {}))) as url:
            errors = _syncs_at_once(url, _sync_keys_before)
        if errors:
            break
    print(f"\ncontrol, {variant}: {dict(errors)}")
    assert any("duplicate key" in error or "serialize" in error for error in errors), dict(errors)


#: Each thread's rounds of the fence's administration at once, on one partitioned table.
ADMIN_ROUNDS = 5


def _administration_at_once(url: str) -> collections.Counter[str]:
    """`INSTALLERS` threads at once, `ADMIN_ROUNDS` times each: `install_ddl_guard`; `protect` of one tree;
    then half `protect`, half `unprotect` of it. The failures."""
    with psycopg.connect(url, autocommit=True) as conn:
        pg.install(conn, keys=KEYS)
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY) PARTITION BY RANGE (id)")
        conn.execute("CREATE TABLE orders_0 PARTITION OF orders FOR VALUES FROM (0) TO (100)")

    def rounds(step: Callable[[psycopg.Connection, int], object]) -> Callable[[int], None]:
        def run(index: int) -> None:
            with psycopg.connect(url, autocommit=True) as conn:
                for _ in range(ADMIN_ROUNDS):
                    step(conn, index)
        return run

    def protect_or_not(conn: psycopg.Connection, index: int) -> object:
        return pg.unprotect(conn, "orders") if index % 2 else pg.protect(conn, "orders", scope="orders")

    return (errors_at_once(INSTALLERS, rounds(lambda conn, _: pg.install_ddl_guard(conn)))
            + errors_at_once(INSTALLERS, rounds(lambda conn, _: pg.protect(conn, "orders", scope="orders")))
            + errors_at_once(INSTALLERS, rounds(protect_or_not)))


@pytest.mark.parametrize("variant", ["postgres", *PG_ISOLATION_VARIANTS])
def test_the_fence_administration_at_once_all_succeeds(variant: str) -> None:
    """Deploy scripts on several hosts may run the idempotent administration at once: two `protect`s of a
    tree failed (its trigger already existed, or a deadlock) at every level, `install_ddl_guard`s (a unique
    violation on the event trigger) and `unprotect` beside `protect` (a trigger dropped twice) too. Each now
    takes the install's lock and reads as committed: 0 failures in 60 calls."""
    with fresh_pg_url(*PG_VARIANTS.get(variant, ("UTF8", {}))) as url:
        errors = _administration_at_once(url)
    assert not errors, dict(errors)


@pytest.mark.parametrize("variant", ["postgres", *PG_ISOLATION_VARIANTS])
def test_control_the_fence_administration_without_the_lock_fails(variant: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: `protect`, `unprotect` and `install_ddl_guard` in a transaction at the session's level,
    without the install's lock (as before)."""
    from stockade.resources.postgres import _protect

    monkeypatch.setattr(_protect, "one_at_a_time", lambda conn: None)
    monkeypatch.setattr(_protect, "read_committed_transaction", lambda conn: conn.transaction())
    for _ in range(CONTROL_ROUNDS_MAX):
        with fresh_pg_url(*PG_VARIANTS.get(variant, ("UTF8", {}))) as url:
            errors = _administration_at_once(url)
        if errors:
            break
    print(f"\ncontrol, {variant}: {dict(errors)}")
    assert errors, "the control never failed"


#: The two trees protected at once: each of `INSTALLERS` threads protects one, alternating by thread.
TWO_TREES = ("orders", "invoices")


def _install_two_trees(url: str) -> None:
    """The fence and its DDL guard installed, and `TWO_TREES`, each a partitioned table with one partition."""
    with psycopg.connect(url, autocommit=True) as conn:
        pg.install(conn, keys=KEYS)
        pg.install_ddl_guard(conn)
        for tree in TWO_TREES:
            conn.execute(f"CREATE TABLE {tree} (id int PRIMARY KEY) PARTITION BY RANGE (id)")
            conn.execute(f"CREATE TABLE {tree}_0 PARTITION OF {tree} FOR VALUES FROM (0) TO (100)")


def _two_trees_at_once(url: str) -> collections.Counter[str]:
    """`INSTALLERS` threads at once, `ADMIN_ROUNDS` times each, `protect` of one of two partitioned trees (half the
    threads each): the failures. Every call takes the one install lock, so the two trees' calls wait for each
    other, as each tree's do."""
    _install_two_trees(url)

    def run(index: int) -> None:
        tree = TWO_TREES[index % len(TWO_TREES)]
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(ADMIN_ROUNDS):
                assert pg.protect(conn, tree, scope=tree) == [tree, f"{tree}_0"]

    return errors_at_once(INSTALLERS, run)


@pytest.mark.parametrize("variant", ["postgres", *PG_ISOLATION_VARIANTS])
def test_protects_of_two_trees_at_once_all_succeed(variant: str) -> None:
    """Deploy scripts on several hosts may protect different trees at once: they wait for each other on the
    install's lock, one database-wide lock (not one per tree), and each completes: 0 failures in 20 calls at
    each default level."""
    with fresh_pg_url(*PG_VARIANTS.get(variant, ("UTF8", {}))) as url:
        errors = _two_trees_at_once(url)
    assert not errors, dict(errors)


@pytest.mark.parametrize("variant", ["postgres", *PG_ISOLATION_VARIANTS])
def test_control_protects_of_two_trees_without_the_lock_fail(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the same calls without the install's lock, at the session's level. What fails is two `protect`s
    of one tree (its trigger already exists, the two deadlock on its tables' locks, or, at SERIALIZABLE, one of them
    cannot serialize: each seen once in CI); protects of
    different trees never failed without the lock either
    (4 threads, 4 trees, 5 rounds each, 5 databases at each level: 0 failures), so the lock makes them wait, it
    does not make them pass."""
    from stockade.resources.postgres import _protect

    monkeypatch.setattr(_protect, "one_at_a_time", lambda conn: None)
    monkeypatch.setattr(_protect, "read_committed_transaction", lambda conn: conn.transaction())
    for _ in range(CONTROL_ROUNDS_MAX):
        with fresh_pg_url(*PG_VARIANTS.get(variant, ("UTF8", {}))) as url:
            errors = _two_trees_at_once(url)
        if errors:
            break
    print(f"\ncontrol, {variant}: {dict(errors)}")
    collided = ("already exists", "deadlock detected", "could not serialize access")
    assert any(what in error for error in errors for what in collided), dict(errors)


def _wait_event(admin: psycopg.Connection, pid: int) -> str | None:
    """What ``pid`` waits for, if a lock (``relation``, ``advisory``): None when it does not wait on one."""
    row = admin.execute("SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return str(row[1]) if row is not None and row[0] == "Lock" else None


def _protect_behind_a_writer(url: str) -> tuple[list[str], str | None]:
    """A writer's open transaction on tree ``orders``; `protect` of ``orders`` starts and waits for the writer
    (its triggers need the table lock), then `protect` of ``invoices``. Before the writer commits: what the second
    protect waits for (None: it does not wait, or ended). Then the order in which both completed."""
    _install_two_trees(url)
    done: list[str] = []
    with psycopg.connect(url, autocommit=True) as admin, psycopg.connect(url) as writer, \
            psycopg.connect(url, autocommit=True) as first, psycopg.connect(url, autocommit=True) as second:
        # The lock a fenced INSERT into the tree holds until its commit (the INSERT itself would need a token).
        writer.execute("LOCK TABLE orders_0 IN ROW EXCLUSIVE MODE")

        def protecting(conn: psycopg.Connection, tree: str) -> threading.Thread:
            def run() -> None:
                pg.protect(conn, tree, scope=tree)
                done.append(tree)

            thread = threading.Thread(target=run)
            thread.start()
            return thread

        def waits_on(pid: int, thread: threading.Thread) -> str | None:
            for _ in range(int(WAIT_S / 0.01)):
                if (event := _wait_event(admin, pid)) is not None or not thread.is_alive():
                    return event
                thread.join(0.01)
            return None

        threads = [protecting(first, "orders")]
        assert waits_on(first.info.backend_pid, threads[0]) == "relation", "the first protect did not wait"
        threads.append(protecting(second, "invoices"))
        second_waits = waits_on(second.info.backend_pid, threads[1])
        writer.commit()
        for thread in threads:
            thread.join(WAIT_S)
    return done, second_waits


def test_a_protect_of_one_tree_waits_behind_another_trees_writers() -> None:
    """The lock's price: a `protect` waits for the open transactions writing to its tree (its triggers need the
    table lock) while it holds the install's lock, so a `protect` of another tree waits too, as long as those
    writers take; both complete once they commit, the first first. The control: without the lock the second
    does not wait for them."""
    with fresh_pg_url() as url:
        done, second_waits = _protect_behind_a_writer(url)
    assert (second_waits, done) == ("advisory", ["orders", "invoices"])
    from stockade.resources.postgres import _protect

    with pytest.MonkeyPatch.context() as patch, fresh_pg_url() as url:
        patch.setattr(_protect, "one_at_a_time", lambda conn: None)
        done, second_waits = _protect_behind_a_writer(url)
    assert (second_waits, done) == (None, ["invoices", "orders"])
