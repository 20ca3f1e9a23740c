"""A newer token waits a bounded time for a lower one (``install(supersede_after_ms=)``).

A raise waits for the EXCLUSIVE lock of its scope's view with ``lock_timeout``
set to the bound; when that runs out it ends (``pg_terminate_backend``, as the
installing role) every session that holds the view's lock for the same scope
with a lower token, and waits again. A holder is known by two shared advisory
locks each check takes, without waiting, before the view's: key
``(hashtext(scope), token >> 32)`` and ``(hashtext(scope || '/lo'), low 32 bits
of the token)``. Only sessions holding the view's lock are looked at, and only
the fence can lock the view, so a session of another role can at most make
itself look lower (and be ended), never a holder of a real token; a holder
whose identity is missing (another session holds one of its keys exclusively)
is never ended, and is waited for as before. The upper bound of a holder's
token (largest high part, largest low part) must be below the raising token.
Ending a session needs the installing role to be a superuser or a member of
``pg_signal_backend``, and never ends a superuser's session: without the right
a raise waits as long as the lower holder lasts (`install` warns). A session
ended while idle in its transaction (a paused writer) never commits; its
client's next statement or commit reads SQLSTATE 57P01.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = [
    "SUPERSEDED_SQLSTATE", "SUPERSEDE_SQL", "IDENTITY_SQL", "NO_SUPERSEDE", "SupersedeWarning",
    "warn_without_signal_right",
]

#: SQLSTATE a superseded transaction's client reads: its session was ended (admin_shutdown).
SUPERSEDED_SQLSTATE = "57P01"

#: The control (and ``supersede_after_ms=0`` in the private seam): a raise waits without bound.
NO_SUPERSEDE = r"""
CREATE OR REPLACE FUNCTION stockade_private.raise_lock(p_view int, p_scope text, p_value bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $r$
BEGIN
    EXECUTE format('LOCK TABLE stockade_private.scope_lock_%s IN EXCLUSIVE MODE', p_view);
    RETURN true;
END
$r$;
REVOKE ALL ON FUNCTION stockade_private.raise_lock(int, text, bigint) FROM PUBLIC;
"""

#: The holder's identity, a statement of ``stockade.fence`` (inline: a call of an SQL function costs more
#: than the two locks): shared advisory locks on its scope and token, taken without waiting. ``v_hash`` and
#: ``v_hash_lo`` are ``hashtext(scope)`` and ``hashtext(scope || '/lo')``, read in the check's first statement;
#: ``v_value << 32 >> 32`` is the low 32 bits of the token as a signed int (the shift wraps, then extends the sign).
IDENTITY_SQL = """v_held := pg_try_advisory_xact_lock_shared(v_hash, (v_value >> 32)::int)
        AND pg_try_advisory_xact_lock_shared(v_hash_lo, (v_value << 32 >> 32)::int);"""

#: ``stockade_private.raise_lock``: bounded waits for the EXCLUSIVE lock, ``@BOUND_MS@`` the bound.
SUPERSEDE_SQL = r"""
-- The EXCLUSIVE lock of a raise: bounded waits, ending the lower holders of the scope between them.
CREATE OR REPLACE FUNCTION stockade_private.raise_lock(p_view int, p_scope text, p_value bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $r$
DECLARE
    v_rel oid := format('stockade_private.scope_lock_%s', p_view)::regclass::oid;
    v_hi oid := (hashtext(p_scope)::bigint & 4294967295)::oid;
    v_lo oid := (hashtext(p_scope || '/lo')::bigint & 4294967295)::oid;
    v_saved text := current_setting('lock_timeout');
    v_holder record;
BEGIN
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '@BOUND_MS@', true);
            EXECUTE format('LOCK TABLE stockade_private.scope_lock_%s IN EXCLUSIVE MODE', p_view);
            PERFORM set_config('lock_timeout', v_saved, true);
            RETURN true;
        EXCEPTION WHEN lock_not_available THEN
            NULL;  -- the subtransaction's lock_timeout went with it
        END;
        FOR v_holder IN
            SELECT l.pid,
                   (SELECT max(a.objid::bigint) FROM pg_locks a WHERE a.pid = l.pid AND a.locktype = 'advisory'
                       AND a.objsubid = 2 AND a.classid = v_hi AND a.granted) AS hi,
                   (SELECT max(a.objid::bigint) FROM pg_locks a WHERE a.pid = l.pid AND a.locktype = 'advisory'
                       AND a.objsubid = 2 AND a.classid = v_lo AND a.granted) AS lo
              FROM pg_locks l
             WHERE l.locktype = 'relation' AND l.relation = v_rel AND l.granted AND l.pid <> pg_backend_pid()
               AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
        LOOP
            IF v_holder.hi IS NOT NULL AND v_holder.lo IS NOT NULL
               AND (v_holder.hi << 32) + v_holder.lo < p_value THEN
                BEGIN
                    PERFORM pg_terminate_backend(v_holder.pid);
                EXCEPTION WHEN insufficient_privilege THEN
                    NULL;  -- no right to end it: wait as long as it lasts (install warns)
                END;
            END IF;
        END LOOP;
    END LOOP;
END
$r$;
REVOKE ALL ON FUNCTION stockade_private.raise_lock(int, text, bigint) FROM PUBLIC;
"""


class SupersedeWarning(UserWarning):
    """The installing role may not end sessions: a paused lower holder stalls a newer token without bound."""


def warn_without_signal_right(conn: Any) -> None:
    """Warn (`SupersedeWarning`) when the connection's role may not end other sessions."""
    row = conn.execute("SELECT r.rolsuper OR pg_has_role(current_user, 'pg_signal_backend', 'MEMBER') "
                       "FROM pg_roles r WHERE r.rolname = current_user").fetchone()
    if not (row and row[0]):
        warnings.warn(SupersedeWarning(
            "stockade: the installing role is neither a superuser nor a member of pg_signal_backend, so a newer "
            "token cannot end the session of a paused lower one and waits as long as it lasts: "
            "GRANT pg_signal_backend TO <installing role> (docs/fence-postgres.md, 'A paused writer')"),
            stacklevel=4)
