"""Fenced transactions on the user's PostgreSQL, written once as async code; the sync fronts in _sync/
are generated from this file (scripts/unasync.py).

`stockade.resources.postgres` exports both (``fenced``, ``fenced_async``, ``fenced_sqlalchemy``,
``fenced_sqlalchemy_async``). What runs before and after the body is in
`stockade.resources.postgres._fenced`. A session ended under the transaction is probed here, on a fresh
connection, before the error is judged: `_translate` reads the probe's verdict.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from stockade.core.tokens import FencingToken
from stockade.resources.postgres import _probe
from stockade.resources.postgres._async.probe import probe_psycopg_async
from stockade.resources.postgres._errors import _translate, ended
from stockade.resources.postgres._fenced import (
    _EXECUTE,
    AsyncConnection,
    _begin_and_fence,
    _check_begun,
    _check_result,
    _fence_statement,
    _owns_transaction,
    _prepare,
    _resource,
    _sqlalchemy,
    _sqlalchemy_fence,
    psycopg,
)
from stockade.resources.postgres._probe import probe_sqlalchemy_async

__all__ = ["fenced_async", "fenced_sqlalchemy_async"]


async def _verdict(probe: _probe.AsyncProbe | None, token: FencingToken, scope: str) -> _probe.Probe | None:
    """Run ``probe`` now (did a newer token write to the scope?) and answer its verdict as a `_probe.Probe`."""
    if probe is None:
        return None
    superseded = await probe(token, scope)
    return lambda _token, _scope: superseded


async def _begin_and_check(conn: Any, query: str) -> None:
    """Send ``BEGIN`` and the check (``query``) in one simple query and read both answers: one round trip.

    Straight to ``conn.pgconn`` under the connection's lock, awaited by ``conn.wait``: what ``conn.execute``
    does, without a cursor, whose set-up (its adapters, the query's conversion, the result's row maker) was
    about 30 µs of the 50 µs more client CPU a fenced transaction cost than a plain one. `_check_begun` raises
    what ``conn.execute`` would."""
    async with conn.lock:
        conn.pgconn.send_query(query.encode())
        results = await conn.wait(_EXECUTE(conn.pgconn))
    _check_begun(results, conn)


async def _rollback_quietly(conn: Any) -> None:
    try:
        await conn.rollback()
    except psycopg.Error:
        pass  # the connection is gone: the server rolls back by itself


@asynccontextmanager
async def fenced_async(conn: AsyncConnection, token: FencingToken | str, scope: str | None = None, *,
                       keys: object = None, op_id: str | None = None) -> AsyncIterator[AsyncConnection]:
    """A transaction of ``conn`` admitted by ``token``: ``async with fenced_async(conn, token): ...``.

    Runs ``SELECT stockade.fence(token, scope)`` as the first statement of a
    transaction, then the body, then commits. On an idle autocommit connection
    it sends ``BEGIN`` and the check in one round trip and commits at the end;
    otherwise it uses ``conn.transaction()`` (a savepoint of the transaction
    already open). The scope's lock is held until the commit, so a higher
    token waits for this transaction to end (R6). A rejection or an exception
    in the body rolls the block back: nothing of it is applied, and the mark is
    not raised.

    With ``op_id``, the block is one operation (R3): the id is recorded in
    ``stockade.operations`` in the same transaction, and a transaction that
    comes with an id already committed raises `AlreadyApplied` before the
    block runs, applying nothing: the retry of a transaction whose outcome was
    unknown (`BackendUnavailable`, a writer killed around its commit) is safe.
    Ids are per scope; the newest `stockade.core.limits.OPERATION_IDS_MAX`
    are remembered.

    Args:
        conn: a psycopg 3 ``AsyncConnection`` to a database where `install` ran.
        token: the lease's token (a `FencingToken` or its encoded string).
        scope: the scope written (default: the token's own; another one is refused, R2).
        keys: the coordinator's keys, to refuse a forged token before any round trip (optional:
            the database checks the MAC anyway).
        op_id: the operation's id (1..200 printable ASCII characters, no spaces), or None.

    Raises:
        AlreadyApplied: ``op_id`` was applied by a committed transaction (even under a token
            that has gone stale since); nothing of this one was applied.
        StaleToken: the token is below the scope's mark (``.high_water``).
        TokenMismatch: another scope's or cluster's token, or a forged one.
        InvalidArgument: a malformed token or scope.
        BackendUnavailable: the connection failed (the commit's outcome is unknown).
    """
    fencing_token, scope = _prepare(token, scope, keys, op_id)
    if not _owns_transaction(conn):
        statement, parameters = _fence_statement(op_id)
        try:
            async with conn.transaction():
                await conn.execute(statement, parameters(fencing_token, scope))
                yield conn
        except psycopg.Error as error:  # the check's, the body's (a protected table's trigger) or the commit's
            probe = await _verdict(probe_psycopg_async(conn) if ended(error) else None, fencing_token, scope)
            _check_result(error, fencing_token, scope, _resource(conn.info), op_id, probe)
        return
    try:
        # Never prepared (two statements, the token in the text), nor sent through a cursor.
        await _begin_and_check(conn, _begin_and_fence(fencing_token, scope, op_id, conn))
        yield conn
    except BaseException as error:
        # The probe is made before the rollback closes ``conn`` (it reads the connection's parameters).
        probe = await _verdict(probe_psycopg_async(conn) if ended(error) else None, fencing_token, scope)
        await _rollback_quietly(conn)
        if isinstance(error, psycopg.Error):
            _check_result(error, fencing_token, scope, _resource(conn.info), op_id, probe)
        raise
    try:
        await conn.commit()
    except psycopg.Error as error:
        probe = await _verdict(probe_psycopg_async(conn) if ended(error) else None, fencing_token, scope)
        _check_result(error, fencing_token, scope, _resource(conn.info), op_id, probe)


@asynccontextmanager
async def fenced_sqlalchemy_async(bind: Any, token: FencingToken | str, scope: str | None = None, *,
                                  keys: object = None, op_id: str | None = None) -> AsyncIterator[Any]:
    """`fenced_async` for an SQLAlchemy ``AsyncSession`` or ``AsyncConnection`` on PostgreSQL.

    Begins a transaction (a SAVEPOINT if one is already open), runs the fence
    statement in it, yields ``bind``, and commits (releases) at the end.
    ``op_id`` as in `fenced_async`. The async front needs the ``postgresql+psycopg``
    driver (psycopg's own ``AsyncConnection`` runs its probe); the sync one takes
    any DBAPI driver.
    """
    sa = _sqlalchemy()
    fencing_token, scope = _prepare(token, scope, keys, op_id)
    statement, parameters = _sqlalchemy_fence(sa, fencing_token, scope, op_id)
    try:
        async with bind.begin_nested() if bind.in_transaction() else bind.begin():
            await bind.execute(statement, parameters)
            yield bind
    except sa.exc.DBAPIError as error:
        probe = await _verdict(probe_sqlalchemy_async(bind) if ended(error.orig) else None, fencing_token, scope)
        _translate(error.orig, fencing_token, scope, "postgres", op_id, probe)
        raise
