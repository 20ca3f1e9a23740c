"""The SQL text of the PostgreSQL fence adapter (`stockade.resources.postgres`).

Kept apart from the Python so the whole server side can be read in one place:
the tables (schema ``stockade``, versioned by `MIGRATIONS`), the check
``stockade.fence(token, scope)`` and the trigger function of protected tables.

``stockade.fence`` is the one statement a fenced transaction runs. In order:

    0. parse the token (stk2 signed, stk1 unsigned)        -> SQLSTATE 22023 if malformed
       read the settings, the key and the mark, holding the
       floor's gate until the transaction ends, and remember
       the token in the transaction-local setting
       stockade.tokens (a refusal takes it back)
    1. verify its MAC with the keys in stockade.keys       -> reject "forged" (nothing else looked at)
    2. cluster, then scope                                 -> reject "wrong-cluster" / "wrong-scope"
    3. the default floor as committed                      -> SQLSTATE 40001 under REPEATABLE READ or
                                                              SERIALIZABLE if raised since the snapshot
       lock the scope until the transaction ends (shared
       when the token does not raise the mark, exclusive
       when it does), then read the mark as committed      -> 40001 likewise if it moved since
    4. token < max(mark, default floor)                    -> reject "stale"
    5. raise the mark                                      -> return the mark

A rejection is ``RAISE`` with SQLSTATE `REJECT_SQLSTATE` and a detail
``reason=<r> high_water=<n> cluster=<c> detail=<d>`` that the Python side
parses back into `stockade.core.fence.Reject`.

**Locks no other role can take.** The scope's lock is a lock on one of
`SCOPE_LOCKS` views ``stockade_private.scope_lock_<hashtext(scope) & 1023>``
(ROW SHARE for a token that does not raise the mark, EXCLUSIVE for one that
does), and the floor's is the view `FLOOR_GATE` (each check holds it ACCESS
SHARE, `raise_high_waters` takes it ACCESS EXCLUSIVE, so a floor is never
raised between a check and its commit). Only the installing role may use the
schema ``stockade_private``, so no other role can name the views, nor lock
them; others reach them only through this ``SECURITY DEFINER`` function, which
locks a scope only after the token's MAC passed (a failed call's locks go with
its aborted transaction or savepoint). Schema 1 used advisory locks, which any
role that may connect can take, on keys it can derive or read in ``pg_locks``:
one idle session froze every fenced write. A lock on a view is a heavyweight
lock like the advisory one: it writes nothing, and its queue is first come,
first served. A row lock would write a WAL record in every transaction, and
its FOR SHARE lockers jump the queue of a waiting raise (measured: a higher
token waited while over 1,400 transactions of the current one committed). Scopes of
one view only share a lock (more waiting, never a wrong answer). Views, not
tables: pg_dump locks the tables it dumps until it ends.

**Read as committed, at every isolation level.** The first statement reads
through the statement's snapshot, which under REPEATABLE READ and SERIALIZABLE
is the transaction's and may predate a floor raised before the gate was
granted. The settings version a committed transaction replaced carries that
transaction's id as its ``xmax`` (nothing locks that row, and the newest version
carries 0): then READ COMMITTED reads it again, after the gate, and the other
levels fail with 40001. The mark is read again once the scope's lock is held:
under READ COMMITTED with a fresh snapshot, under the other levels with its row
locked FOR SHARE (a row changed since the snapshot is 40001).

**A newer token waits a bounded time.** A raise waits for the EXCLUSIVE
lock at most the bound given to `install` (``supersede_after_ms``), then ends
the sessions holding the scope with a lower token and waits again: `stockade.resources.postgres._supersede`
says how a holder's token is known, and what the installing role needs.

``stockade.fence_op(token, scope, op_id)`` is the check of a transaction that
carries an operation id (R3): `fence_op_function` says what it adds.
``stockade.cover(relation, scope)`` and the event trigger function
``stockade.ddl_guard()`` keep protected tables whole: `cover_functions` says how.
"""

from __future__ import annotations

from stockade.core.limits import OP_ID_BYTES_MAX, OPERATION_IDS_MAX, SCOPE_CHARS, SUPERSEDE_AFTER_MS
from stockade.resources.postgres._sql_schema1 import FENCE_ADVISORY
from stockade.resources.postgres._supersede import IDENTITY_SQL, NO_SUPERSEDE, SUPERSEDE_SQL

__all__ = [
    "SCHEMA_VERSION", "MIGRATIONS", "REJECT_SQLSTATE", "NO_TOKEN_SQLSTATE", "INSTALL_LOCK_KEY", "FLOOR_LOCK_KEY",
    "SCOPE_LOCK_CLASS", "ALREADY_APPLIED_SQLSTATE", "PROTECT_SQLSTATE", "DDL_GUARD_NAME", "DDL_GUARD_SQL",
    "STALE_WHEN", "FENCE_BODIES", "FLOOR_GATE", "SCOPE_LOCKS", "fence_function", "guard_function",
    "fence_op_function",
]

