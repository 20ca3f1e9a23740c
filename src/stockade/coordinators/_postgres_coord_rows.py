"""The PostgreSQL coordinator's tables: the versioned schema, one scope's record read and written back.

Used by `stockade.coordinators.postgres.PostgresRecords` inside its
transactions; every function takes the open psycopg connection and never
commits. Every table is prefixed ``stockade_coord_`` so that the coordinator
can share a database with the application (and with the fenced store of
`stockade.resources.postgres`, whose tables have their own prefix).

Migrations are a list: version N is the first N entries applied in order,
each idempotent, run under one transaction-scoped advisory lock so that
processes opening a new database at the same moment do not race
(``CREATE TABLE IF NOT EXISTS`` alone is not safe against a concurrent twin).
"""

from __future__ import annotations

from typing import Any

from stockade.core.errors import invariant
from stockade.core.leases import Lease, ScopeRecord, Waiter
from stockade.core.tokens import FencingToken

__all__ = [
    "MIGRATIONS", "SCHEMA_VERSION", "MIGRATION_LOCK", "SCOPE_LOCK_CLASS", "get_meta", "set_meta",
    "forgotten_floor", "load_record", "forget_record", "store_record",
]

#: Advisory lock keys: one for the migration, one class for per-scope locks (two-int form).
MIGRATION_LOCK = 0x5374_6B01
SCOPE_LOCK_CLASS = 0x5374_6B02

MIGRATIONS: tuple[str, ...] = (
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


def load_record(conn: Any, cluster_id: str, scope: str) -> ScopeRecord:
    """One scope's record as the tables hold it (a never-used scope: an empty record)."""
    row = conn.execute(  # one round trip: the scope, its lease and its queue
        "SELECT s.last_token, s.delay_until_ns, l.lease_id, l.holder, l.token, l.ttl_ms, l.granted_ns, l.expires_ns, "
        "(SELECT json_agg(json_build_array(w.lease_id, w.holder, w.deadline_ns::text, w.stale_ns::text) "
        "ORDER BY w.seq) FROM stockade_coord_waiters w WHERE w.scope = s.scope) "
        "FROM stockade_coord_scopes s LEFT JOIN stockade_coord_leases l ON l.scope = s.scope WHERE s.scope = %s",
        (scope,),
    ).fetchone()
    if row is None:
        return ScopeRecord(scope)
    last_token, delay_until_ns, lease_id = row[0], row[1], row[2]
    lease = None
    if lease_id is not None:
        holder, token, ttl_ms, granted_ns, expires_ns = row[3:8]
        invariant(token <= last_token, f"lease token {token} above last_token {last_token} in {scope!r}")
        lease = Lease(lease_id, holder, FencingToken(cluster_id, scope, token), ttl_ms, granted_ns, expires_ns)
    # Times travel as text: JSON numbers would pass through floats on some paths.
    waiters = tuple(Waiter(w[0], w[1], int(w[2]), int(w[3])) for w in row[8] or ())
    return ScopeRecord(scope, last_token=last_token, lease=lease, delay_until_ns=delay_until_ns, waiters=waiters)


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


def store_record(conn: Any, old: ScopeRecord, new: ScopeRecord | None) -> bool:
    """Write back the difference between two records of one scope (``new`` None: forget it).

    Returns:
        Whether a waiter may now be served (the lease or the queue changed):
        the caller wakes the scope's waiters when the unit commits.
    """
    if new is None:
        forget_record(conn, old)
        return True
    if new == old:
        return False
    invariant(new.last_token >= old.last_token, f"last_token went back in {new.scope!r}")
    scope = new.scope
    if (new.last_token, new.delay_until_ns) != (old.last_token, old.delay_until_ns) or old.last_token == 0:
        # Compare-and-set on last_token: the unit holds the scope's lock, so a
        # mismatch means someone wrote the tables without it, and a token could
        # repeat. Refuse rather than overwrite (C1).
        updated = conn.execute(
            "UPDATE stockade_coord_scopes SET last_token = %s, delay_until_ns = %s "
            "WHERE scope = %s AND last_token = %s",
            (new.last_token, new.delay_until_ns, scope, old.last_token),
        ).rowcount
        if updated == 0:
            exists = conn.execute("SELECT 1 FROM stockade_coord_scopes WHERE scope = %s", (scope,)).fetchone()
            invariant(exists is None, f"last_token of {scope!r} changed underneath this coordinator")
            conn.execute(
                "INSERT INTO stockade_coord_scopes (scope, last_token, delay_until_ns) VALUES (%s, %s, %s)",
                (scope, new.last_token, new.delay_until_ns),
            )
    if new.lease != old.lease:
        if old.lease is not None:
            conn.execute("DELETE FROM stockade_coord_leases WHERE scope = %s", (scope,))
        if new.lease is not None:
            lease = new.lease
            conn.execute(
                "INSERT INTO stockade_coord_leases (scope, lease_id, holder, token, ttl_ms, granted_ns, expires_ns) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (scope, lease.lease_id, lease.holder, lease.token.value, lease.ttl_ms, lease.granted_ns,
                 lease.expires_ns),
            )
    if new.waiters != old.waiters:
        old_by_id = {w.lease_id: w for w in old.waiters}
        new_ids = {w.lease_id for w in new.waiters}
        for w in old.waiters:
            if w.lease_id not in new_ids:
                conn.execute("DELETE FROM stockade_coord_waiters WHERE lease_id = %s", (w.lease_id,))
        for w in new.waiters:
            before = old_by_id.get(w.lease_id)
            if before is None:
                conn.execute(
                    "INSERT INTO stockade_coord_waiters (scope, seq, lease_id, holder, deadline_ns, stale_ns) "
                    "VALUES (%s, (SELECT COALESCE(MAX(seq), 0) + 1 FROM stockade_coord_waiters WHERE scope = %s), "
                    "%s, %s, %s, %s)",
                    (scope, scope, w.lease_id, w.holder, w.deadline_ns, w.stale_ns),
                )
            elif before != w:
                conn.execute("UPDATE stockade_coord_waiters SET stale_ns = %s WHERE lease_id = %s",
                             (w.stale_ns, w.lease_id))
    old_head = old.waiters[0].lease_id if old.waiters else None
    new_head = new.waiters[0].lease_id if new.waiters else None
    # Only a scope with waiters needs a NOTIFY (a waiter is in the table before it sleeps, and
    # the scope's lock orders its enqueue and this change). Leaving it out elsewhere matters:
    # a transaction that notified commits under a database-wide lock, one at a time.
    freed = old.lease is not None and (new.lease is None or new.lease.lease_id != old.lease.lease_id)
    return bool(new.waiters) and (freed or (old_head is not None and old_head != new_head))
