"""A database as stockade of schema version 8 left it: the tables, leases held, tokens issued, history.

Schema version 8 is the last before the lease log (`stockade.coordinators.postgres._schema8`
holds its SQL exactly as it installed it). `install_schema_8` creates its tables with the
current code's opener held at version 8; `cycle_8` is a lock cycle as a process of version 8
makes it: one call of each of its server-side functions (the common case of its client).
"""

from __future__ import annotations

import uuid

import psycopg

import stockade
from stockade.coordinators import postgres as pg_module
from stockade.coordinators.postgres._schema8 import MIGRATIONS_8


def install_schema_8(url: str, monkeypatch) -> None:
    """Create the coordinator's tables of schema version 8 in ``url``'s database (then undo the patch)."""
    monkeypatch.setattr(pg_module, "MIGRATIONS", MIGRATIONS_8)
    monkeypatch.setattr(pg_module, "SCHEMA_VERSION", len(MIGRATIONS_8))
    stockade.connect(url).close()
    monkeypatch.undo()


def grant_8(conn: psycopg.Connection, scope: str, *, ttl_ms: int = 60_000) -> tuple[str, int]:
    """A grant by schema 8's function: (lease id, token)."""
    lease_id = uuid.uuid4().hex
    row = conn.execute("SELECT token FROM stockade_coord_grant(%s, %s, %s, %s, 100000)",
                       (scope, lease_id, "holder-8", ttl_ms)).fetchone()
    assert row is not None, f"schema 8 did not grant {scope}"
    return lease_id, int(row[0])


def release_8(conn: psycopg.Connection, lease_id: str) -> None:
    """A release by schema 8's function."""
    assert conn.execute("SELECT token FROM stockade_coord_keep(%s, true)", (lease_id,)).fetchone() is not None


def cycle_8(conn: psycopg.Connection, scope: str) -> int:
    """One lock cycle as version 8's client makes it (grant, release); its token."""
    lease_id, token = grant_8(conn, scope)
    release_8(conn, lease_id)
    return token
