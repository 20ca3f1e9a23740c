"""The PostgreSQL coordinator's tables: the versioned schema, one scope's record read and written back.

Used by `stockade.coordinators.postgres.PostgresRecords` inside its
transactions; every function takes the open psycopg connection and never
commits. Every table is prefixed ``stockade_coord_`` so that the coordinator
can share a database with the application (and with the fenced store of
`stockade.resources.postgres`, whose tables have their own prefix).

Migrations are a list: version N is the first N entries applied in order
(versions 1 to 8 frozen in `stockade.coordinators.postgres._schema8`; 9 is the
lease log, `stockade.coordinators.postgres._journal`; 10 the scopes' lock views, `LOCK_VIEWS`; 11 the keep by
primary key; 12 the release that does not wait for the disk, `RELEASE_ASYNC`; 13 the same rules in fewer
instructions, `SERVER_RULES`), in the transaction of
the first connect of a newer version, under one transaction-scoped advisory lock so that
processes opening a new database at the same moment do not race
(``CREATE TABLE IF NOT EXISTS`` alone is not safe against a concurrent twin).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from stockade.coordinators._record_diff import POSTGRES, Statement, check_change, lease_and_queue, scope_row_changed
from stockade.coordinators.postgres._journal import (
    LEASE_LOG,
    LOG_CHECKS_14,
    LOG_FUNCTIONS,
    end_of_old,
    log_statements,
    sweep,
)
from stockade.coordinators.postgres._schema8 import MIGRATIONS_8
from stockade.core.errors import invariant
from stockade.core.leases import Lease, ScopeRecord, Waiter
from stockade.core.tokens import COUNTER_BITS, COUNTER_MAX, FencingToken

__all__ = [
    "MIGRATIONS", "SCHEMA_VERSION", "MIGRATION_LOCK", "SCOPE_LOCK_CLASS", "get_meta", "set_meta",
    "forgotten_floor", "load_record", "forget_record", "record_writes", "record_of_row", "RECORD_SELECT",
    "RECORD_COLUMNS", "EXPECT_SQLSTATE", "SERVER_RULES", "LEASE_ROWS_MAX", "leases_at_least", "HELD", "HELD_SCOPE",
    "server_rules", "SERVER_RULES_9", "SERVER_RULES_10", "SERVER_RULES_11", "KEEP_BY_SEQ", "KEEP_BY_SCOPE",
    "RELEASE_ASYNC", "RELEASE_ASYNC_LEAN", "SERVER_RULES_12", "LEAN_WRITE", "LEASE_ROWS_MAX_EXPR",
    "ADVISORY_LOCK", "LOCK_SCHEMA", "SCOPE_LOCKS", "LOCK_SCOPE", "LOCK_VIEW",
    "TIMELINE_KEY", "timeline_key", "RULE_NAMES", "RULE_NAMES_9", "LOCK_VIEWS", "LOCK_SCOPE_INLINE",
    "SERVER_RULES_13", "HELD_NEWEST", "LEASE_ROWS_AT_LEAST", "STATE_ROW", "META_STATE",
]

#: Advisory lock keys: one for the migration, one class for the per-scope locks of schema 9 and
#: before (two-int form), which any role that may connect can take (`LOCK_SCOPE` replaced them).
MIGRATION_LOCK = 0x5374_6B01
SCOPE_LOCK_CLASS = 0x5374_6B02
#: The scope's lock of schema 9 and before, an SQL expression on ``{scope}``.
ADVISORY_LOCK = f"pg_advisory_xact_lock({SCOPE_LOCK_CLASS}, hashtext({{scope}}))"
#: The schema of the scopes' lock views: only the coordinator's role may use it, so no other role can name them.
LOCK_SCHEMA = "stockade_coord_private"
#: How many views ``stockade_coord_private.scope_lock_<n>`` lock scopes (by ``hashtext(scope) & (n - 1)``).
SCOPE_LOCKS = 256
#: The scope's lock since schema 10, an SQL expression on ``{scope}``: EXCLUSIVE on the scope's view,
#: until the transaction ends (`LOCK_VIEWS`). NULL locks nothing.
LOCK_SCOPE = f"{LOCK_SCHEMA}.lock_scope({{scope}})"
#: Since schema 12 the two one-statement functions take the same lock themselves, a PL/pgSQL statement on
#: ``{scope}`` (not NULL): the statement `LOCK_SCOPE` runs, without its nested call (a statement, a function
#: call and its frame, about 12 µs of the server's time each, two a lock cycle).
LOCK_SCOPE_INLINE = (f"EXECUTE 'LOCK TABLE {LOCK_SCHEMA}.scope_lock_' || (hashtext({{scope}}) & {SCOPE_LOCKS - 1}) "
                     "|| ' IN EXCLUSIVE MODE'")

#: The view that ``{scope}`` locks (an SQL expression), for the tests and the docs.
LOCK_VIEW = f"format('{LOCK_SCHEMA}.scope_lock_%s', hashtext({{scope}}) & {SCOPE_LOCKS - 1})"
#: The key of ``stockade_coord_meta`` that holds the recorded timeline. Schema 10 renamed it from
#: ``timeline``: a process of schema 9 (advisory locks) still running then finds no timeline and
#: refuses its next unit (BackendUnavailable), instead of running beside the views' order.
TIMELINE_KEY = "timeline10"


def timeline_key(version: int) -> str:
    """The key of the recorded timeline in the tables of schema ``version`` (`TIMELINE_KEY` since 10)."""
    return "timeline" if version < 10 else TIMELINE_KEY


#: The names of the grant's and the keep's functions of schema 9, and since 10 (`server_rules`).
RULE_NAMES_9 = ("stockade_coord_grant_log", "stockade_coord_keep_log")
RULE_NAMES = ("stockade_coord_grant_10", "stockade_coord_keep_10")
#: The SQLSTATE of a failed `stockade_coord_expect` check: an invariant broke, not the server.
EXPECT_SQLSTATE = "SK001"

# Every function below reads the server's clock and checks the timeline first thing under the
# scope's lock: on a timeline the tables have not recorded yet (a promotion) it answers nothing,
# and the lease engine's path starts the timeline (the restart rule, C3/C5). The check is a
# column of the function's one read (fewer statements: each costs the server an executor start).
_NOW = "(extract(epoch FROM clock_timestamp()) * 1000000000)::bigint"


def _meta(timeline_key: str) -> str:
    """The one read of the meta values every function starts with, the timeline under ``timeline_key``."""
    return (f"(SELECT max(v::bigint) FILTER (WHERE k = '{timeline_key}') AS timeline, "
            "max(v::bigint) FILTER (WHERE k = 'timeline_offset') AS timeline_offset, "
            "max(v::bigint) FILTER (WHERE k = 'epoch') AS epoch, "
            "max(v::bigint) FILTER (WHERE k = 'forgotten_floor') AS forgotten_floor FROM stockade_coord_meta "
            f"WHERE k IN ('{timeline_key}', 'timeline_offset', 'epoch', 'forgotten_floor')) AS m")


#: Since schema 14 the functions read the four meta values from one row kept equal to them (`META_STATE`), a
#: scan of one tuple instead of an aggregate over the meta table (about 40,000 of the server's instructions each).
STATE_ROW = "stockade_coord_state AS m"
#: Migration 14's one-row copy of the meta values the functions read: a trigger on ``stockade_coord_meta`` writes
#: each change of one of the four keys into it, in the transaction of the change, so that the row equals what the
#: meta table holds in every snapshot (every writer of those keys, the coordinator's units and an administrator
#: raising ``timeline_offset`` alike, goes through the trigger; ``ENABLE ALWAYS``: also with
#: ``session_replication_role = replica``). A row trigger sets only its own key's column, so two transactions
#: that change different keys at once both land (the second updates the row's latest version). A restored dump
#: brings both tables from the same snapshot. Only the coordinator's role may write either table.
META_STATE = f"""
CREATE TABLE stockade_coord_state (id int PRIMARY KEY CHECK (id = 1), timeline bigint, timeline_offset bigint,
                                   epoch bigint, forgotten_floor bigint);