#: The schema version `install` migrates to.
SCHEMA_VERSION = 3
#: SQLSTATE of a fence rejection (class "SK": stockade's own).
REJECT_SQLSTATE = "SKF01"
#: SQLSTATE of a write to a protected table in a transaction that passed no fence for its scope.
NO_TOKEN_SQLSTATE = "SKF02"
#: SQLSTATE of a protected tree that cannot be covered (`protect`, or DDL refused by the DDL guard).
PROTECT_SQLSTATE = "SKF03"
#: SQLSTATE of ``stockade.fence_op`` for an operation id already applied (detail ``token_value=<n>``).
ALREADY_APPLIED_SQLSTATE = "SKF04"
#: Advisory lock key (bigint) that serialises installs.
INSTALL_LOCK_KEY = 0x73746B6400000001
#: The view whose lock orders checks against floors: each check holds it ACCESS SHARE, a raise ACCESS EXCLUSIVE.
FLOOR_GATE = "stockade_private.floor_gate"
#: How many views ``stockade_private.scope_lock_<n>`` lock scopes (by ``hashtext(scope) & (n - 1)``).
SCOPE_LOCKS = 1024
#: Schema 1's advisory keys, used only by the ``advisory`` control body (`FENCE_BODIES`): the
#: floor's, and the first key of the two-key locks of scopes (the second is ``hashtext(scope)``).
FLOOR_LOCK_KEY = 0x73746B6400000002
SCOPE_LOCK_CLASS = 0x73746B64

#: Migration n (1-based) takes the schema from version n-1 to n. Never edit one that shipped: add one.
MIGRATIONS = (
    """
    CREATE TABLE stockade.version (
        id int PRIMARY KEY CHECK (id = 1),
        version int NOT NULL
    );
    CREATE TABLE stockade.settings (
        id int PRIMARY KEY CHECK (id = 1),
        cluster_id text NOT NULL CHECK (cluster_id ~ '^[0-9a-f]{16}$'),
        verify_macs boolean NOT NULL,
        default_floor bigint NOT NULL DEFAULT 0 CHECK (default_floor >= 0)
    );
    CREATE TABLE stockade.high_water (
        scope text PRIMARY KEY,
        high_water bigint NOT NULL CHECK (high_water >= 0)
    );
    CREATE TABLE stockade.keys (
        kid text PRIMARY KEY CHECK (kid ~ '^[0-9a-f]{8}$'),
        secret bytea NOT NULL CHECK (length(secret) = 32),
        verify_until_s bigint
    );
    CREATE TABLE stockade.protected (
        relation regclass PRIMARY KEY,
        scope text NOT NULL
    );
    REVOKE ALL ON ALL TABLES IN SCHEMA stockade FROM PUBLIC;
    GRANT USAGE ON SCHEMA stockade TO PUBLIC;
    """,
    # The locks of the check: views in a schema no other role may use, so that no other role can
    # name them, and so none can lock them (an advisory lock any role can take): the floor's gate,
    # and SCOPE_LOCKS views that scopes are spread over. Views, not tables: pg_dump locks the
    # tables it dumps until it ends, and a raise would wait for that dump.
    f"""
    CREATE SCHEMA IF NOT EXISTS stockade_private;
    REVOKE ALL ON SCHEMA stockade_private FROM PUBLIC;
    CREATE OR REPLACE VIEW stockade_private.floor_gate AS SELECT 1 AS one;
    DO $views$ BEGIN
        FOR i IN 0..{SCOPE_LOCKS - 1} LOOP
            EXECUTE format('CREATE OR REPLACE VIEW stockade_private.scope_lock_%s AS SELECT 1 AS one', i);
        END LOOP;
    END $views$;
    REVOKE ALL ON ALL TABLES IN SCHEMA stockade_private FROM PUBLIC;
    """,
    # Operation ids (R3): one row per applied operation, the newest OPERATION_IDS_MAX kept (`fence_op_function`).
    """
    CREATE TABLE stockade.operations (
        scope text NOT NULL,
        op_id text NOT NULL,
        token_value bigint NOT NULL,
        seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
        PRIMARY KEY (scope, op_id)
    );
    REVOKE ALL ON stockade.operations FROM PUBLIC;
    """,
)

#: The private seam of the controls: the SQL condition under which a token is stale, on
#: ``v_value`` (the token's), ``v_own`` (the scope's mark) and ``v_floor`` (the default floor): the
#: effective mark is the greater of the two. `decide`'s rule is "<".
STALE_WHEN = {
    "decide": "v_value < greatest(v_own, v_floor)",
    "strict-greater": "v_value <= greatest(v_own, v_floor)",
    "fencing-off": "false",
}

