"""The coordinator's schema of versions 1 to 8, frozen: what the migrations replay, never edited.

A database is brought to the current version by applying, in order, the
migrations it has not had (`stockade.coordinators.postgres._rows.MIGRATIONS`).
Versions 1 to 8 kept each held lease in ``stockade_coord_leases`` (one row per
scope) and the history in ``stockade_coord_history`` (one row per event);
version 9 (`stockade.coordinators.postgres._journal.LEASE_LOG`) replaces both
by the lease log. The text below is exactly what those versions installed, so
that a database of any of them migrates the same way, and the tests can build
one (tests/test_postgres_migrate_log.py).
"""

from __future__ import annotations

from stockade.core.journal import HISTORY_TOTAL_MAX
from stockade.core.tokens import COUNTER_BITS, COUNTER_MAX

__all__ = ["MIGRATIONS_8", "SERVER_RULES_8", "HISTORY_SCHEMA", "HISTORY_APPEND_ONLY", "journal_function",
           "leases_at_least_8", "LEASE_ROWS_MAX_8", "SWEEP_EVERY", "SWEEP_WINDOWS"]

#: Advisory lock class of the per-scope locks and the SQLSTATE of a failed check (as in `_rows`).
SCOPE_LOCK_CLASS = 0x5374_6B02
EXPECT_SQLSTATE = "SK001"

#: Every this many events (by ``seq``) the trim sweeps a range below its bound.
SWEEP_EVERY = 1024
#: How many sweeps cover each ``seq`` value (consecutive sweeps' ranges overlap).
SWEEP_WINDOWS = 4

_TABLE = """
CREATE TABLE IF NOT EXISTS stockade_coord_history (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('grant', 'release', 'expire')),
    holder text NOT NULL,
    token bigint NOT NULL,
    at_unix_ms bigint NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::bigint
);
"""
#: A scope's events, newest first, without a scan (`HISTORY_READ`).
_SCOPE_INDEX = "CREATE INDEX IF NOT EXISTS stockade_coord_history_scope ON stockade_coord_history (scope, seq);\n"


def journal_function(*, total_max: int = HISTORY_TOTAL_MAX, sweep_every: int = SWEEP_EVERY,
                     sweep_windows: int = SWEEP_WINDOWS) -> str:
    """The SQL of ``stockade_coord_journal``: append one event, and now and then trim (the bounds are constants)."""
    return f"""
CREATE OR REPLACE FUNCTION stockade_coord_journal(p_scope text, p_kind text, p_holder text, p_token bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_seq bigint;
BEGIN
    INSERT INTO stockade_coord_history AS h (scope, kind, holder, token) VALUES (p_scope, p_kind, p_holder, p_token)
        RETURNING h.seq INTO v_seq;
    IF v_seq % {sweep_every} = 0 THEN
        DELETE FROM stockade_coord_history h WHERE h.ctid = ANY(ARRAY(SELECT o.ctid FROM stockade_coord_history o
            WHERE o.seq > v_seq - {total_max + sweep_windows * sweep_every} AND o.seq <= v_seq - {total_max}
            FOR UPDATE SKIP LOCKED));
    END IF;
END
$$;
"""


#: Migration 4: the journal's table and function (the server rules are re-created beside it).
HISTORY_SCHEMA = _TABLE + _SCOPE_INDEX + journal_function()

#: Migration 7: the journal appends only. A table of schema 4 to 6 loses its per-scope number ``n``
#: (and the unique index on ``(scope, n)``) and is read through ``(scope, seq)``.
HISTORY_APPEND_ONLY = ("ALTER TABLE stockade_coord_history DROP COLUMN IF EXISTS n;\n"
                       + _SCOPE_INDEX + journal_function())