REVOKE ALL ON stockade_coord_state FROM PUBLIC;
INSERT INTO stockade_coord_state SELECT 1, m.* FROM {_meta(TIMELINE_KEY).removesuffix(" AS m")} AS m;
CREATE FUNCTION stockade_coord_state_of_meta() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        UPDATE stockade_coord_state SET timeline = NULL, timeline_offset = NULL, epoch = NULL, forgotten_floor = NULL;
        RETURN NULL;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN  -- the old key's value goes (a key deleted or renamed)
        UPDATE stockade_coord_state SET timeline = CASE WHEN OLD.k = '{TIMELINE_KEY}' THEN NULL ELSE timeline END,
               timeline_offset = CASE WHEN OLD.k = 'timeline_offset' THEN NULL ELSE timeline_offset END,
               epoch = CASE WHEN OLD.k = 'epoch' THEN NULL ELSE epoch END,
               forgotten_floor = CASE WHEN OLD.k = 'forgotten_floor' THEN NULL ELSE forgotten_floor END
         WHERE OLD.k IN ('{TIMELINE_KEY}', 'timeline_offset', 'epoch', 'forgotten_floor');
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        UPDATE stockade_coord_state
           SET timeline = CASE WHEN NEW.k = '{TIMELINE_KEY}' THEN NEW.v::bigint ELSE timeline END,
               timeline_offset = CASE WHEN NEW.k = 'timeline_offset' THEN NEW.v::bigint ELSE timeline_offset END,
               epoch = CASE WHEN NEW.k = 'epoch' THEN NEW.v::bigint ELSE epoch END,
               forgotten_floor = CASE WHEN NEW.k = 'forgotten_floor' THEN NEW.v::bigint ELSE forgotten_floor END
         WHERE NEW.k IN ('{TIMELINE_KEY}', 'timeline_offset', 'epoch', 'forgotten_floor');
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION stockade_coord_state_of_meta() FROM PUBLIC;
CREATE TRIGGER stockade_coord_state_of_meta AFTER INSERT OR UPDATE OR DELETE ON stockade_coord_meta
    FOR EACH ROW EXECUTE FUNCTION stockade_coord_state_of_meta();
CREATE TRIGGER stockade_coord_state_of_meta_truncate AFTER TRUNCATE ON stockade_coord_meta
    FOR EACH STATEMENT EXECUTE FUNCTION stockade_coord_state_of_meta();
ALTER TABLE stockade_coord_meta ENABLE ALWAYS TRIGGER stockade_coord_state_of_meta,
    ENABLE ALWAYS TRIGGER stockade_coord_state_of_meta_truncate;
