"""The probe over psycopg 3, written once as async code; the sync one in _sync/ is generated from this file.

`stockade.resources.postgres._probe` says what a probe asks a fresh session, and why.
"""

from __future__ import annotations

from typing import Any

from stockade.core.tokens import FencingToken
from stockade.resources.postgres import _probe

__all__ = ["probe_psycopg_async"]


def probe_psycopg_async(conn: Any) -> _probe.AsyncProbe | None:
    """A probe over a fresh psycopg 3 connection with ``conn``'s parameters (None: they cannot be read)."""
    try:
        dsn, password = conn.info.dsn, conn.info.password
    except Exception:  # noqa: BLE001 - a connection already closed: no probe, the error stays an outage
        return None

    async def probe(token: FencingToken, scope: str) -> bool:
        import psycopg

        try:
            async with await psycopg.AsyncConnection.connect(
                dsn, password=password, connect_timeout=_probe.PROBE_CONNECT_S
            ) as fresh:
                try:
                    await fresh.execute(_probe._probe_sql(token, scope))
                finally:
                    await fresh.rollback()
        except psycopg.Error as error:
            return _probe._stale(error)
        return False

    return probe
