"""What both fronts of a fenced transaction share (the sync one and the async one it is generated from).

`stockade.resources.postgres` exports the fronts (``fenced``, ``fenced_sqlalchemy`` and their async
twins, written once in ``_async/fence.py``); this module holds what runs before and after their body:
the arguments' checks (and the MAC, given keys), the fence statement, and the typed error of a driver's.
"""

from __future__ import annotations

import re
import weakref
from typing import Any, NoReturn

from stockade.core.errors import InvalidArgument
from stockade.core.fence import Reject
from stockade.core.limits import SCOPE_CHARS, validate_op_id, validate_scope
from stockade.core.tokens import FencingToken
from stockade.keys import FixedKeys, KeyFile, verifier_of
from stockade.resources._inputs import coerce_token
from stockade.resources._observe import reject
from stockade.resources._verified_tokens import VerifiedTokens
from stockade.resources._verify import UNSIGNED, Verification
from stockade.resources.postgres._errors import _translate
from stockade.resources.postgres._probe import Probe

try:
    import psycopg
    from psycopg import generators, sql
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError("stockade.resources.postgres needs psycopg 3: pip install 'stockade[postgres]'") from exc

#: The one statement of a fenced transaction (any language or ORM can run it).
FENCE_SQL = "SELECT stockade.fence(%s, %s)"
#: The same with an operation id (R3): refused with `ALREADY_APPLIED_SQLSTATE` if it was applied before.
FENCE_OP_SQL = "SELECT stockade.fence_op(%s, %s, %s)"

Connection = Any  # psycopg.Connection[Any]; Any so that every row factory is accepted
AsyncConnection = Any


def _resource(info: Any) -> str:
    try:
        return f"postgres:{info.host}:{info.port}/{info.dbname}"
    except Exception:  # noqa: BLE001 - a name for the log only
        return "postgres"


def _prepare(token: object, scope: object, keys: object, op_id: object = None) -> tuple[FencingToken, str]:
    """Validate the arguments and, with ``keys``, verify the MAC here (no round trip for a forgery)."""
    fencing_token = coerce_token(token)
    scope = validate_scope(fencing_token.scope if scope is None else scope)
    if op_id is not None:
        validate_op_id(op_id)
    if keys is not None and keys != UNSIGNED:
        memory = _memory_of(keys)
        why = memory.check(fencing_token)[1]
        if why is not None:
            # Nothing was read: the mark is not known here, and a forged token learns nothing of it.
            reject(Reject("forged", 0, why), resource="postgres", cluster=memory.cluster_id or "",
                   token=fencing_token, scope=scope, key=None)
    return fencing_token, scope


#: The memory of verified tokens of each `FixedKeys` or `KeyFile` given as ``keys=`` (as long as it lives).
_MEMORIES: weakref.WeakKeyDictionary[object, VerifiedTokens] = weakref.WeakKeyDictionary()


def _memory_of(keys: object) -> VerifiedTokens:
    """What checks tokens against ``keys``: one memory per verifier object (`stockade.resources._verified_tokens`
    says what it changes: nothing a token could tell), a fresh one for keys given otherwise (a path, a keyring)."""
    kept = isinstance(keys, FixedKeys | KeyFile)
    memory = _MEMORIES.get(keys) if kept else None
    if memory is None:
        verifier = verifier_of(keys, None)
        assert verifier is not None
        verification = Verification()
        verification.use_keys(verifier, verifier.cluster_id)
        memory = VerifiedTokens(verification)
        if kept:
            _MEMORIES[keys] = memory
    return memory


def _check_result(error: BaseException, token: FencingToken, scope: str, resource: str,
                  op_id: str | None = None, probe: Probe | None = None) -> NoReturn:
    _translate(error, token, scope, resource, op_id, probe)
    raise error


def _fence_statement(op_id: str | None) -> tuple[str, Any]:
    """The check's statement and its parameters' builder: ``stockade.fence``, or ``fence_op`` with an id."""
    if op_id is None:
        return FENCE_SQL, lambda token, scope: (token.encode(), scope)
    return FENCE_OP_SQL, lambda token, scope: (token.encode(), scope, op_id)


def _begin_and_fence(token: FencingToken, scope: str, op_id: str | None = None, conn: Any = None) -> str:
    """``BEGIN`` and the fence in one simple query: one round trip, as many as a plain ``BEGIN``.

    The values are inlined: a validated token and scope hold only ``[A-Za-z0-9._:-]``
    (checked again here, so no quote can ever reach the text); an operation id,
    printable ASCII, is quoted by psycopg for this connection.
    """
    encoded = token.encode()
    if not (_INLINE_SAFE.fullmatch(encoded) and _INLINE_SAFE.fullmatch(scope)):
        raise InvalidArgument("token", "holds characters a token never holds")
    if op_id is None:
        return f"BEGIN; SELECT stockade.fence('{encoded}', '{scope}')"
    return f"BEGIN; SELECT stockade.fence_op('{encoded}', '{scope}', {sql.Literal(op_id).as_string(conn)})"


_INLINE_SAFE = re.compile(f"[{SCOPE_CHARS}]+")  # a token's characters are a scope's


def _check_begun(results: list[Any], conn: Any) -> None:
    """Raise what ``conn.execute`` raises for the answers of ``BEGIN`` and the check: the first error
    as psycopg's typed exception (its SQLSTATE and diagnostics, which `_translate` reads)."""
    for result in results:
        if result.status == psycopg.pq.ExecStatus.FATAL_ERROR:
            raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
    if [result.status for result in results] != _BEGUN:
        raise psycopg.InternalError(f"unexpected answers to BEGIN and the check: {[r.status for r in results]}")


_BEGUN = [psycopg.pq.ExecStatus.COMMAND_OK, psycopg.pq.ExecStatus.TUPLES_OK]
_EXECUTE = generators.execute  # one query's answers, awaited by the connection's own wait (interrupts, timeouts)


def _owns_transaction(conn: Any) -> bool:
    """Whether `fenced` begins and ends the transaction itself: an idle autocommit connection, not in pipeline
    mode (where a query of two statements is refused: there `conn.transaction()` begins it, one more round trip)."""
    return (bool(conn.autocommit) and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            and not conn.pgconn.pipeline_status)


def _sqlalchemy() -> Any:
    try:
        import sqlalchemy
        import sqlalchemy.exc
    except ImportError as exc:  # pragma: no cover - the extra is not installed
        raise ImportError("fenced_sqlalchemy needs SQLAlchemy: pip install 'stockade[sqlalchemy]'") from exc
    return sqlalchemy


def _sqlalchemy_fence(sa: Any, token: FencingToken, scope: str, op_id: str | None) -> tuple[Any, dict[str, str]]:
    if op_id is None:
        return sa.text("SELECT stockade.fence(:token, :scope)"), {"token": token.encode(), "scope": scope}
    return (sa.text("SELECT stockade.fence_op(:token, :scope, :op_id)"),
            {"token": token.encode(), "scope": scope, "op_id": op_id})