"""

_NEW_TIMELINE = ("m.timeline IS DISTINCT FROM ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))"
                 "::bit(32)::bigint + COALESCE(m.timeline_offset, 0)")

#: At least as many leases as are held, from two sizes alone: a held lease is one scope's
#: (`stockade.coordinators.postgres._journal`), so there are no more of them than rows in the scope
#: table, whose sizes bound its rows; the smaller of:
#: - its heap: a page of ``block_size`` bytes holds at most ``(block_size - 24) / 28`` rows
#:   (PostgreSQL's own bound), live or dead;
#: - its primary key: every scope has one entry there, and a page holds at most
#:   ``(block_size - 40) / 20`` entries (a 16-byte tuple for the shortest scope and its 4-byte line
#:   pointer, after the page header and the B-tree's special space).
#: A grant or a release updates its scope's row in place (heap-only), so neither grows with churn.
#: While the smaller is below the bound on leases, nobody counts the held leases (a count is a scan
#: of the lease log).
LEASE_ROWS_MAX = ("(SELECT LEAST(pg_relation_size('stockade_coord_scopes') / b * ((b - 24) / 28), "
                  "pg_relation_size('stockade_coord_scopes_pkey') / b * ((b - 40) / 20)) "
                  "FROM (SELECT current_setting('block_size')::bigint AS b) AS bs)")


#: `LEASE_ROWS_MAX` as an expression without a query (since schema 13): PL/pgSQL evaluates it without starting
#: the executor (the block size read where it is used instead of once in a subquery; the same value).
LEASE_ROWS_MAX_EXPR = ("LEAST(pg_relation_size('stockade_coord_scopes') / current_setting('block_size')::bigint "
                       "* ((current_setting('block_size')::bigint - 24) / 28), "
                       "pg_relation_size('stockade_coord_scopes_pkey') / current_setting('block_size')::bigint "
                       "* ((current_setting('block_size')::bigint - 40) / 20))")
#: Since schema 14: whether `LEASE_ROWS_MAX_EXPR` is at least ``{n}``, each size read only when the one before does
#: not already rule it out (``LEAST(a, b) >= n`` is ``a >= n AND b >= n``, and ``AND`` stops at its first false):
#: while the scopes' table is small, one `pg_relation_size` a grant instead of two.
LEASE_ROWS_AT_LEAST = ("pg_relation_size('stockade_coord_scopes') / current_setting('block_size')::bigint "
                       "* ((current_setting('block_size')::bigint - 24) / 28) >= {n} "
                       "AND pg_relation_size('stockade_coord_scopes_pkey') / current_setting('block_size')::bigint "
                       "* ((current_setting('block_size')::bigint - 40) / 20) >= {n}")


def leases_at_least(n: str) -> str:
    """SQL: whether at least ``n`` (an SQL expression) leases are held; counts only when the scopes could hold them."""
    return (f"CASE WHEN {LEASE_ROWS_MAX} < {n} THEN false ELSE (SELECT count(*) FROM (SELECT 1 FROM "
            f"stockade_coord_log WHERE end_kind IS NULL LIMIT {n}) AS n) >= {n} END")


#: The held lease of scope ``{scope}`` (an SQL expression): the scope's newest row of the lease log, unless it ended.
HELD = ("(SELECT h.* FROM (SELECT o.* FROM stockade_coord_log o WHERE o.scope = {scope} ORDER BY o.seq DESC LIMIT 1) "
        "AS h WHERE h.end_kind IS NULL)")
#: Since schema 14, in the grant's read: whether scope ``{scope}`` holds a lease, the same as ``EXISTS`` `HELD`
#: (its newest row has not ended; false when it has no row), one scan without `HELD`'s subquery around it.
HELD_NEWEST = ("COALESCE((SELECT o.end_kind IS NULL FROM stockade_coord_log o WHERE o.scope = {scope} "
               "ORDER BY o.seq DESC LIMIT 1), false)")
#: The scope of lease ``{lease_id}`` while it is held (None: no lease has this id).
HELD_SCOPE = ("(SELECT o.scope FROM stockade_coord_log o WHERE o.lease_id = {lease_id} AND o.end_kind IS NULL "
              "ORDER BY o.seq DESC LIMIT 1)")


#: The rules of `stockade.core.leases` for the cases that need no decision but the obvious one,
#: each one statement (one round trip) and its own transaction: a grant of a free scope with
#: nobody queued, the renewal or release of a live lease with nobody queued, and the answer
#: for a lease id that no lease has (not held; nothing to write). Each answers no
#: row for every other case (held, queued, expired, lock-delay, a new timeline, a full table, a
#: counter at the end of its epoch), and then the lease engine decides, in Python, as for every
#: backend. Tests hold both paths to the same answers (tests/test_coordinator_postgres.py).
#: Each function runs three statements: the grant its lock, one read, one write; the keep one
#: read, its lock, one write (the write checks the lease is still live and nobody queued).
#: The lease's row in the log is its history (`stockade.coordinators.postgres._journal`): the
#: grant inserts it, the release marks it ended in place, each in its own transaction.
def server_rules(*, lock: str = LOCK_SCOPE_INLINE, names: tuple[str, str] = RULE_NAMES,
                 timeline_key: str = TIMELINE_KEY, by_seq: bool = True, release_async: bool = True,
                 lock_rows: bool = False, lean: bool = True, fewer_nodes: bool = False, **bounds: int) -> str:
    """The SQL of the two functions; ``bounds`` and ``lock_rows`` as `stockade.coordinators.postgres._journal.sweep`.

    Args:
        lock: the PL/pgSQL statement that takes the scope's lock, on ``{scope}`` (``PERFORM`` `ADVISORY_LOCK` in
            schema 9, ``PERFORM`` `LOCK_SCOPE` in 10 and 11, `LOCK_SCOPE_INLINE` since 12).
        names: the names of the grant's and the keep's functions.
        timeline_key: the key of ``stockade_coord_meta`` that holds the recorded timeline (`TIMELINE_KEY`).
        by_seq: the keep's write finds the lease's row by its ``seq`` (the primary key), as read before the
            lock (since 11); False: by its lease id and scope (schemas 9 and 10, `KEEP_BY_SCOPE`).
        release_async: a release's transaction does not wait for its WAL flush (`RELEASE_ASYNC`, since 12).
        lean: the same rules in fewer of the server's instructions (since 13, `LEAN_WRITE` and
            `RELEASE_ASYNC_LEAN`): no statement the executor starts for what an expression can say.
        fewer_nodes: the grant's read asks whether the scope is held with `HELD_NEWEST` instead of ``EXISTS``
            `HELD`, and reads the second size of the bound on held leases only when the first does not rule
            the count out (since 14; the same answers: ``LEAST(a, b) >= n`` is ``a >= n AND b >= n``); both
            read the meta values from `STATE_ROW` (no row there: the engine decides, as on a new timeline).
    """
    meta = STATE_ROW if fewer_nodes else _meta(timeline_key)
    return (_grant_rule(lock, names[0], meta, lock_rows=lock_rows, lean=lean, fewer_nodes=fewer_nodes, **bounds)
            + _keep_rule(lock, names[1], meta, by_seq, release_async, lean, fewer_nodes, **bounds))


#: The grant's write up to schema 12: one statement whatever the scope, an update of a used scope's row
#: or an insert of a new scope's (each a table the executor sets up, even when its branch writes nothing).
_WRITE_12 = """WITH u AS (
        UPDATE stockade_coord_scopes AS s SET last_token = v_base + 1 WHERE s.scope = p_scope AND s.last_token = v_last
            RETURNING 1),
    i AS (
        INSERT INTO stockade_coord_scopes (scope, last_token, delay_until_ns) SELECT p_scope, v_base + 1, v_delay
            WHERE NOT v_exists ON CONFLICT (scope) DO NOTHING RETURNING 1),
    s AS (SELECT 1 FROM u UNION ALL SELECT 1 FROM i)
    {log}"""
_LOG_INSERT = ("INSERT INTO stockade_coord_log AS l (scope, lease_id, holder, token, ttl_ms, granted_ns, expires_ns, "
               """grant_ms)
        SELECT p_scope, p_lease_id, p_holder, v_base + 1, p_ttl_ms, v_now, v_now + p_ttl_ms * 1000000, v_now / 1000000
          FROM s
        RETURNING l.seq INTO v_seq;""")
#: Since schema 13 the grant's write is still one statement, the one its scope needs: a used scope's (the
#: common case) only updates the scope's row, a new scope's only inserts it. The same rows, the same
#: compare-and-set: no lease's row without its scope's token written in the same statement.
LEAN_WRITE = f"""IF v_exists THEN
        WITH s AS (UPDATE stockade_coord_scopes AS s SET last_token = v_base + 1
                    WHERE s.scope = p_scope AND s.last_token = v_last RETURNING 1)
        {_LOG_INSERT}
    ELSE
        WITH s AS (INSERT INTO stockade_coord_scopes (scope, last_token, delay_until_ns)
                   VALUES (p_scope, v_base + 1, v_delay) ON CONFLICT (scope) DO NOTHING RETURNING 1)
        {_LOG_INSERT}
    END IF;"""


def _grant_rule(lock: str, name: str, meta: str, *, lock_rows: bool, lean: bool, fewer_nodes: bool,
                **bounds: int) -> str:
    # Since schema 13 the bound on held leases is an expression after the read (the count, a query, only
    # when the scopes' sizes do not rule it out), not subqueries of the read that the executor sets up each time.
    bound = "" if lean else f"\n           OR {leases_at_least('p_leases_max')}"
    sizes = LEASE_ROWS_AT_LEAST.format(n="p_leases_max") if fewer_nodes else f"{LEASE_ROWS_MAX_EXPR} >= p_leases_max"
    held = HELD_NEWEST if fewer_nodes else f"EXISTS {HELD}"
    after_read = (f"""
    IF NOT v_refused AND {sizes} THEN
        v_refused := (SELECT count(*) FROM (SELECT 1 FROM stockade_coord_log WHERE end_kind IS NULL
                      LIMIT p_leases_max) AS n) >= p_leases_max;
    END IF;""" if lean else "")
    write = LEAN_WRITE if lean else _WRITE_12.format(log=_LOG_INSERT)
    found = _NO_STATE_ROW if fewer_nodes else ""
    return f"""
