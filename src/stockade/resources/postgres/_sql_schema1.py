"""Schema 1's ``stockade.fence``, kept verbatim as the control of the PostgreSQL fence's tests.

It reads the default floor through the transaction's snapshot (a REPEATABLE READ or
SERIALIZABLE transaction that read before a floor was raised is admitted below it) and
serialises with advisory locks that any role that may connect can take. Installed only
through the private seam ``_install(..., body="advisory")`` (`FENCE_BODIES`), so that the
tests of the isolation and outsider attack classes can show what they catch. Never the
default: `stockade.resources.postgres._sql` says why schema 2 replaced it.
"""

from __future__ import annotations

__all__ = ["FENCE_ADVISORY"]

#: The body, with the same placeholders as `stockade.resources.postgres._sql.fence_function` fills.
FENCE_ADVISORY = r"""
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
