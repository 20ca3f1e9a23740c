"""The SQL text of the PostgreSQL fence adapter (`stockade.resources.postgres`).

Kept apart from the Python so the whole server side can be read in one place:
the tables (schema ``stockade``, versioned by `MIGRATIONS`), the check
``stockade.fence(token, scope)`` and the trigger function of protected tables.

``stockade.fence`` is the one statement a fenced transaction runs. In order:

    0. parse the token (stk2 signed, stk1 unsigned)        -> SQLSTATE 22023 if malformed
    1. verify its MAC with the keys in stockade.keys       -> reject "forged" (nothing else looked at)
    2. cluster, then scope                                 -> reject "wrong-cluster" / "wrong-scope"
    3. lock the scope until the transaction ends (shared
       when the token equals the mark, exclusive when it
       would raise it), then read the mark again
    4. token < max(mark, default floor)                    -> reject "stale"
    5. raise the mark, remember the token in the
       transaction-local setting stockade.tokens           -> return the mark

A rejection is ``RAISE`` with SQLSTATE `REJECT_SQLSTATE` and a detail
``reason=<r> high_water=<n> cluster=<c> detail=<d>`` that the Python side
parses back into `stockade.core.fence.Reject`.

The scope's lock is a transaction-scoped advisory lock on
``(SCOPE_LOCK_CLASS, hashtext(scope))``. Holders of the current token share it
(no false waits, S19); a higher token takes it exclusively, so it waits until
every open transaction admitted under the current mark has ended (R6), and a
transaction that arrives after it reads the raised mark and is refused. An
advisory lock writes nothing, where a row lock (``FOR SHARE``) writes a WAL
record and dirties a page in every transaction: measured, the row lock made a
fenced transaction about 1.5x as slow as a plain one, the advisory lock
adds no write at all for an equal token. Two scopes whose hashes collide
only share a lock (more waiting, never a wrong answer). Under REPEATABLE READ
or SERIALIZABLE the row is locked as well, so that a mark raised while the
check waited is a serialization failure (SQLSTATE 40001), not a stale admission.

The floor (`FLOOR_LOCK_KEY`) is an advisory lock too: each check holds it
shared, `raise_high_waters` takes it exclusively, so a floor is never raised
between a check and its commit.

``stockade.fence_op(token, scope, op_id)`` is the check of a transaction that
carries an operation id (R3): `fence_op_function` says what it adds.
``stockade.cover(relation, scope)`` and the event trigger function
``stockade.ddl_guard()`` keep protected tables whole: `cover_functions` says how.
"""

from __future__ import annotations

from stockade.core.limits import OP_ID_BYTES_MAX, OPERATION_IDS_MAX

__all__ = [
    "SCHEMA_VERSION", "MIGRATIONS", "REJECT_SQLSTATE", "NO_TOKEN_SQLSTATE", "INSTALL_LOCK_KEY", "FLOOR_LOCK_KEY",
    "SCOPE_LOCK_CLASS", "ALREADY_APPLIED_SQLSTATE", "PROTECT_SQLSTATE", "DDL_GUARD_NAME", "DDL_GUARD_SQL",
    "STALE_WHEN", "fence_function", "guard_function", "fence_op_function",
]

#: The schema version `install` migrates to.
SCHEMA_VERSION = 2
#: SQLSTATE of a fence rejection (class "SK": stockade's own).
REJECT_SQLSTATE = "SKF01"
#: SQLSTATE of a write to a protected table in a transaction that passed no fence for its scope.
NO_TOKEN_SQLSTATE = "SKF02"
#: SQLSTATE of a protected tree that cannot be covered (`protect`, or DDL refused by the DDL guard).
PROTECT_SQLSTATE = "SKF03"
#: SQLSTATE of ``stockade.fence_op`` for an operation id already applied (detail ``token_value=<n>``).
ALREADY_APPLIED_SQLSTATE = "SKF04"
#: Advisory lock keys (bigint): one serialises installs, one orders checks against floors.
INSTALL_LOCK_KEY = 0x73746B6400000001
FLOOR_LOCK_KEY = 0x73746B6400000002
#: The first key of the two-key advisory locks of scopes (the second is ``hashtext(scope)``).
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
#: ``v_value`` (the token's) and ``v_mark`` (the effective mark). `decide`'s rule is "<".
STALE_WHEN = {
    "decide": "v_value < v_mark",
    "strict-greater": "v_value <= v_mark",
    "fencing-off": "false",
}