CREATE OR REPLACE FUNCTION {name}(p_scope text, p_lease_id text, p_holder text, p_ttl_ms bigint,
                                                    p_leases_max bigint)
RETURNS TABLE (token bigint, now_ns bigint) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now bigint;
    v_last bigint;
    v_delay bigint;
    v_base bigint;
    v_refused boolean;
    v_exists boolean;
    v_seq bigint;
BEGIN
    {lock.format(scope='p_scope')};
    v_now := {_NOW};
    -- A later statement than the lock: it reads what the lock protects.
    SELECT COALESCE(s.last_token, 0), COALESCE(s.delay_until_ns, 0),
           {_NEW_TIMELINE}
           OR v_now < COALESCE(s.delay_until_ns, 0)
           OR {held.format(scope='p_scope')}
           OR EXISTS (SELECT 1 FROM stockade_coord_waiters w WHERE w.scope = p_scope){bound},
           GREATEST(COALESCE(s.last_token, 0), m.epoch << {COUNTER_BITS}, COALESCE(m.forgotten_floor, 0)),
           s.scope IS NOT NULL
      INTO v_last, v_delay, v_refused, v_base, v_exists
      FROM {meta} LEFT JOIN stockade_coord_scopes s ON s.scope = p_scope;{found}{after_read}
    IF v_refused OR v_base & {COUNTER_MAX} = {COUNTER_MAX} THEN
        RETURN;  -- busy, a new timeline, a full table, or a counter at the end of its epoch: the engine decides
    END IF;
    -- The scope row's compare-and-set and the lease's row in one statement: no lease without its token
    -- recorded. A used scope's row is updated in place, a new scope's inserted (an upsert would lock the
    -- row first: one WAL record more a grant). The lease's row is its grant event.
    {write}
    IF v_seq IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '{EXPECT_SQLSTATE}',
            MESSAGE = format('last_token of %L changed underneath this coordinator', p_scope);
    END IF;
    {sweep("v_seq", lock_rows=lock_rows, **bounds)}
    token := v_base + 1;
    now_ns := v_now;
    RETURN NEXT;
