"""Whether a fenced transaction whose session ended was superseded, or lost to an outage (a fresh session asks).

A session ended under a fenced transaction reads SQLSTATE 57P01 (admin_shutdown)
whether a newer token's check ended it (`_postgres_supersede`) or the server
is shutting down (``pg_ctl stop -m fast``, a restart): PostgreSQL sends the same
SQLSTATE and the same message for both. psycopg2 often reads neither, only a
closed connection. So the edge asks the database on a fresh session, after the
fact, with the transaction's own token: ``stockade.fence(token, scope)`` in a
transaction that is rolled back whatever happens.

- Refused as stale: a newer token has committed to the scope. The check takes
  the scope's lock, so it waits for the newer holder that ended the session
  (it holds that lock until it ends) and sees its commit: `Superseded`.
- Admitted: no newer token wrote; the session was ended by something else (a
  shutdown, a restart, an administrator) or by a newer holder that then rolled
  back: `BackendUnavailable`.
- The server does not answer (it is down), or the check does not end within
  `PROBE_MS`: `BackendUnavailable`.

Nothing of the probe's transaction is kept. It costs a connection, only on this
error path. A holder of a lower token that holds the scope meanwhile is
superseded by the probe as it would be by the resumed commit.

The probe over psycopg 3 is written once, async (``_async/probe.py``; its sync twin generated). The two
over SQLAlchemy stay here, a pair written by hand because they are two drivers, not two spellings of
one: the sync one runs on a raw DBAPI connection of any driver (psycopg2 too), the async one on psycopg's
own ``AsyncConnection`` under SQLAlchemy's asyncio engine.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from stockade.core.limits import SCOPE_CHARS
from stockade.core.tokens import FencingToken
from stockade.resources.postgres._sql import REJECT_SQLSTATE

__all__ = ["PROBE_MS", "Probe", "AsyncProbe", "probe_sqlalchemy", "probe_sqlalchemy_async"]

#: How long the probe's check may take (it waits for the newer holder's transaction to end).
PROBE_MS = 10_000
#: How long the probe may take to connect.
PROBE_CONNECT_S = 5

Probe = Callable[[FencingToken, str], bool]
AsyncProbe = Callable[[FencingToken, str], Awaitable[bool]]

_INLINE_SAFE = re.compile(f"[{SCOPE_CHARS}]+")  # a token's characters are a scope's


def _probe_sql(token: FencingToken, scope: str) -> str:
    """The probe's statements, inlined (a validated token and scope hold only ``[A-Za-z0-9._:-]``, checked here)."""
    encoded = token.encode()
    if not (_INLINE_SAFE.fullmatch(encoded) and _INLINE_SAFE.fullmatch(scope)):
        return "SELECT 1"  # never reached: `_prepare` validated both
    return f"SET LOCAL statement_timeout = {PROBE_MS}; SELECT stockade.fence('{encoded}', '{scope}')"


def _stale(error: BaseException) -> bool:
    """Whether the probe's check was refused as stale (a newer token committed): the fence's SQLSTATE
    (psycopg's ``sqlstate``, psycopg2's ``pgcode``) and the reason in its detail."""
    sqlstate = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    diag = getattr(error, "diag", None)
    detail = getattr(diag, "message_detail", None) or ""
    return sqlstate == REJECT_SQLSTATE and detail.startswith("reason=stale ")


def probe_sqlalchemy(bind: Any) -> Probe:
    """A probe over a new DBAPI connection of ``bind``'s engine (a ``Session`` or ``Connection``; any driver)."""

    def probe(token: FencingToken, scope: str) -> bool:
        try:
            target = bind.get_bind() if hasattr(bind, "get_bind") else bind  # a Session's engine, or a Connection
            raw = target.engine.raw_connection()
        except Exception:  # noqa: BLE001 - no new connection: an outage
            return False
        try:
            cursor = raw.cursor()
            try:
                cursor.execute(_probe_sql(token, scope))
            except Exception as error:  # noqa: BLE001 - psycopg's or psycopg2's error: judged by its SQLSTATE
                return _stale(error)
            return False
        finally:
            try:
                raw.rollback()
                raw.close()
            except Exception:  # noqa: BLE001 - the probe's connection is dropped either way
                pass

    return probe


def probe_sqlalchemy_async(bind: Any) -> AsyncProbe:
    """A probe over a new connection of an ``AsyncSession``'s or ``AsyncConnection``'s engine
    (``postgresql+psycopg``: the driver's own ``AsyncConnection`` runs it)."""

    async def probe(token: FencingToken, scope: str) -> bool:
        import psycopg

        try:
            from sqlalchemy.ext.asyncio import AsyncConnection

            engine = bind.engine if isinstance(bind, AsyncConnection) else bind.bind
            async with engine.connect() as fresh:
                driver: Any = (await fresh.get_raw_connection()).driver_connection
                try:
                    await driver.execute(_probe_sql(token, scope))
                except psycopg.Error as error:
                    return _stale(error)
                finally:
                    await fresh.rollback()
        except Exception:  # noqa: BLE001 - no new connection, or another driver: an outage
            return False
        return False

    return probe