_NOW = "(extract(epoch FROM clock_timestamp()) * 1000000000)::bigint"
_META = ("(SELECT max(v::bigint) FILTER (WHERE k = 'timeline') AS timeline, "
         "max(v::bigint) FILTER (WHERE k = 'timeline_offset') AS timeline_offset, "
         "max(v::bigint) FILTER (WHERE k = 'epoch') AS epoch, "
         "max(v::bigint) FILTER (WHERE k = 'forgotten_floor') AS forgotten_floor FROM stockade_coord_meta "
         "WHERE k IN ('timeline', 'timeline_offset', 'epoch', 'forgotten_floor')) AS m")
_NEW_TIMELINE = ("m.timeline IS DISTINCT FROM ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))"
                 "::bit(32)::bigint + COALESCE(m.timeline_offset, 0)")

#: At least as many leases as the lease table holds, from two sizes alone, the smaller of:
#: - its heap: a page of ``block_size`` bytes holds at most ``(block_size - 24) / 28`` rows
#:   (PostgreSQL's own bound), live or dead;
#: - its primary key: every lease has one entry there, and a page holds at most
#:   ``(block_size - 40) / 20`` entries (a 16-byte tuple for the shortest scope and its 4-byte line
#:   pointer, after the page header and the B-tree's special space).
#: The heap grows with every grant and release until a vacuum (a grant inserts a row, a release
#: deletes it), past 350 pages in about 30 s at 3,700 cycles/s; the primary key does not when the
#: same scopes are locked again and again (an insert of a scope clears its dead entries). While the
#: smaller is below the bound on leases, nobody counts the table (a count is a scan of every page).
LEASE_ROWS_MAX_8 = ("(SELECT LEAST(pg_relation_size('stockade_coord_leases') / b * ((b - 24) / 28), "
                    "pg_relation_size('stockade_coord_leases_pkey') / b * ((b - 40) / 20)) "
                    "FROM (SELECT current_setting('block_size')::bigint AS b) AS bs)")


def leases_at_least_8(n: str) -> str:
    """SQL: whether at least ``n`` (an SQL expression) leases are stored; counts only a table that could hold them."""
    return (f"CASE WHEN {LEASE_ROWS_MAX_8} < {n} THEN false "
            f"ELSE (SELECT count(*) FROM (SELECT 1 FROM stockade_coord_leases LIMIT {n}) AS n) >= {n} END")