END
$$;
"""


#: The keep's write of schemas 9 and 10: its row found by lease id and scope. The planner may read
#: that as both indexes' bitmaps ANDed, and the scope's bitmap is every row of the scope in the log
#: (up to `stockade.coordinators.postgres._journal.LOG_ROWS_MAX`, on a scope used over and over):
#: a release then cost a scan of its scope's history (benchmarks/README.md, `side_by_side.py`).
KEEP_BY_SCOPE = "l.lease_id = p_lease_id AND l.scope = v_scope"
#: Since schema 11: the row read before the lock, by its primary key (one index entry); the rest of
#: the guard is the same, re-checked on the row's latest version after the lock, so a row that ended
#: meanwhile is not written (the engine's path decides).
KEEP_BY_SEQ = "l.seq = v_held AND l.lease_id = p_lease_id AND l.scope = v_scope"


#: Since schema 12, what the one-statement release runs once it has ended the lease: unless the server has
#: synchronous standbys, its transaction commits without waiting for its WAL to reach the disk
#: (``synchronous_commit`` off for this transaction only; the session's and the server's setting are
#: untouched, and `check_settings` still refuses a server that runs so). PostgreSQL writes the WAL in order,
#: so the next commit that waits for its flush (any grant, any renewal) makes every release before it
#: durable too, and the WAL writer flushes it within three ``wal_writer_delay`` at the latest anyway. A crash
#: before that forgets the release: the lease is then held until its deadline, as if its holder had gone
#: silent (C3); no token is lost, since grants still wait (C1). A renewal still waits: its holder times its
#: lease from it (K2), so a renewal lost in a crash would let the server grant the scope again while the
#: holder still counts it as its own. With synchronous standbys (``synchronous_standby_names``) the release
#: waits as every commit does: an unflushed release is not sent to a standby, and a failover would bring
#: the lease back for a full TTL (docs/coordinator-postgres.md, "A release does not wait for the disk").
RELEASE_ASYNC = ("PERFORM set_config('synchronous_commit', 'off', true) "
                 "WHERE current_setting('synchronous_standby_names') = '';")
#: `RELEASE_ASYNC` since schema 13: the same setting, as an ``IF`` and an assignment, which PL/pgSQL evaluates
#: as expressions (a ``PERFORM`` with a ``WHERE`` is a query the executor starts).
RELEASE_ASYNC_LEAN = ("IF current_setting('synchronous_standby_names') = '' THEN\n"
                      "            v_setting := set_config('synchronous_commit', 'off', true);\n        END IF;")


#: Since schema 14, after the read of `STATE_ROW`: a table may hold no row where an aggregate always answers one.
_NO_STATE_ROW = """
    IF NOT FOUND THEN
        RETURN;  -- the meta values' row is missing: the engine decides (its units read the meta table itself)
    END IF;"""


def _keep_rule(lock: str, name: str, meta: str, by_seq: bool, release_async: bool, lean: bool,
               fewer_nodes: bool = False, **bounds: int) -> str:
    if by_seq:
        read = (f"SELECT h.scope, h.seq, {_NEW_TIMELINE} INTO v_scope, v_held, v_refused FROM {meta} LEFT JOIN LATERAL "
                "(SELECT o.scope, o.seq FROM stockade_coord_log o WHERE o.lease_id = p_lease_id AND o.end_kind IS NULL "
                "ORDER BY o.seq DESC LIMIT 1) AS h ON true;")
        row, held = KEEP_BY_SEQ, "\n    v_held bigint;"
    else:
        held_scope = HELD_SCOPE.format(lease_id="p_lease_id")
        read = f"SELECT {held_scope}, {_NEW_TIMELINE} INTO v_scope, v_refused FROM {meta};"
        row, held = KEEP_BY_SCOPE, ""
    async_commit = f"\n        {RELEASE_ASYNC_LEAN if lean else RELEASE_ASYNC}" if release_async else ""
    if lean:
        held += "\n    v_setting text;"
    return f"""