_FENCE = r"""
-- Whether the version of stockade.settings whose xmax is this (32-bit) transaction id was replaced
-- by a committed transaction. Only plain UPDATEs set that xmax (nothing locks the row, nor may: a
-- lock would leave its locker's id on the newest version); an update that rolled back, or this
-- transaction's own, has not replaced it.
CREATE OR REPLACE FUNCTION stockade_private.replaced(xmax text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $replaced$
DECLARE
    v_next bigint := pg_snapshot_xmax(pg_current_snapshot())::text::bigint;
    v_xid bigint;
BEGIN
    -- The full id nearest the snapshot's (the two are less than 2^31 apart).
    v_xid := v_next + ((xmax::bigint - (v_next & 4294967295)) % 4294967296 + 6442450944) % 4294967296
             - 2147483648;
    RETURN coalesce(pg_xact_status(v_xid::text::xid8), 'committed') = 'committed';
END
$replaced$;
REVOKE ALL ON FUNCTION stockade_private.replaced(text) FROM PUBLIC;

@SUPERSEDE@
CREATE OR REPLACE FUNCTION stockade.fence(token text, scope text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fence$
DECLARE
    v_parts text[];
    v_cluster text;
    v_value bigint;
    v_kid text;
    v_mac text;
    v_scope text;
    v_cluster_id text;
    v_verify boolean;
    v_floor bigint;
    v_current boolean;
    v_xmax xid;
    v_key_found boolean;
    v_secret bytea;
    v_until bigint;
    v_forged text;
    v_void text;
    v_own bigint;
    v_lock text;
    v_rc boolean;
    v_fast boolean;
    v_hash int;
    v_hash_lo int;
    v_row tid;
    v_held boolean;
BEGIN
    -- The common case first: a signed token whose MAC verifies, of this cluster and scope. Its fields
    -- are cut out with split_part alone, and the whole token must read back as
    -- stk2.<cluster>.<value>.<kid>.<mac>.<scope> with this database's cluster and the scope asked for:
    -- the MAC binds kid, cluster, value and scope, and only the coordinator signs, so a token that
    -- passes is well formed (its value a decimal below 2^63) without a regular expression. Any other
    -- token (unsigned, forged, malformed, another cluster's or scope's, a retired key's) takes the
    -- full path below, which finds why, in the order P3 and R2 say.
    -- The common case is one statement, with as few function calls as it can have: PL/pgSQL keeps its
    -- plans, but builds every expression it runs again in each transaction (each function call with its
    -- look-ups and permission check), and each statement of its own costs its set-up on top. That
    -- statement reads the settings, the token's key and the scope's mark (and where that row is),
    -- verifies the common case, records the token for a protected table's trigger (a failed check takes
    -- that back with its transaction or savepoint), builds the text of the scope's lock, and takes the
    -- floor's gate: ACCESS SHARE on the view stockade_private.floor_gate, held until the transaction
    -- ends, so that raise_high_waters (ACCESS EXCLUSIVE on it) waits for this transaction. Only the
    -- installing role can name that schema, so no other role can hold the gate (an advisory lock any
    -- role can take, and pg_locks shows every key to every role).
    -- The isolation level is read here too (it cannot change once the transaction has a snapshot).
    -- The test reads the token back and compares its MAC. The MAC's message
    -- stk2\0<kid>\0<cluster>\0<value>\0<scope> is decoded from text in which \000 stands for the zero
    -- byte (one call, where a bytea built piece by piece takes eleven), so a token holding a backslash
    -- (which no coordinator issues) is tested first: only the separators decode to zero bytes.
    -- concat_ws skips a NULL, but then the MAC is NULL too (no key), or the scope is tested first.
    -- A key with a deadline (one being retired) takes the full path, which reads the clock.
    SELECT s.cluster_id, s.verify_macs, s.default_floor, s.xmax = '0'::xid, s.xmax, coalesce(h.high_water, 0),
           h.ctid, current_setting('transaction_isolation') = 'read committed',
           s.verify_macs AND k.verify_until_s IS NULL AND fence.scope IS NOT NULL AND strpos(token, E'\\') = 0
           AND token = concat_ws('.', 'stk2', s.cluster_id, split_part(token, '.', 3), k.kid,
                                 split_part(token, '.', 5), fence.scope)
           AND replace(replace(encode(substring(@PGCRYPTO@.hmac(
                   decode(concat_ws(E'\\000', 'stk2', k.kid, s.cluster_id, split_part(token, '.', 3), fence.scope),
                          'escape'),
                   k.secret, 'sha256') FROM 1 FOR 16), 'base64'), '+', '-'), '/', '_')
               = split_part(token, '.', 5) || '==',
           hashtext(fence.scope), hashtext(fence.scope || '/lo'),
           'LOCK TABLE stockade_private.scope_lock_' || (hashtext(fence.scope) & @STRIPE_MASK@) || ' IN ROW SHARE MODE',
           @SET_TOKENS@
      INTO STRICT v_cluster_id, v_verify, v_floor, v_current, v_xmax, v_own, v_row, v_rc, v_fast, v_hash, v_hash_lo,
           v_lock, v_void
      FROM stockade.settings s
      CROSS JOIN stockade_private.floor_gate g
      LEFT JOIN stockade.keys k ON k.kid = split_part(token, '.', 4)
      LEFT JOIN stockade.high_water h ON h.scope = fence.scope
     WHERE s.id = 1;

    IF v_fast THEN
        v_value := split_part(token, '.', 3)::bigint;
    ELSE
        v_parts := NULL;
        v_kid := '';
        v_mac := '';
        -- Parsed with split_part and plain character classes: bounded repeats ({16}) make
        -- PostgreSQL's regex engine cost ~150 us a call, more than the rest of the check.
        IF token IS NULL OR scope IS NULL OR length(scope) > 200 OR scope !~ '^[@SCOPE_CHARS@]+$'
           OR scope IN ('.', '..') THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'stockade.fence: bad scope or no token';
        END IF;
        IF left(token, 5) = 'stk2.' THEN
            v_parts := ARRAY[split_part(token, '.', 2), split_part(token, '.', 3), split_part(token, '.', 4),
                             split_part(token, '.', 5)];
            v_kid := v_parts[3];
            v_mac := v_parts[4];
            v_scope := substr(token, 10 + length(v_parts[1]) + length(v_parts[2]) + length(v_kid) + length(v_mac));
            IF length(v_kid) <> 8 OR v_kid !~ '^[0-9a-f]+$' OR length(v_mac) <> 22 OR v_mac !~ '^[A-Za-z0-9_-]+$' THEN
                v_parts := NULL;
            END IF;
        ELSIF left(token, 5) = 'stk1.' THEN
            v_parts := ARRAY[split_part(token, '.', 2), split_part(token, '.', 3)];
            v_scope := substr(token, 8 + length(v_parts[1]) + length(v_parts[2]));
        END IF;
        IF v_parts IS NULL OR length(v_parts[1]) <> 16 OR v_parts[1] !~ '^[0-9a-f]+$'
           OR length(v_parts[2]) NOT BETWEEN 1 AND 19 OR v_parts[2] !~ '^[1-9][0-9]*$'
           OR v_parts[2]::numeric > 9223372036854775807
           OR length(v_scope) NOT BETWEEN 1 AND 200 OR v_scope !~ '^[@SCOPE_CHARS@]+$' OR v_scope IN ('.', '..') THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'stockade.fence: malformed token';
        END IF;
        v_cluster := v_parts[1];
        v_value := v_parts[2]::bigint;
        -- The key of the token as parsed in full (an unsigned token has none).
        SELECT k.kid IS NOT NULL, k.secret, k.verify_until_s INTO v_key_found, v_secret, v_until
          FROM (SELECT 1) one LEFT JOIN stockade.keys k ON k.kid = v_kid;

        -- 1. the MAC, before anything else is looked at (P3)
        IF v_verify THEN
            IF v_mac = '' THEN
                v_forged := 'unsigned';
            ELSIF NOT v_key_found THEN
                v_forged := 'unknown-key';
            ELSIF v_until IS NOT NULL AND extract(epoch FROM clock_timestamp()) >= v_until THEN
                v_forged := 'retired-key';
            ELSIF rtrim(translate(encode(substring(@PGCRYPTO@.hmac(
                      convert_to('stk2', 'UTF8') || '\x00'::bytea || convert_to(v_kid, 'UTF8')
                      || '\x00'::bytea || convert_to(v_cluster, 'UTF8') || '\x00'::bytea
                      || convert_to(v_parts[2], 'UTF8') || '\x00'::bytea || convert_to(v_scope, 'UTF8'),
                      v_secret, 'sha256') FROM 1 FOR 16), 'base64'), '+/', '-_'), '=') IS DISTINCT FROM v_mac THEN
                v_forged := 'bad-mac';
            END IF;
            IF v_forged IS NOT NULL THEN
                RAISE EXCEPTION USING ERRCODE = '@REJECT@', MESSAGE = 'stockade.fence: token refused (forged)',
                    DETAIL = format('reason=forged high_water=0 cluster=%s detail=%s', v_cluster_id, v_forged);
            END IF;
        END IF;

        -- 2. R2: the cluster, then the scope
        IF v_cluster <> v_cluster_id OR v_scope <> scope THEN
            RAISE EXCEPTION USING ERRCODE = '@REJECT@', MESSAGE = 'stockade.fence: token refused (R2)',
                DETAIL = format('reason=%s high_water=0 cluster=%s detail=',
                                CASE WHEN v_cluster <> v_cluster_id THEN 'wrong-cluster' ELSE 'wrong-scope' END,
                                v_cluster_id);
        END IF;
    END IF;

    -- 3. the floor as committed. The statement above may have read the settings through a snapshot
    --    taken before a raise_high_waters that committed before the gate was granted: always so
    --    under REPEATABLE READ and SERIALIZABLE, where the snapshot is the transaction's first. The
    --    version a committed transaction replaced carries that transaction's id as its xmax (the
    --    gate was held when it was read, so no raise was under way). Then READ COMMITTED reads it
    --    again (a new snapshot, taken after the gate was granted), and the other levels fail with
    --    a serialization failure (SQLSTATE 40001): never a stale floor.
    --    (The test of the xmax is nested: PL/pgSQL builds an expression only when it first runs it.)
    IF NOT v_current THEN
        IF stockade_private.replaced(v_xmax::text) THEN
            IF NOT v_rc THEN
                RAISE EXCEPTION USING ERRCODE = '40001',
                    MESSAGE = 'stockade.fence: could not serialize access: the fence floor was raised '
                              'after this transaction took its snapshot';
            END IF;
            SELECT s.default_floor INTO STRICT v_floor FROM stockade.settings s WHERE s.id = 1;
        END IF;
    END IF;

    -- 3b. the scope's lock, held until the transaction ends: a lock on one of the views
    --    stockade_private.scope_lock_<hashtext(scope) & @STRIPE_MASK@>, which only the installing role
    --    can name. Shared (ROW SHARE) by holders of a token that does not raise the mark (no false
    --    waits, S19); EXCLUSIVE to raise it, so that a higher token waits until every open
    --    transaction admitted under the current mark has ended (R6), and a transaction that
    --    arrives after it waits in the lock's queue, reads the raised mark and is refused. The
    --    queue is first come, first served (a row lock is not: FOR SHARE lockers that keep
    --    overlapping starve a waiting raise). A lock writes nothing. Scopes of one view only share
    --    a lock (more waiting, never a wrong answer).
    --    Before it, the holder's identity (`SUPERSEDE`): the scope and the token, in two shared
    --    advisory locks taken without waiting, so that a newer token can tell a lower holder.
    @IDENTITY@
    IF v_value > v_own THEN
        v_void := stockade_private.raise_lock(v_hash & @STRIPE_MASK@, fence.scope, v_value)::text;
    ELSE
        EXECUTE v_lock;
    END IF;
    -- The mark as committed, read again now that the lock is held: under READ COMMITTED with a
    -- fresh snapshot; under the other levels the row is locked too (FOR SHARE, one WAL record),
    -- so that a mark committed after the transaction's snapshot is a serialization failure
    -- (40001), never a stale admission. READ COMMITTED reads first the row version the first
    -- statement found, by its place (ctid): a fresh snapshot sees at most one version of a row, so if
    -- that one is still visible, and still the scope's (a place can be reused after pruning), it is
    -- the mark as committed now; if a raise replaced it, the mark is read again by the scope.
    IF v_rc THEN
        SELECT h.high_water INTO v_own FROM stockade.high_water h WHERE h.ctid = v_row AND h.scope = fence.scope;
        IF NOT FOUND THEN
            SELECT coalesce(max(h.high_water), 0) INTO v_own FROM stockade.high_water h WHERE h.scope = fence.scope;
        END IF;
    ELSE
        INSERT INTO stockade.high_water AS h (scope, high_water) VALUES (fence.scope, 0) ON CONFLICT DO NOTHING;
        SELECT h.high_water INTO STRICT v_own FROM stockade.high_water h WHERE h.scope = fence.scope FOR SHARE;
    END IF;
    -- 4. R1, and 5. the raise: one test in the common case, a token equal to the mark, whose value
    --    is the mark (a RETURN of a variable builds no expression).
    IF @STALE_WHEN@ OR v_value > v_own THEN
        IF @STALE_WHEN@ THEN
            RAISE EXCEPTION USING ERRCODE = '@REJECT@', MESSAGE = 'stockade.fence: token refused (stale)',
                DETAIL = format('reason=stale high_water=%s cluster=%s detail=', greatest(v_own, v_floor),
                                v_cluster_id);
        END IF;
        -- raise the mark (only when it moves: an equal token writes nothing)
        IF v_value > v_own THEN
            INSERT INTO stockade.high_water AS h (scope, high_water) VALUES (fence.scope, v_value)
                ON CONFLICT ON CONSTRAINT high_water_pkey
                DO UPDATE SET high_water = greatest(h.high_water, excluded.high_water);
        END IF;
        RETURN greatest(v_value, v_own, v_floor);
    END IF;
    RETURN v_value;
END
$fence$;
REVOKE ALL ON FUNCTION stockade.fence(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION stockade.fence(text, text) TO PUBLIC;
"""