#: The rules of `stockade.core.leases` for the cases that need no decision but the obvious one,
#: each one statement (one round trip) and its own transaction: a grant of a free scope with
#: nobody queued, the renewal or release of a live lease with nobody queued, and the answer
#: for a lease id that no lease has (not held; nothing to write). Each answers no
#: row for every other case (held, queued, expired, lock-delay, a new timeline, a full table, a
#: counter at the end of its epoch), and then the lease engine decides, in Python, as for every
#: backend. Tests hold both paths to the same answers (tests/test_coordinator_postgres.py).
#: Each function runs three statements: the grant its lock, one read, one write; the keep one
#: read, its lock, one write (the write checks the lease is still live and nobody queued).
#: A grant and a release write their event (`stockade_coord_journal`) in their own transaction.
SERVER_RULES_8 = f"""
CREATE OR REPLACE FUNCTION stockade_coord_grant(p_scope text, p_lease_id text, p_holder text, p_ttl_ms bigint,
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
BEGIN
    PERFORM pg_advisory_xact_lock({SCOPE_LOCK_CLASS}, hashtext(p_scope));
    v_now := {_NOW};
    -- A later statement than the lock: it reads what the lock protects.
    SELECT COALESCE(s.last_token, 0), COALESCE(s.delay_until_ns, 0),
           {_NEW_TIMELINE}
           OR v_now < COALESCE(s.delay_until_ns, 0)
           OR EXISTS (SELECT 1 FROM stockade_coord_leases l WHERE l.scope = p_scope)
           OR EXISTS (SELECT 1 FROM stockade_coord_waiters w WHERE w.scope = p_scope)
           OR {leases_at_least_8('p_leases_max')},
           GREATEST(COALESCE(s.last_token, 0), m.epoch << {COUNTER_BITS}, COALESCE(m.forgotten_floor, 0)),
           s.scope IS NOT NULL
      INTO v_last, v_delay, v_refused, v_base, v_exists
      FROM {_META} LEFT JOIN stockade_coord_scopes s ON s.scope = p_scope;
    IF v_refused OR v_base & {COUNTER_MAX} = {COUNTER_MAX} THEN
        RETURN;  -- busy, a new timeline, a full table, or a counter at the end of its epoch: the engine decides
    END IF;
    -- The scope row's compare-and-set and the lease in one statement: no lease without its token recorded.
    -- A used scope's row is updated in place, a new scope's inserted (an upsert would lock the row first:
    -- one WAL record more a grant).
    WITH u AS (
        UPDATE stockade_coord_scopes AS s SET last_token = v_base + 1 WHERE s.scope = p_scope AND s.last_token = v_last
            RETURNING 1),
    i AS (
        INSERT INTO stockade_coord_scopes (scope, last_token, delay_until_ns) SELECT p_scope, v_base + 1, v_delay
            WHERE NOT v_exists ON CONFLICT (scope) DO NOTHING RETURNING 1),
    s AS (SELECT 1 FROM u UNION ALL SELECT 1 FROM i)
    INSERT INTO stockade_coord_leases (scope, lease_id, holder, token, ttl_ms, granted_ns, expires_ns)
        SELECT p_scope, p_lease_id, p_holder, v_base + 1, p_ttl_ms, v_now, v_now + p_ttl_ms * 1000000 FROM s;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '{EXPECT_SQLSTATE}',
            MESSAGE = format('last_token of %L changed underneath this coordinator', p_scope);
    END IF;
    PERFORM stockade_coord_journal(p_scope, 'grant', p_holder, v_base + 1);  -- the history, in this commit
    token := v_base + 1;
    now_ns := v_now;
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION stockade_coord_keep(p_lease_id text, p_release boolean)
RETURNS TABLE (scope text, holder text, token bigint, ttl_ms bigint, granted_ns bigint, expires_ns bigint,
               now_ns bigint) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now bigint;
    v_scope text;
    v_refused boolean;
BEGIN
    v_now := {_NOW};
    SELECT l.scope, {_NEW_TIMELINE} INTO v_scope, v_refused
      FROM {_META} LEFT JOIN stockade_coord_leases l ON l.lease_id = p_lease_id;
    IF v_refused THEN
        RETURN;
    END IF;
    IF v_scope IS NULL THEN  -- no such lease: nothing to write, the answer is "not held" (a row without a scope)
        now_ns := v_now;
        RETURN NEXT;
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock({SCOPE_LOCK_CLASS}, hashtext(v_scope));
    v_now := {_NOW};  -- the lock may have waited
    -- A later statement than the lock: it reads what the lock protects. Only a live lease with
    -- nobody queued is released or renewed here; for anything else no row changes (the engine's path).
    IF p_release THEN
        DELETE FROM stockade_coord_leases l
         WHERE l.scope = v_scope AND l.lease_id = p_lease_id AND v_now < l.expires_ns
           AND NOT EXISTS (SELECT 1 FROM stockade_coord_waiters w WHERE w.scope = v_scope)
        RETURNING l.scope, l.holder, l.token, l.ttl_ms, l.granted_ns, l.expires_ns
             INTO scope, holder, token, ttl_ms, granted_ns, expires_ns;
    ELSE
        UPDATE stockade_coord_leases l SET expires_ns = v_now + l.ttl_ms * 1000000
         WHERE l.scope = v_scope AND l.lease_id = p_lease_id AND v_now < l.expires_ns
           AND NOT EXISTS (SELECT 1 FROM stockade_coord_waiters w WHERE w.scope = v_scope)
        RETURNING l.scope, l.holder, l.token, l.ttl_ms, l.granted_ns, l.expires_ns
             INTO scope, holder, token, ttl_ms, granted_ns, expires_ns;
    END IF;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_release THEN
        PERFORM stockade_coord_journal(v_scope, 'release', holder, token);  -- the history, in this commit
    END IF;
    now_ns := v_now;
    RETURN NEXT;
END
$$
"""