CREATE OR REPLACE FUNCTION {name}(p_lease_id text, p_release boolean)
RETURNS TABLE (scope text, holder text, token bigint, ttl_ms bigint, granted_ns bigint, expires_ns bigint,
               now_ns bigint) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now bigint;
    v_scope text;
    v_refused boolean;
    v_seq bigint;{held}
BEGIN
    v_now := {_NOW};
    {read}{_NO_STATE_ROW if fewer_nodes else ""}
    IF v_refused THEN
        RETURN;
    END IF;
    IF v_scope IS NULL THEN  -- no such lease: nothing to write, the answer is "not held" (a row without a scope)
        now_ns := v_now;
        RETURN NEXT;
        RETURN;
    END IF;
    {lock.format(scope='v_scope')};
    v_now := {_NOW};  -- the lock may have waited
    -- A later statement than the lock: it reads what the lock protects. Only a live lease with
    -- nobody queued is released or renewed here, in its row, in place; for anything else no row
    -- changes (the engine's path).
    IF p_release THEN
        UPDATE stockade_coord_log l SET end_kind = 'release', end_ms = v_now / 1000000
         WHERE {row} AND l.end_kind IS NULL AND v_now < l.expires_ns
           AND NOT EXISTS (SELECT 1 FROM stockade_coord_waiters w WHERE w.scope = v_scope)
        RETURNING l.seq, l.scope, l.holder, l.token, l.ttl_ms, l.granted_ns, l.expires_ns
             INTO v_seq, scope, holder, token, ttl_ms, granted_ns, expires_ns;
    ELSE
        UPDATE stockade_coord_log l SET expires_ns = v_now + l.ttl_ms * 1000000
         WHERE {row} AND l.end_kind IS NULL AND v_now < l.expires_ns
           AND NOT EXISTS (SELECT 1 FROM stockade_coord_waiters w WHERE w.scope = v_scope)
        RETURNING l.seq, l.scope, l.holder, l.token, l.ttl_ms, l.granted_ns, l.expires_ns
             INTO v_seq, scope, holder, token, ttl_ms, granted_ns, expires_ns;
    END IF;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_release THEN{async_commit}
        {end_of_old("v_seq", lean=lean, **bounds)}
    END IF;
    now_ns := v_now;
    RETURN NEXT;
END
$$
"""


#: The two functions as schema 9 created them (advisory locks), kept as they were for migration 9.
SERVER_RULES_9 = server_rules(lock=f"PERFORM {ADVISORY_LOCK}", names=RULE_NAMES_9, timeline_key="timeline",
                              by_seq=False, release_async=False, lock_rows=True, lean=False)
#: The two functions of schema 10: the scope's lock is its view's (`LOCK_SCOPE`); kept as they were for migration 10.
SERVER_RULES_10 = server_rules(lock=f"PERFORM {LOCK_SCOPE}", by_seq=False, release_async=False, lock_rows=True,
                               lean=False)
#: The two functions of schema 11: the keep writes the lease's row by its primary key (`KEEP_BY_SEQ`); kept as they
#: were for migration 11.
SERVER_RULES_11 = server_rules(lock=f"PERFORM {LOCK_SCOPE}", release_async=False, lock_rows=True, lean=False)
#: The two functions of schema 12: the release does not wait for its WAL flush (`RELEASE_ASYNC`), the
#: grant's sweep deletes old rows without locking each first (`stockade.coordinators.postgres._journal.sweep`),
#: and each takes the scope's lock itself (`LOCK_SCOPE_INLINE`); kept as they were for migration 12.
SERVER_RULES_12 = server_rules(lean=False)
#: The two functions of schema 13: schema 12's rules in fewer of the server's instructions (``lean``); kept as they
#: were for migration 13.
SERVER_RULES_13 = server_rules()
#: The two functions since schema 14: schema 13's with ``fewer_nodes``.
SERVER_RULES = server_rules(fewer_nodes=True)

#: Migration 10's locks: views in a schema no other role may use, so that no other role can name
#: them, nor lock them (an advisory lock any role can take; a view in a schema it may use it can
#: lock ROW SHARE by PREPAREing a ``SELECT ... FOR UPDATE`` of it, which needs no privilege). The
#: schema is created unless it exists owned by the coordinator's role (an administrator may create
#: it so, for a role without CREATE on the database). Views, not tables: pg_dump locks the tables
#: it dumps until it ends. A lock on a view writes nothing (no WAL), like the advisory lock.
LOCK_VIEWS = f"""
DO $schema$ BEGIN
    IF to_regnamespace('{LOCK_SCHEMA}') IS NULL THEN
        IF NOT has_database_privilege(current_database(), 'CREATE') THEN
            RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', MESSAGE = format(
                'the coordinator locks its scopes on views in the schema {LOCK_SCHEMA}, which role %I may not '
                'create: GRANT CREATE ON DATABASE %I TO %I, or CREATE SCHEMA {LOCK_SCHEMA} AUTHORIZATION %I '
                '(docs/coordinator-postgres.md)', current_user, current_database(), current_user, current_user);
        END IF;
        CREATE SCHEMA {LOCK_SCHEMA};
    ELSIF (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = '{LOCK_SCHEMA}')
            IS DISTINCT FROM (SELECT r.oid FROM pg_roles r WHERE r.rolname = current_user) THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', MESSAGE = format(
            'the schema {LOCK_SCHEMA} belongs to another role than %I, which could take the coordinator''s '
            'locks: ALTER SCHEMA {LOCK_SCHEMA} OWNER TO %I (docs/coordinator-postgres.md)', current_user, current_user);
    END IF;