_FENCE = r"""
CREATE OR REPLACE FUNCTION stockade.fence(token text, scope text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fence$
DECLARE
    v_parts text[];
    v_cluster text;
    v_value bigint;
    v_kid text := '';
    v_mac text := '';
    v_scope text;
    v_cluster_id text;
    v_verify boolean;
    v_floor bigint;
    v_key_found boolean;
    v_secret bytea;
    v_until bigint;
    v_forged text;
    v_void text;
    v_own bigint;
    v_mark bigint;
    v_tokens jsonb;
BEGIN
    -- Parsed with split_part and plain character classes: bounded repeats ({16}) make
    -- PostgreSQL's regex engine cost ~150 us a call, more than the rest of the check.
    IF token IS NULL OR scope IS NULL OR length(scope) > 200 OR scope !~ '^[A-Za-z0-9._:-]+$'
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
       OR length(v_scope) NOT BETWEEN 1 AND 200 OR v_scope !~ '^[A-Za-z0-9._:-]+$' OR v_scope IN ('.', '..') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'stockade.fence: malformed token';
    END IF;
    v_cluster := v_parts[1];
    v_value := v_parts[2]::bigint;
    -- Locks are taken by assignments, not PERFORM: a simple expression needs no statement of its
    -- own, and each SQL statement here costs a snapshot and an executor start in every transaction.
    -- Held (shared) until the transaction ends: the default floor cannot move under this check.
    v_void := pg_advisory_xact_lock_shared(@FLOOR_KEY@)::text;
    -- One statement reads the settings, the token's key and the scope's mark.
    SELECT s.cluster_id, s.verify_macs, s.default_floor, k.kid IS NOT NULL, k.secret, k.verify_until_s, h.high_water
      INTO STRICT v_cluster_id, v_verify, v_floor, v_key_found, v_secret, v_until, v_own
      FROM stockade.settings s
      LEFT JOIN stockade.keys k ON k.kid = v_kid
      LEFT JOIN stockade.high_water h ON h.scope = fence.scope
     WHERE s.id = 1;

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

    -- 3. the scope's lock, held until the transaction ends: shared by holders of the current
    --    token, exclusive to raise the mark. An advisory lock writes nothing (no WAL, no dirty
    --    page); the mark is read again once it is held, with a fresh snapshot (under READ
    --    COMMITTED each statement here takes one).
    v_mark := greatest(coalesce(v_own, 0), v_floor);
    IF v_value > v_mark THEN
        v_void := pg_advisory_xact_lock(@SCOPE_CLASS@, hashtext(fence.scope))::text;
    ELSE
        v_void := pg_advisory_xact_lock_shared(@SCOPE_CLASS@, hashtext(fence.scope))::text;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed' THEN
        SELECT h.high_water INTO v_own FROM stockade.high_water h WHERE h.scope = fence.scope;
    ELSE
        -- A repeatable-read snapshot would not see a mark raised while we waited: lock the
        -- row too, so that such a raise is a serialization failure, never a stale admission.
        INSERT INTO stockade.high_water AS h (scope, high_water) VALUES (fence.scope, 0) ON CONFLICT DO NOTHING;
        SELECT h.high_water INTO STRICT v_own FROM stockade.high_water h WHERE h.scope = fence.scope FOR SHARE;
    END IF;
    v_own := coalesce(v_own, 0);
    v_mark := greatest(v_own, v_floor);

    -- 4. R1
    IF @STALE_WHEN@ THEN
        RAISE EXCEPTION USING ERRCODE = '@REJECT@', MESSAGE = 'stockade.fence: token refused (stale)',
            DETAIL = format('reason=stale high_water=%s cluster=%s detail=', v_mark, v_cluster_id);
    END IF;

    -- 5. raise the mark (only when it moves: an equal token writes nothing)
    IF v_value > v_own THEN
        INSERT INTO stockade.high_water AS h (scope, high_water) VALUES (fence.scope, v_value)
            ON CONFLICT ON CONSTRAINT high_water_pkey
            DO UPDATE SET high_water = greatest(h.high_water, excluded.high_water);
    END IF;
    v_tokens := coalesce(nullif(current_setting('stockade.tokens', true), ''), '{}')::jsonb;
    IF v_tokens ->> scope IS DISTINCT FROM token THEN
        v_void := set_config('stockade.tokens', (v_tokens || jsonb_build_object(scope, token))::text, true);
    END IF;
    RETURN greatest(v_value, v_mark);
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
    v_token text;
BEGIN
    -- The setting is only where to find the token: anyone can SET LOCAL it, so the
    -- token is checked again in full (MAC, scope, mark), under the same scope lock.
    BEGIN
        v_token := nullif(current_setting('stockade.tokens', true), '')::jsonb ->> v_scope;
    EXCEPTION WHEN others THEN
        v_token := NULL;
    END;
    IF v_token IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '@NO_TOKEN@',
            MESSAGE = format('stockade: %s on %s refused: the table is fenced (scope %s) and this transaction '
                             'passed no stockade.fence(token, scope) for it', TG_OP, TG_TABLE_NAME, v_scope);
    END IF;
    v_token := stockade.fence(v_token, v_scope)::text;  -- an assignment: no statement of its own
    RETURN NULL;
END
$guard$;
"""


def _pgcrypto_ident(schema: str) -> str:
    return '"' + schema.replace('"', '""') + '"'


def fence_function(*, pgcrypto_schema: str, stale_when: str) -> str:
    """The ``CREATE OR REPLACE`` of ``stockade.fence`` with its comparison (`STALE_WHEN`)."""
    return (_FENCE.replace("@PGCRYPTO@", _pgcrypto_ident(pgcrypto_schema))
            .replace("@REJECT@", REJECT_SQLSTATE).replace("@FLOOR_KEY@", str(FLOOR_LOCK_KEY))
            .replace("@SCOPE_CLASS@", str(SCOPE_LOCK_CLASS))
            .replace("@STALE_WHEN@", stale_when))


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