_GUARD = r"""
CREATE OR REPLACE FUNCTION stockade.guard() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $guard$
DECLARE
    v_scope text := TG_ARGV[0];
    v_setting text := current_setting('stockade.tokens', true);
    v_token text := reverse(split_part(reverse(v_setting), ' ', 1));  -- the last (no negative position before 14)
    v_each text[];
BEGIN
    -- The setting is only where to find the token: anyone can SET LOCAL it, so the
    -- token is checked again in full (MAC, scope, mark), under the same scope lock.
    -- Each check of the transaction appended its token (a token holds no space); the newest
    -- of this scope counts, most often the last one. A token that passed a check has its scope
    -- at a place its value alone moves: its cluster has 16 characters, and a signed one's kid 8
    -- and MAC 22. A JSON map of scope to token (what checks before issue 29 wrote) is read too.
    IF substr(v_token, CASE left(v_token, 5) WHEN 'stk2.' THEN 56 ELSE 24 END
              + length(split_part(v_token, '.', 3))) IS DISTINCT FROM v_scope THEN
        v_token := NULL;
        v_each := string_to_array(v_setting, ' ');
        FOR i IN REVERSE coalesce(array_upper(v_each, 1), 0)..1 LOOP
            IF substr(v_each[i], CASE left(v_each[i], 5) WHEN 'stk2.' THEN 56 ELSE 24 END
                      + length(split_part(v_each[i], '.', 3))) = v_scope THEN
                v_token := v_each[i];
                EXIT;
            END IF;
        END LOOP;
        IF v_token IS NULL AND left(v_setting, 1) = '{' THEN
            BEGIN
                v_token := v_setting::jsonb ->> v_scope;
            EXCEPTION WHEN others THEN
                v_token := NULL;
            END;
        END IF;
    END IF;
    IF v_token IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '@NO_TOKEN@',
            MESSAGE = format('stockade: %s on %s refused: the table is fenced (scope %s) and this transaction '
                             'passed no stockade.fence(token, scope) for it', TG_OP, TG_TABLE_NAME, v_scope);
    END IF;
    v_token := stockade.fence(v_token, v_scope)::text;  -- an assignment: no statement of its own
    -- The check appended the token again: put the setting back, so that it grows with the
    -- transaction's checks, not with its writes to protected tables.
    v_token := set_config('stockade.tokens', v_setting, true);
    RETURN NULL;
END
$guard$;
"""