END $schema$;
REVOKE ALL ON SCHEMA {LOCK_SCHEMA} FROM PUBLIC;
DO $views$ BEGIN
    FOR i IN 0..{SCOPE_LOCKS - 1} LOOP
        EXECUTE format('CREATE OR REPLACE VIEW {LOCK_SCHEMA}.scope_lock_%s AS SELECT 1 AS one', i);
    END LOOP;
END $views$;
REVOKE ALL ON ALL TABLES IN SCHEMA {LOCK_SCHEMA} FROM PUBLIC;
CREATE OR REPLACE FUNCTION {LOCK_SCOPE.format(scope='p_scope text')} RETURNS void LANGUAGE plpgsql STRICT AS $$
BEGIN
    EXECUTE 'LOCK TABLE {LOCK_SCHEMA}.scope_lock_' || (hashtext(p_scope) & {SCOPE_LOCKS - 1}) || ' IN EXCLUSIVE MODE';
END
$$;
REVOKE ALL ON FUNCTION {LOCK_SCOPE.format(scope='text')} FROM PUBLIC;
DROP FUNCTION IF EXISTS {RULE_NAMES_9[0]}(text, text, text, bigint, bigint);
DROP FUNCTION IF EXISTS {RULE_NAMES_9[1]}(text, boolean);
UPDATE stockade_coord_meta SET k = '{TIMELINE_KEY}' WHERE k = 'timeline';
"""

MIGRATIONS: tuple[str, ...] = (
    *MIGRATIONS_8,  # versions 1 to 8, as they were (`stockade.coordinators.postgres._schema8`)
    # 9: the lease log (`stockade.coordinators.postgres._journal`): a lease is one row, which is
    # also its history; a release marks it ended in place. A lock cycle wrote 14 WAL records
    # (a lease row with three indexes inserted and deleted, two events with two each), now 8
    # (tests/test_postgres_wal_per_cycle.py). The functions are new names: a process of version 8
    # still running fails on its next call instead of writing beside the log.
    LEASE_LOG + SERVER_RULES_9,
    # 10: the scopes' locks on views no other role can lock (`LOCK_VIEWS`), instead of advisory
    # locks any role can take. The functions are new names and the timeline's key is renamed, so a
    # process of version 9 still running fails on its next call instead of locking differently.
    LOCK_VIEWS + SERVER_RULES_10,
    # 11: the keep's write finds the lease's row by its primary key, not by the AND of the lease id's
    # and the scope's indexes, which read every row of a scope's history in the log (`KEEP_BY_SEQ`).
    # Same names, same answers: a process of version 10 still running calls the new body unchanged.
    SERVER_RULES_11,
    # 12: the one-statement release commits without waiting for its WAL flush (`RELEASE_ASYNC`); the sweep
    # of the log deletes its rows without locking each first (one WAL record a row instead of two); the
    # functions take the scope's lock without a nested call (`LOCK_SCOPE_INLINE`, the same lock). Same
    # names, same answers: a process of version 11 still running calls the new bodies unchanged.
    LOG_FUNCTIONS + SERVER_RULES_12,
    # 13: the same rules in fewer of the server's instructions: the grant's write sets up only the table
    # write its scope needs (`LEAN_WRITE`), the bound on held leases and the release's commit setting and
    # check of the log's bound are expressions, not queries (`LEASE_ROWS_MAX_EXPR`, `RELEASE_ASYNC_LEAN`).
    # Same names, same answers: a process of version 12 still running calls the new bodies unchanged.
    SERVER_RULES_13,
    # 14: the same rules in fewer of the server's instructions again: the lease log's two CHECK constraints,
    # which PostgreSQL read back from the catalog and prepared again for every statement writing a row, become
    # a domain and NOT NULLs of the same meaning (`LOG_CHECKS_14`); the functions read the meta values from one
    # row a trigger keeps equal to them (`META_STATE`), and the grant's read sets up fewer nodes (``fewer_nodes``).
    # Same names, same answers: a process of version 13 still running calls the new bodies unchanged.
    LOG_CHECKS_14 + META_STATE + SERVER_RULES,
)
SCHEMA_VERSION = len(MIGRATIONS)


def get_meta(conn: Any, key: str) -> str | None:
    row = conn.execute("SELECT v FROM stockade_coord_meta WHERE k = %s", (key,)).fetchone()
    return None if row is None else str(row[0])


def set_meta(conn: Any, key: str, value: str) -> None:
    conn.execute(
        "INSERT INTO stockade_coord_meta (k, v) VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = excluded.v",
        (key, value),
    )


def forgotten_floor(conn: Any) -> int:
    value = get_meta(conn, "forgotten_floor")
    return int(value) if value else 0


#: One scope's record in one row (the scope, its lease, its queue): append ``WHERE s.scope = ...``.
RECORD_SELECT = (
    "SELECT s.scope, s.last_token, s.delay_until_ns, l.lease_id, l.holder, l.token, l.ttl_ms, l.granted_ns, "
    "l.expires_ns, (SELECT json_agg(json_build_array(w.lease_id, w.holder, w.deadline_ns::text, w.stale_ns::text) "
    "ORDER BY w.seq) FROM stockade_coord_waiters w WHERE w.scope = s.scope) "
    f"FROM stockade_coord_scopes s LEFT JOIN LATERAL {HELD.format(scope='s.scope')} AS l ON true "
)
RECORD_COLUMNS = 10


def record_of_row(cluster_id: str, scope: str, row: Any) -> ScopeRecord:
    """The record of a `RECORD_SELECT` row (None, or a row of NULLs: a never-used scope)."""
    if row is None or row[0] is None:
        return ScopeRecord(scope)
    invariant(row[0] == scope, f"a row of {row[0]!r} read as {scope!r}")
    last_token, delay_until_ns, lease_id = row[1], row[2], row[3]
    lease = None
    if lease_id is not None:
        holder, token, ttl_ms, granted_ns, expires_ns = row[4:9]
        invariant(token <= last_token, f"lease token {token} above last_token {last_token} in {scope!r}")
        lease = Lease(lease_id, holder, FencingToken(cluster_id, scope, token), ttl_ms, granted_ns, expires_ns)
    # Times travel as text: JSON numbers would pass through floats on some paths.
    waiters = tuple(Waiter(w[0], w[1], int(w[2]), int(w[3])) for w in row[9] or ())
    return ScopeRecord(scope, last_token=last_token, lease=lease, delay_until_ns=delay_until_ns, waiters=waiters)


def load_record(conn: Any, cluster_id: str, scope: str) -> ScopeRecord:
    """One scope's record as the tables hold it (a never-used scope: an empty record); one round trip."""
    return record_of_row(cluster_id, scope, conn.execute(RECORD_SELECT + "WHERE s.scope = %s", (scope,)).fetchone())


