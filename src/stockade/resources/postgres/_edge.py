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
from stockade.resources.postgres._sql import ALREADY_APPLIED_SQLSTATE, REJECT_SQLSTATE
from stockade.resources.postgres._supersede import SUPERSEDED_SQLSTATE
from stockade.transport.postgres import error_text, no_codec

__all__: list[str] = []

_DETAIL_RE = re.compile(
    r"reason=(stale|wrong-scope|wrong-cluster|forged) high_water=(\d+) cluster=([0-9a-f]{16}) detail=([a-z-]*)")
_REASONS: dict[str, Any] = {"stale": "stale", "wrong-scope": "wrong-scope", "wrong-cluster": "wrong-cluster",
                            "forged": "forged"}


# -- the edge: errors of the driver, rejections of the SQL function --------------------------------


def _rejection(error: BaseException) -> Reject | None:
    """The `Reject` a ``stockade.fence`` error stands for, or None for any other error."""
    if getattr(error, "sqlstate", None) != REJECT_SQLSTATE:
        return None
    match = _DETAIL_RE.fullmatch(error.diag.message_detail or "")  # type: ignore[attr-defined]
    if match is None:
        return None
    return Reject(_REASONS[match[1]], int(match[2]), match[4])


def _translate(error: BaseException, token: FencingToken, scope: str, resource: str, op_id: str | None = None
               ) -> None:
    """Raise the typed error for a driver error (`reject` for a fence rejection); return if it is the user's."""
    if op_id is not None and getattr(error, "sqlstate", None) == ALREADY_APPLIED_SQLSTATE:
        detail = error.diag.message_detail or ""  # type: ignore[attr-defined]
        raise AlreadyApplied(scope, op_id, int(detail.removeprefix("token_value="))) from None
    decision = _rejection(error)
    if decision is not None:
        match = _DETAIL_RE.fullmatch(error.diag.message_detail)  # type: ignore[attr-defined]
        cluster = match[3] if match else token.cluster
        reject(decision, resource=resource, cluster=cluster, token=token, scope=scope, key=None)
    if getattr(error, "sqlstate", None) == "22023":
        raise InvalidArgument("token", str(error).splitlines()[0]) from error
    if getattr(error, "sqlstate", None) == SUPERSEDED_SQLSTATE:
        # The session was ended inside the fenced transaction, before its commit completed: nothing
        # was applied. The fence ends one only for a newer token (_postgres_supersede); a server shutdown
        # reads the same, and nothing of the transaction was applied either.
        raise Superseded(token, error_text(error)) from error
    if _lost(error):
        raise BackendUnavailable(f"{resource}: {error_text(error)}") from error


#: The server ended the session under an open transaction: idle in it too long (25P03, a writer
#: paused inside its transaction), or the transaction ran too long (25P04). psycopg files both
#: under class 25, not as connection failures.
_SESSION_ENDED = frozenset({"25P03", "25P04"})


def _lost(error: BaseException) -> bool:
    """A failure of the connection or server (outcome unknown), not a serialization failure or a deadlock
    (class 40: rolled back, for the caller to retry as PostgreSQL users do)."""
    sqlstate = getattr(error, "sqlstate", None) or ""
    if isinstance(error, psycopg.Error) and sqlstate in _SESSION_ENDED:
        return True
    return isinstance(error, psycopg.OperationalError | psycopg.InterfaceError) and not sqlstate.startswith("40")


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