def _pgcrypto_ident(schema: str) -> str:
    return '"' + schema.replace('"', '""') + '"'


#: The token, for a protected table's trigger (`stockade.guard`): appended to the transaction's list,
#: separated by a space (a token that passes holds none).
_SET_TOKENS = "set_config('stockade.tokens', concat_ws(' ', current_setting('stockade.tokens', true), token), true)"


def fence_function(*, pgcrypto_schema: str, stale_when: str, body: str = "private",
                   supersede_after_ms: int = SUPERSEDE_AFTER_MS) -> str:
    """The ``CREATE OR REPLACE`` of ``stockade.fence`` with its comparison (`STALE_WHEN`) and `FENCE_BODIES` entry.

    ``supersede_after_ms`` is the bound of `SUPERSEDE` (0: the control, a raise waits without bound)."""
    return (FENCE_BODIES[body].replace("@PGCRYPTO@", _pgcrypto_ident(pgcrypto_schema))
            .replace("@REJECT@", REJECT_SQLSTATE).replace("@FLOOR_KEY@", str(FLOOR_LOCK_KEY))
            .replace("@SCOPE_CLASS@", str(SCOPE_LOCK_CLASS))
            .replace("@STRIPE_MASK@", str(SCOPE_LOCKS - 1)).replace("@STALE_WHEN@", stale_when)
            .replace("@SUPERSEDE@", SUPERSEDE_SQL if supersede_after_ms else NO_SUPERSEDE)
            .replace("@IDENTITY@", IDENTITY_SQL if supersede_after_ms else "").replace("@SET_TOKENS@", _SET_TOKENS)
            .replace("@BOUND_MS@", str(supersede_after_ms)).replace("@SCOPE_CHARS@", SCOPE_CHARS))