def forget_record(conn: Any, old: ScopeRecord) -> None:
    """Drop an idle scope's row, folding its last token into the forgotten floor (C1)."""
    scope = old.scope
    invariant(old.lease is None, f"forgetting {scope!r}, which holds a lease")
    deleted = conn.execute(
        "DELETE FROM stockade_coord_scopes WHERE scope = %s AND last_token = %s", (scope, old.last_token)
    ).rowcount
    if deleted == 0:
        exists = conn.execute("SELECT 1 FROM stockade_coord_scopes WHERE scope = %s", (scope,)).fetchone()
        invariant(exists is None, f"last_token of {scope!r} changed underneath this coordinator")
    conn.execute("DELETE FROM stockade_coord_waiters WHERE scope = %s", (scope,))
    conn.execute(
        "INSERT INTO stockade_coord_meta (k, v) VALUES ('forgotten_floor', %s) ON CONFLICT (k) "
        "DO UPDATE SET v = GREATEST(stockade_coord_meta.v::bigint, excluded.v::bigint)::text",
        (str(old.last_token),),
    )


def record_writes(old: ScopeRecord, new: ScopeRecord) -> tuple[list[Statement], bool]:
    """The statements that replace ``old`` by ``new`` in the tables, to be sent together with the COMMIT.

    None of them needs its answer read before the next is sent: the scope
    row's compare-and-set on ``last_token`` checks itself in the statement
    (`stockade_coord_expect`), so a mismatch aborts the transaction before
    its COMMIT. The unit holds the scope's lock, so a mismatch means someone
    wrote the tables without it, and a token could repeat: refuse (C1).

    Returns:
        The statements, and whether a waiter may now be served (the lease or
        the head of the queue changed): the unit notifies the scope then.
    """
    if new == old:
        return [], False
    check_change(old, new)
    scope = new.scope
    out: list[Statement] = []
    if scope_row_changed(old, new):
        out.append((
            "WITH w AS (INSERT INTO stockade_coord_scopes (scope, last_token, delay_until_ns) VALUES (%s, %s, %s) "
            "ON CONFLICT (scope) DO UPDATE SET last_token = excluded.last_token, "
            "delay_until_ns = excluded.delay_until_ns WHERE stockade_coord_scopes.last_token = %s RETURNING 1) "
            "SELECT stockade_coord_expect(EXISTS (SELECT 1 FROM w), %s)",
            (scope, new.last_token, new.delay_until_ns, old.last_token,
             f"last_token of {scope!r} changed underneath this coordinator"),
        ))
    out += log_statements(old, new)  # the lease's row, which is its history (docs/history.md)
    out += lease_and_queue(replace(old, lease=new.lease), new, POSTGRES)  # the queue
    old_head = old.waiters[0].lease_id if old.waiters else None
    new_head = new.waiters[0].lease_id if new.waiters else None
    # Only a scope with waiters needs a NOTIFY (a waiter is in the table before it sleeps, and
    # the scope's lock orders its enqueue and this change). Leaving it out elsewhere matters:
    # a transaction that notified commits under a database-wide lock, one at a time.
    freed = old.lease is not None and (new.lease is None or new.lease.lease_id != old.lease.lease_id)
    return out, bool(new.waiters) and (freed or (old_head is not None and old_head != new_head))