MIGRATIONS_8: tuple[str, ...] = (
    # 1: the lease table, the waiters, the meta values, the keyring.
    """
    CREATE TABLE IF NOT EXISTS stockade_coord_meta (k text PRIMARY KEY, v text NOT NULL);
    CREATE TABLE IF NOT EXISTS stockade_coord_scopes (
        scope text PRIMARY KEY,
        last_token bigint NOT NULL,
        delay_until_ns bigint NOT NULL,
        created bigint GENERATED ALWAYS AS IDENTITY
    );
    CREATE TABLE IF NOT EXISTS stockade_coord_leases (
        scope text PRIMARY KEY,
        lease_id text NOT NULL UNIQUE,
        holder text NOT NULL,
        token bigint NOT NULL,
        ttl_ms bigint NOT NULL,
        granted_ns bigint NOT NULL,
        expires_ns bigint NOT NULL
    );
    CREATE INDEX IF NOT EXISTS stockade_coord_leases_expires ON stockade_coord_leases (expires_ns);
    CREATE TABLE IF NOT EXISTS stockade_coord_waiters (
        scope text NOT NULL,
        seq bigint NOT NULL,
        lease_id text NOT NULL UNIQUE,
        holder text NOT NULL,
        deadline_ns bigint NOT NULL,
        stale_ns bigint NOT NULL,
        PRIMARY KEY (scope, seq)
    );
    CREATE TABLE IF NOT EXISTS stockade_coord_keyring (id int PRIMARY KEY CHECK (id = 1), doc bytea NOT NULL);
    REVOKE ALL ON stockade_coord_keyring FROM PUBLIC
    """,
    # 2: a check inside a statement, so that a unit whose writes and COMMIT travel together
    # (one round trip) fails before its COMMIT when a compare-and-set does not match.
    f"""
    CREATE OR REPLACE FUNCTION stockade_coord_expect(ok boolean, message text) RETURNS void
    LANGUAGE plpgsql AS $$
    BEGIN
        IF NOT ok THEN
            RAISE EXCEPTION USING ERRCODE = '{EXPECT_SQLSTATE}', MESSAGE = message;
        END IF;
    END
    $$
    """,
    # 3: the common cases of acquire, renew and release in one statement each (see SERVER_RULES_8).
    SERVER_RULES_8,
    # 4: the lease history (`stockade.coordinators.postgres._journal`), and the server rules
    # again: journaling, and in fewer statements inside each function (3 each instead of about 7;
    # a lock cycle's server CPU was mostly the functions' statements). Replaces the functions of 3.
    HISTORY_SCHEMA + SERVER_RULES_8,
    # 5: the server rules again: a grant counts the held leases only when the lease table is large
    # enough to hold the bound on them (it counted up to 100,000 rows on every grant).
    SERVER_RULES_8,
    # 6: the server rules again: the lease table's size is also judged by its primary key, which
    # churn does not grow (under a steady load the heap passed the bound's size in about 30 s, and
    # from then on every grant counted it: 8 processes' 3,700 cycles/s fell to about 2,970).
    SERVER_RULES_8,
    # 7: the journal appends only (`HISTORY_APPEND_ONLY`): no per-scope number and no delete per
    # event, a bounded sweep every 1,024 events instead; reads take a scope's newest events.
    # The history was about a third of the server's CPU per lock cycle.
    HISTORY_APPEND_ONLY,
    # 8: the server rules again: the grant updates a used scope's row in place instead of an upsert,
    # which locked the row first (a WAL record of its own: 15 records a lock cycle, now 14;
    # tests/test_postgres_wal_per_cycle.py).
    SERVER_RULES_8,
)