#: The private seam of the locking controls: ``private`` is the function `install` defines; ``advisory``
#: is schema 1's, kept verbatim as the control of two findings: it reads the default floor through the
#: transaction's snapshot (a REPEATABLE READ transaction commits below a floor raised after its
#: first read) and serialises with advisory locks, which every role that may connect can take.
FENCE_BODIES = {"private": _FENCE, "advisory": FENCE_ADVISORY}


def guard_function() -> str:
    """The ``CREATE OR REPLACE`` of the protected tables' functions: the trigger function
    ``stockade.guard``, the tree rule ``stockade.cover`` and the DDL guard's ``stockade.ddl_guard``."""
    return (_GUARD + _COVER + _DDL_GUARD).replace("@NO_TOKEN@", NO_TOKEN_SQLSTATE).replace(
        "@PROTECT@", PROTECT_SQLSTATE)


# -- protected trees -------------------------------------------------------------------------------
#
# A trigger fires only on the relation it is on: a statement trigger on a partitioned table
# fires for statements that name that table, not for an UPDATE or a TRUNCATE that names a
# partition; PostgreSQL clones row triggers to partitions, never statement or TRUNCATE
# triggers; inheritance children inherit no trigger at all. And a write through a parent
# reaches the rows of every child without firing the child's statement triggers. So the unit
# of protection is the whole inheritance tree (the relations linked through pg_inherits,
# either way): every member carries the trigger, with one scope, or none does.
# ``stockade.cover`` is that rule, once, for `protect` and for the DDL guard.

