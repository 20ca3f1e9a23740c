"""The edge of the PostgreSQL fence (`stockade.resources.postgres`): driver errors and the SQL function's
rejections as stockade's typed errors."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from stockade.core.errors import AlreadyApplied, BackendUnavailable, InvalidArgument, Superseded
from stockade.core.fence import Reject
from stockade.core.tokens import FencingToken
from stockade.resources._observe import reject
from stockade.resources.postgres._probe import Probe
from stockade.resources.postgres._sql import ALREADY_APPLIED_SQLSTATE, REJECT_SQLSTATE
from stockade.resources.postgres._supersede import SUPERSEDED_SQLSTATE
from stockade.transport.postgres import error_text, no_codec

__all__ = ["ended"]

_DETAIL_RE = re.compile(
    r"reason=(stale|wrong-scope|wrong-cluster|forged) high_water=(\d+) cluster=([0-9a-f]{16}) detail=([a-z-]*)")
_REASONS: dict[str, Any] = {"stale": "stale", "wrong-scope": "wrong-scope", "wrong-cluster": "wrong-cluster",
                            "forged": "forged"}


# -- the edge: errors of the driver, rejections of the SQL function --------------------------------


def _sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a driver error: psycopg 3 names it ``sqlstate``, psycopg2 (under `fenced_sqlalchemy`
    with ``postgresql+psycopg2``) ``pgcode``; None for an error without one."""
    return getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)


def _rejection(error: BaseException) -> Reject | None:
    """The `Reject` a ``stockade.fence`` error stands for, or None for any other error."""
    if _sqlstate(error) != REJECT_SQLSTATE:
        return None
    match = _DETAIL_RE.fullmatch(error.diag.message_detail or "")  # type: ignore[attr-defined]
    if match is None:
        return None
    return Reject(_REASONS[match[1]], int(match[2]), match[4])


def _translate(error: BaseException, token: FencingToken, scope: str, resource: str, op_id: str | None = None,
               probe: Probe | None = None) -> None:
    """Raise the typed error for a driver error (`reject` for a fence rejection); return if it is the user's.

    ``probe`` (`_postgres_probe`) says, for a session that ended under the transaction (`ended`), whether a
    newer token wrote to the scope: `Superseded` if so, `BackendUnavailable` if not.
    """
    if op_id is not None and _sqlstate(error) == ALREADY_APPLIED_SQLSTATE:
        detail = error.diag.message_detail or ""  # type: ignore[attr-defined]
        raise AlreadyApplied(scope, op_id, int(detail.removeprefix("token_value="))) from None
    decision = _rejection(error)
    if decision is not None:
        match = _DETAIL_RE.fullmatch(error.diag.message_detail)  # type: ignore[attr-defined]
        cluster = match[3] if match else token.cluster
        reject(decision, resource=resource, cluster=cluster, token=token, scope=scope, key=None)
    if _sqlstate(error) == "22023":
        raise InvalidArgument("token", str(error).splitlines()[0]) from error
    if ended(error):
        # The session was ended inside the fenced transaction, before its commit completed: nothing
        # was applied. A newer token's check ends one (_postgres_supersede); so does a server shutdown,
        # with the same SQLSTATE: a fresh session tells them apart (_postgres_probe). A caller without a
        # probe reads 57P01 as supersession.
        if probe is None and _sqlstate(error) == SUPERSEDED_SQLSTATE or probe is not None and probe(token, scope):
            raise Superseded(token, error_text(error)) from error
        raise BackendUnavailable(f"{resource}: {error_text(error)} (not superseded: no newer token wrote to "
                                 f"{scope!r}; the session was ended by the server, an administrator or the "
                                 "network)") from error
    if _lost(error):
        raise BackendUnavailable(f"{resource}: {error_text(error)}") from error


def ended(error: BaseException) -> bool:
    """The session ended under the transaction: SQLSTATE 57P01 (a newer token's check, or a shutdown), or
    psycopg2's closed connection, which often carries no SQLSTATE at all."""
    sqlstate = _sqlstate(error)
    return sqlstate == SUPERSEDED_SQLSTATE or (sqlstate is None and _psycopg2(error) and _lost(error))


def _psycopg2(error: BaseException) -> bool:
    return type(error).__module__.partition(".")[0] == "psycopg2"


#: The server ended the session under an open transaction: idle in it too long (25P03, a writer
#: paused inside its transaction), or the transaction ran too long (25P04). psycopg files both
#: under class 25, not as connection failures.
_SESSION_ENDED = frozenset({"25P03", "25P04"})


def _lost(error: BaseException) -> bool:
    """A failure of the connection or server (outcome unknown), not a serialization failure or a deadlock
    (class 40: rolled back, for the caller to retry as PostgreSQL users do)."""
    sqlstate = _sqlstate(error) or ""
    psycopg2 = _psycopg2(error)
    if (isinstance(error, psycopg.Error) or psycopg2) and sqlstate in _SESSION_ENDED:
        return True
    connection_error = isinstance(error, psycopg.OperationalError | psycopg.InterfaceError) or (
        psycopg2 and type(error).__name__ in _PSYCOPG2_LOST)
    return connection_error and not sqlstate.startswith("40")


#: psycopg2's connection failures, by class name (psycopg2 is not a dependency: it is never imported here).
_PSYCOPG2_LOST = frozenset({"OperationalError", "InterfaceError"})


@contextmanager
def _edge() -> Iterator[None]:
    """Driver failures as `BackendUnavailable` (the outcome unknown), for the non-fenced operations."""
    try:
        yield
    except psycopg.Error as error:
        if _lost(error):
            raise BackendUnavailable(f"postgres: {error_text(error)}") from error
        refused = no_codec(error)  # the user's connection is in an encoding Python cannot decode
        if refused is not None:
            raise refused from error
        raise