#: The event trigger that covers members added later (its creation needs a superuser).
DDL_GUARD_NAME = "stockade_ddl_guard"
DDL_GUARD_SQL = (
    "CREATE EVENT TRIGGER stockade_ddl_guard ON ddl_command_end "
    "WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE', 'CREATE FOREIGN TABLE', 'ALTER FOREIGN TABLE') "
    "EXECUTE FUNCTION stockade.ddl_guard()"
)

_COVER = r"""
-- The members of rel's inheritance tree, with their kind, whether they have a parent, and the
-- scope of their stockade_fence trigger (NULL: none).
CREATE OR REPLACE FUNCTION stockade.tree(rel regclass)
RETURNS TABLE (member regclass, kind "char", has_parent boolean, scope text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $tree$
    WITH RECURSIVE linked(id) AS (
        SELECT rel::oid
        UNION
        SELECT CASE WHEN i.inhrelid = l.id THEN i.inhparent ELSE i.inhrelid END
          FROM linked l JOIN pg_inherits i ON i.inhrelid = l.id OR i.inhparent = l.id
    )
    SELECT c.oid::regclass, c.relkind,
           EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid),
           (SELECT split_part(encode(t.tgargs, 'escape'), '\000', 1) FROM pg_trigger t
             WHERE t.tgrelid = c.oid AND t.tgname = 'stockade_fence'
               AND t.tgfoid = 'stockade.guard()'::regprocedure)
      FROM linked l JOIN pg_class c ON c.oid = l.id
     ORDER BY c.oid
$tree$;

-- Put the trigger on every member of rel's tree. With new_scope (protect): rel must be the
-- tree's only root, and every member gets new_scope. Without (the DDL guard, after a DDL
-- command on rel): if any member is protected, every member that is not gets its scope, and
-- a tree that cannot be covered is refused (the DDL command with it). Runs as the caller: it
-- creates triggers only where the caller may (the owner of a table, who alone can add a
-- partition or child to it). Returns the scope, or NULL when nothing in the tree is protected.
CREATE OR REPLACE FUNCTION stockade.cover(rel regclass, new_scope text) RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $cover$
DECLARE
    v_scope text := new_scope;
    v_member record;
BEGIN
    IF v_scope IS NULL THEN
        SELECT t.scope INTO v_scope FROM stockade.tree(rel) t WHERE t.scope IS NOT NULL LIMIT 1;
        IF v_scope IS NULL THEN
            RETURN NULL;
        END IF;
    END IF;
    FOR v_member IN SELECT * FROM stockade.tree(rel) LOOP
        IF v_member.kind NOT IN ('r', 'p') THEN
            RAISE EXCEPTION USING ERRCODE = '@PROTECT@',
                MESSAGE = format('stockade: %s is in the inheritance tree of %s, and it is not a table whose '
                                 'writes a trigger sees (a foreign table holds its rows on another server): '
                                 'the tree cannot be protected', v_member.member, rel);
        END IF;
        IF new_scope IS NOT NULL AND NOT v_member.has_parent AND v_member.member <> rel THEN
            RAISE EXCEPTION USING ERRCODE = '@PROTECT@',
                MESSAGE = format('stockade: %s is part of the inheritance tree of %s (writes through %s reach '
                                 'rows of that tree): protect the root of the tree, %s', rel, v_member.member,
                                 v_member.member, v_member.member);
        END IF;
        IF new_scope IS NULL AND NOT v_member.has_parent AND v_member.scope IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '@PROTECT@',
                MESSAGE = format('stockade: %s is not protected, and writes through it would reach rows of a '
                                 'table protected with scope %s: protect(%s) first', v_member.member, v_scope,
                                 v_member.member);
        END IF;
        IF new_scope IS NULL AND v_member.scope IS DISTINCT FROM v_scope AND v_member.scope IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = '@PROTECT@',
                MESSAGE = format('stockade: one inheritance tree would hold tables protected with scopes %s '
                                 'and %s (%s): protect its root again with one scope', v_scope,
                                 v_member.scope, v_member.member);
        END IF;
    END LOOP;
    FOR v_member IN SELECT * FROM stockade.tree(rel) LOOP
        IF new_scope IS NOT NULL AND v_member.scope IS NOT NULL THEN
            EXECUTE format('DROP TRIGGER stockade_fence ON %s', v_member.member);
        END IF;
        IF new_scope IS NOT NULL OR v_member.scope IS NULL THEN
            EXECUTE format('CREATE TRIGGER stockade_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s '
                           'FOR EACH STATEMENT EXECUTE FUNCTION stockade.guard(%L)', v_member.member, v_scope);
        END IF;
    END LOOP;
    RETURN v_scope;
END
$cover$;
REVOKE ALL ON FUNCTION stockade.cover(regclass, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION stockade.cover(regclass, text) TO PUBLIC;
"""

_DDL_GUARD = r"""
-- ddl_command_end of CREATE/ALTER [FOREIGN] TABLE: cover the trees the command touched. A new
-- partition, sub-partition or child of a protected table gets its trigger in the same
-- transaction as the command; a tree that cannot be covered fails the command.
CREATE OR REPLACE FUNCTION stockade.ddl_guard() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $ddl$
DECLARE
    v_rel oid;
BEGIN
    FOR v_rel IN SELECT DISTINCT d.objid FROM pg_event_trigger_ddl_commands() d
                   JOIN pg_class c ON c.oid = d.objid
                  WHERE d.classid = 'pg_class'::regclass AND c.relkind IN ('r', 'p', 'f') LOOP
        PERFORM stockade.cover(v_rel::regclass, NULL);
    END LOOP;
END
$ddl$;
"""


# -- operation ids (R3) ----------------------------------------------------------------------------

_FENCE_OP = r"""
CREATE OR REPLACE FUNCTION stockade.fence_op(token text, scope text, op_id text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $op$
DECLARE
    v_mark bigint;
    v_seq bigint;
    v_applied bigint;
    v_message text;
    v_detail text;
BEGIN
    IF op_id IS NULL OR length(op_id) NOT BETWEEN 1 AND @OP_BYTES@ OR op_id !~ '^[!-~]+$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'stockade.fence_op: op_id must be 1..@OP_BYTES@ '
                                                           'printable ASCII characters without spaces';
    END IF;
    -- The whole check first (MAC, R2, R1): only a holder of a real token for this scope learns
    -- whether an operation id was applied. A stale token is caught (a subtransaction), because
    -- R3 answers for an applied operation even when its token has since gone stale.
    BEGIN
        v_mark := stockade.fence(token, scope);
    EXCEPTION WHEN SQLSTATE '@REJECT@' THEN
        GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT, v_detail = PG_EXCEPTION_DETAIL;
        SELECT o.token_value INTO v_applied FROM stockade.operations o
         WHERE o.scope = fence_op.scope AND o.op_id = fence_op.op_id;
        IF v_applied IS NULL OR v_detail NOT LIKE 'reason=stale %' THEN
            RAISE EXCEPTION USING ERRCODE = '@REJECT@', MESSAGE = v_message, DETAIL = v_detail;
        END IF;
    END;
    IF v_applied IS NULL THEN
        -- Waits for a transaction that recorded the same id and is still open: if it commits,
        -- this one is the retry of an applied operation; if it rolls back, this one applies.
        INSERT INTO stockade.operations AS o (scope, op_id, token_value)
             VALUES (fence_op.scope, fence_op.op_id, split_part(token, '.', 3)::bigint)
        ON CONFLICT DO NOTHING RETURNING o.seq INTO v_seq;
        IF v_seq IS NULL THEN
            SELECT o.token_value INTO STRICT v_applied FROM stockade.operations o
             WHERE o.scope = fence_op.scope AND o.op_id = fence_op.op_id;
        END IF;
    END IF;
    IF v_applied IS NOT NULL THEN
        -- An error, not a result: the whole transaction (the caller's writes, a raised mark)
        -- rolls back even where the caller does not look at the answer.
        RAISE EXCEPTION USING ERRCODE = '@ALREADY@',
            MESSAGE = format('stockade: operation %s of scope %s was applied already', op_id, scope),
            DETAIL = format('token_value=%s', v_applied);
    END IF;
    -- The bound: keep the newest @OPS_MAX@ ids. SKIP LOCKED: a row another open transaction is
    -- pruning is left to a later prune, never waited for (no transaction waits on another scope's).
    DELETE FROM stockade.operations WHERE seq IN (
        SELECT o.seq FROM stockade.operations o WHERE o.seq <= v_seq - @OPS_MAX@ FOR UPDATE SKIP LOCKED);
    RETURN v_mark;
END
$op$;
REVOKE ALL ON FUNCTION stockade.fence_op(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION stockade.fence_op(text, text, text) TO PUBLIC;
"""


def fence_op_function(*, operation_ids_max: int = OPERATION_IDS_MAX) -> str:
    """The ``CREATE OR REPLACE`` of ``stockade.fence_op``: ``stockade.fence`` plus an operation id (R3).

    In order: the whole check (``stockade.fence``); a stale rejection of an
    operation already recorded becomes "applied already" (R3: even when the
    token has since gone stale); otherwise the id is recorded in
    ``stockade.operations`` in this transaction, and an id recorded by another
    committed transaction raises `ALREADY_APPLIED_SQLSTATE` (detail
    ``token_value=<n>``, the token that applied it), which rolls this one back.
    The table keeps the newest ``operation_ids_max`` ids.
    """
    return (_FENCE_OP.replace("@REJECT@", REJECT_SQLSTATE).replace("@ALREADY@", ALREADY_APPLIED_SQLSTATE)
            .replace("@OPS_MAX@", str(operation_ids_max)).replace("@OP_BYTES@", str(OP_ID_BYTES_MAX)))
