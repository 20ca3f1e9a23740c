"""Fence the user's own PostgreSQL: the high-water marks live in the user's database (docs/fence-postgres.md).

`install` creates (and migrates) a schema ``stockade`` in the user's database:
the marks, the default floor, a copy of the coordinator's keys, and the SQL
function ``stockade.fence(token, scope)`` that does the whole check in one
statement (`stockade.resources.postgres._sql` says what it does, step by step).
A fenced transaction runs that statement first, as a statement of the user's
own transaction, so the mark moves in the same commit as the user's rows and
the scope's lock is held until that commit (R1, R6)::

    with fenced(conn, token):              # psycopg 3 Connection
        conn.execute("UPDATE orders SET state = 'paid' WHERE id = %s", (order_id,))

    async with fenced_async(aconn, token): # psycopg 3 AsyncConnection
        ...

`fenced_sqlalchemy` and `fenced_sqlalchemy_async` do the same for an
SQLAlchemy ``Session``/``Connection`` (and their async twins) on PostgreSQL.
`protect` puts a trigger on a table, and on every partition and inheritance
child of it, so that PostgreSQL itself refuses a write to any of them from a
transaction that passed no current token for its scope. ``op_id=`` makes a
fenced transaction an operation that applies once (R3): its retry raises
`AlreadyApplied`.

**Which check is the truth.** The SQL function is: it holds the mark and the
scope lock, and it is what protected tables run. Given ``keys=``, the Python
side also verifies the MAC first (`Verification`), so a forged token is
refused without a round trip; the database would refuse it anyway. Every
rejection, from either side, goes through `stockade.resources._observe.reject`
(R5), so it is counted, logged and raised as the same typed error.

**What the key in the database trusts.** HMAC is symmetric: the keys copied
into ``stockade.keys`` can mint tokens. The table is readable only by the
installing role (and superusers); other roles reach it only through the
``SECURITY DEFINER`` functions. Whoever can read it, or restore a dump of it,
is trusted like the coordinator.
"""

from __future__ import annotations

import functools
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any, NoReturn, ParamSpec, TypeVar

from stockade.core import limits
from stockade.core.errors import AlreadyApplied, InvalidArgument, Superseded
from stockade.core.fence import Reject
from stockade.core.limits import SCOPE_CHARS, TOKEN_VALUE_MAX, validate_int, validate_op_id, validate_scope
from stockade.core.signing import Keyring
from stockade.core.tokens import FencingToken, validate_cluster_id
from stockade.core.values import FenceFloors
from stockade.keys import KeyFile, load_keyring, verifier_of
from stockade.resources._inputs import check_floors, coerce_token
from stockade.resources._observe import reject
from stockade.resources._verify import UNSIGNED, Verification, refuse_unsigned_after_signed
from stockade.resources.postgres import _protect as protected
from stockade.resources.postgres import _sql as q
from stockade.resources.postgres._errors import _edge, _lost, _rejection, _translate, ended  # noqa: F401
from stockade.resources.postgres._probe import (
    Probe,
    probe_psycopg,
    probe_psycopg_async,
    probe_sqlalchemy,
    probe_sqlalchemy_async,
)
from stockade.resources.postgres._supersede import SupersedeWarning, warn_without_signal_right
from stockade.transport.postgres import open_connection, text_of

try:
    import psycopg
    from psycopg import sql
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError("stockade.resources.postgres needs psycopg 3: pip install 'stockade[postgres]'") from exc

__all__ = [
    "install", "sync_keys", "fenced", "fenced_async", "fenced_sqlalchemy", "fenced_sqlalchemy_async",
    "protect", "unprotect", "install_ddl_guard", "AlreadyApplied", "high_waters", "default_floor",
    "raise_high_waters", "PostgresFence", "Superseded", "SupersedeWarning",
    "FENCE_SQL", "FENCE_OP_SQL", "REJECT_SQLSTATE", "NO_TOKEN_SQLSTATE", "ALREADY_APPLIED_SQLSTATE",
]

#: The one statement of a fenced transaction (any language or ORM can run it).
FENCE_SQL = "SELECT stockade.fence(%s, %s)"
#: The same with an operation id (R3): refused with `ALREADY_APPLIED_SQLSTATE` if it was applied before.
FENCE_OP_SQL = "SELECT stockade.fence_op(%s, %s, %s)"
REJECT_SQLSTATE = q.REJECT_SQLSTATE
NO_TOKEN_SQLSTATE = q.NO_TOKEN_SQLSTATE
ALREADY_APPLIED_SQLSTATE = q.ALREADY_APPLIED_SQLSTATE

P = ParamSpec("P")
T = TypeVar("T")
Connection = Any  # psycopg.Connection[Any]; Any so that every row factory is accepted
AsyncConnection = Any


# -- keys ------------------------------------------------------------------------------------------


def _keyring_of(keys: object, cluster_id: str | None) -> tuple[Keyring | None, str]:
    """The keyring ``keys`` stand for (None: ``"unsigned"``) and the cluster it belongs to."""
    if keys is None:
        raise InvalidArgument("keys", "pass the coordinator's keys (a KeyFile, FixedKeys, keyring path) "
                                      "or 'unsigned' (no MAC check: unsafe, see docs/tokens.md)")
    if keys == UNSIGNED:
        if cluster_id is None:
            raise InvalidArgument("cluster_id", "is needed with keys='unsigned'")
        return None, validate_cluster_id(cluster_id, "cluster_id")
    verifier = verifier_of(keys, cluster_id)
    assert verifier is not None
    keyring = load_keyring(verifier.path) if isinstance(verifier, KeyFile) else verifier.keyring
    return keyring, keyring.cluster_id


def _write_keys(conn: Connection, keyring: Keyring | None) -> None:
    if keyring is None:  # L2: a database that verified (verify_macs, set only by keys) keeps verifying
        verified = conn.execute("SELECT verify_macs FROM stockade.settings").fetchone()[0]
        refuse_unsigned_after_signed(_resource(conn.info), bool(verified), UNSIGNED)
    conn.execute("DELETE FROM stockade.keys")
    if keyring is not None:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO stockade.keys (kid, secret, verify_until_s) VALUES (%s, %s, %s)",
                            [(k.kid, k.secret, k.verify_until_s) for k in keyring.keys])
    conn.execute("UPDATE stockade.settings SET verify_macs = %s", (keyring is not None,))


# -- install ---------------------------------------------------------------------------------------


def install(conn: Connection, *, keys: object, cluster_id: str | None = None,
            supersede_after_ms: int = limits.SUPERSEDE_AFTER_MS) -> None:
    """Create or migrate the schema ``stockade`` and (re)define its functions; copy the keys in.

    Idempotent and safe to run from several processes at once (a transaction-scoped
    advisory lock serialises installs). Needs the right to create a schema and the
    trusted extension pgcrypto in the database (its owner has both).

    Args:
        conn: a psycopg 3 connection to the user's database.
        keys: the coordinator's keys (`stockade.keys.KeyFile`, `FixedKeys`, a `Keyring`,
            a keyring path), or ``"unsigned"`` to check no MAC (unsafe; docs/tokens.md).
        cluster_id: the coordinator cluster (needed only with ``"unsigned"``).
        supersede_after_ms: how long a newer token waits for a transaction that holds its scope
            with a lower token before that transaction's session is ended (docs/fence-postgres.md,
            "A paused writer"). Ending it needs the installing role to be a superuser or a member of
            ``pg_signal_backend``: without that, `install` warns (`SupersedeWarning`) and a newer
            token waits as long as the lower transaction lasts.

    Raises:
        InvalidArgument: keys of another cluster than the one already installed, or bad keys.
        BackendUnavailable: the database cannot be reached.
    """
    keyring, cluster = _keyring_of(keys, cluster_id)
    bound = validate_int("supersede_after_ms", supersede_after_ms, limits.SUPERSEDE_AFTER_MS_MIN,
                         limits.SUPERSEDE_AFTER_MS_MAX)
    _install(conn, keyring, cluster, q.STALE_WHEN["decide"], supersede_after_ms=bound)


def _install(conn: Connection, keyring: Keyring | None, cluster: str, stale_when: str, *,
             body: str = "private", supersede_after_ms: int = limits.SUPERSEDE_AFTER_MS) -> None:
    """`install` with its comparison and its function body chosen: the private seams the controls
    use (`q.STALE_WHEN`, `q.FENCE_BODIES`)."""
    with _edge(), conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (q.INSTALL_LOCK_KEY,))
        conn.execute("CREATE SCHEMA IF NOT EXISTS stockade")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgcrypto SCHEMA stockade")
        row = conn.execute("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
                           "WHERE e.extname = 'pgcrypto'").fetchone()
        pgcrypto_schema = text_of(row[0])
        version = 0
        if conn.execute("SELECT to_regclass('stockade.version')").fetchone()[0] is not None:
            version = conn.execute("SELECT version FROM stockade.version").fetchone()[0]
        if version > q.SCHEMA_VERSION:
            raise InvalidArgument("install", f"the database has stockade schema {version}, newer than this "
                                             f"library's {q.SCHEMA_VERSION}")
        for migration in q.MIGRATIONS[version:]:
            conn.execute(migration)
        conn.execute("INSERT INTO stockade.version VALUES (1, %s) ON CONFLICT (id) DO UPDATE SET version = "
                     "excluded.version", (q.SCHEMA_VERSION,))
        conn.execute("INSERT INTO stockade.settings (id, cluster_id, verify_macs) VALUES (1, %s, false) "
                     "ON CONFLICT (id) DO NOTHING", (cluster,))
        installed = text_of(conn.execute("SELECT cluster_id FROM stockade.settings").fetchone()[0])
        if installed != cluster:
            raise InvalidArgument("keys", f"this database is fenced for cluster {installed}, not {cluster}")
        conn.execute(q.fence_function(pgcrypto_schema=pgcrypto_schema, stale_when=stale_when, body=body,
                                      supersede_after_ms=supersede_after_ms))
        conn.execute(q.guard_function())
        conn.execute(q.fence_op_function())
        _write_keys(conn, keyring)
        if supersede_after_ms:
            warn_without_signal_right(conn)


def sync_keys(conn: Connection, keys: object) -> None:
    """Replace the keys in the database with ``keys`` (after `stockade keys rotate`).

    Raises:
        InvalidArgument: keys of another cluster than the installed one.
    """
    with _edge(), conn.transaction():
        installed = text_of(conn.execute("SELECT cluster_id FROM stockade.settings").fetchone()[0])
        keyring, _ = _keyring_of(keys, installed)
        _write_keys(conn, keyring)


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
        verification = Verification()
        verifier = verifier_of(keys, None)
        assert verifier is not None
        verification.use_keys(verifier, verifier.cluster_id)
        why = verification.forged(fencing_token)
        if why is not None:
            # Nothing was read: the mark is not known here, and a forged token learns nothing of it.
            reject(Reject("forged", 0, why), resource="postgres", cluster=verifier.cluster_id,
                   token=fencing_token, scope=scope, key=None)
    return fencing_token, scope


def _check_result(error: BaseException, token: FencingToken, scope: str, resource: str,
                  op_id: str | None = None, probe: Probe | None = None) -> NoReturn:
    _translate(error, token, scope, resource, op_id, probe)
    raise error


def _probe_of(conn: Any, error: BaseException) -> Probe | None:
    """For a session that ended under the transaction, a probe (built before a rollback closes ``conn``)."""
    return probe_psycopg(conn) if ended(error) else None


async def _async_probe_of(aconn: Any, error: BaseException, token: FencingToken, scope: str) -> Probe | None:
    """`_probe_of` for an ``AsyncConnection``: the probe runs here, and `_translate` reads its verdict."""
    probe = probe_psycopg_async(aconn) if ended(error) else None
    if probe is None:
        return None
    superseded = await probe(token, scope)
    return lambda _token, _scope: superseded


def _fence_statement(op_id: str | None) -> tuple[str, Any]:
    """The check's statement and its parameters' builder: ``stockade.fence``, or ``fence_op`` with an id."""
    if op_id is None:
        return FENCE_SQL, lambda token, scope: (token.encode(), scope)
    return FENCE_OP_SQL, lambda token, scope: (token.encode(), scope, op_id)


# -- fenced transactions ---------------------------------------------------------------------------


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


def _owns_transaction(conn: Any) -> bool:
    """Whether `fenced` begins and ends the transaction itself (an idle autocommit connection)."""
    return bool(conn.autocommit) and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


@contextmanager
def fenced(conn: Connection, token: FencingToken | str, scope: str | None = None, *,
           keys: object = None, op_id: str | None = None) -> Iterator[Connection]:
    """A transaction of ``conn`` admitted by ``token``: ``with fenced(conn, token): conn.execute(...)``.

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
        conn: a psycopg 3 ``Connection`` to a database where `install` ran.
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
    statement, parameters = _fence_statement(op_id)
    if not _owns_transaction(conn):
        try:
            with conn.transaction():
                conn.execute(statement, parameters(fencing_token, scope))
                yield conn
        except psycopg.Error as error:  # the check's, the body's (a protected table's trigger) or the commit's
            _check_result(error, fencing_token, scope, _resource(conn.info), op_id, _probe_of(conn, error))
        return
    try:
        conn.execute(_begin_and_fence(fencing_token, scope, op_id, conn))
        yield conn
    except BaseException as error:
        probe = _probe_of(conn, error)
        _rollback_quietly(conn)
        if isinstance(error, psycopg.Error):
            _check_result(error, fencing_token, scope, _resource(conn.info), op_id, probe)
        raise
    try:
        conn.commit()
    except psycopg.Error as error:
        _check_result(error, fencing_token, scope, _resource(conn.info), op_id, _probe_of(conn, error))


def _rollback_quietly(conn: Any) -> None:
    try:
        conn.rollback()
    except psycopg.Error:
        pass  # the connection is gone: the server rolls back by itself


async def _arollback_quietly(aconn: Any) -> None:
    try:
        await aconn.rollback()
    except psycopg.Error:
        pass


@asynccontextmanager
async def fenced_async(aconn: AsyncConnection, token: FencingToken | str, scope: str | None = None, *,
                       keys: object = None, op_id: str | None = None) -> AsyncIterator[AsyncConnection]:
    """`fenced` for a psycopg 3 ``AsyncConnection``: ``async with fenced_async(aconn, token): ...``."""
    fencing_token, scope = _prepare(token, scope, keys, op_id)
    statement, parameters = _fence_statement(op_id)
    if not _owns_transaction(aconn):
        try:
            async with aconn.transaction():
                await aconn.execute(statement, parameters(fencing_token, scope))
                yield aconn
        except psycopg.Error as error:
            probe = await _async_probe_of(aconn, error, fencing_token, scope)
            _check_result(error, fencing_token, scope, _resource(aconn.info), op_id, probe)
        return
    try:
        await aconn.execute(_begin_and_fence(fencing_token, scope, op_id, aconn))
        yield aconn
    except BaseException as error:
        probe = await _async_probe_of(aconn, error, fencing_token, scope)
        await _arollback_quietly(aconn)
        if isinstance(error, psycopg.Error):
            _check_result(error, fencing_token, scope, _resource(aconn.info), op_id, probe)
        raise
    try:
        await aconn.commit()
    except psycopg.Error as error:
        probe = await _async_probe_of(aconn, error, fencing_token, scope)
        _check_result(error, fencing_token, scope, _resource(aconn.info), op_id, probe)


def _sqlalchemy() -> Any:
    try:
        import sqlalchemy
        import sqlalchemy.exc
    except ImportError as exc:  # pragma: no cover - the extra is not installed
        raise ImportError("fenced_sqlalchemy needs SQLAlchemy: pip install 'stockade[sqlalchemy]'") from exc
    return sqlalchemy


@contextmanager
def fenced_sqlalchemy(bind: Any, token: FencingToken | str, scope: str | None = None, *,
                      keys: object = None, op_id: str | None = None) -> Iterator[Any]:
    """`fenced` for an SQLAlchemy ``Session`` or ``Connection`` on PostgreSQL (any DBAPI driver).

    Begins a transaction (a SAVEPOINT if one is already open), runs the fence
    statement in it, yields ``bind``, and commits (releases) at the end.
    ``op_id`` as in `fenced`.
    """
    sa = _sqlalchemy()
    fencing_token, scope = _prepare(token, scope, keys, op_id)
    statement, parameters = _sqlalchemy_fence(sa, fencing_token, scope, op_id)
    try:
        with bind.begin_nested() if bind.in_transaction() else bind.begin():
            bind.execute(statement, parameters)
            yield bind
    except sa.exc.DBAPIError as error:
        _translate(error.orig, fencing_token, scope, "postgres", op_id,
                   probe_sqlalchemy(bind) if ended(error.orig) else None)
        raise


def _sqlalchemy_fence(sa: Any, token: FencingToken, scope: str, op_id: str | None) -> tuple[Any, dict[str, str]]:
    if op_id is None:
        return sa.text("SELECT stockade.fence(:token, :scope)"), {"token": token.encode(), "scope": scope}
    return (sa.text("SELECT stockade.fence_op(:token, :scope, :op_id)"),
            {"token": token.encode(), "scope": scope, "op_id": op_id})


@asynccontextmanager
async def fenced_sqlalchemy_async(bind: Any, token: FencingToken | str, scope: str | None = None, *,
                                  keys: object = None, op_id: str | None = None) -> AsyncIterator[Any]:
    """`fenced_sqlalchemy` for an ``AsyncSession`` or ``AsyncConnection`` (``postgresql+psycopg``)."""
    sa = _sqlalchemy()
    fencing_token, scope = _prepare(token, scope, keys, op_id)
    statement, parameters = _sqlalchemy_fence(sa, fencing_token, scope, op_id)
    try:
        async with bind.begin_nested() if bind.in_transaction() else bind.begin():
            await bind.execute(statement, parameters)
            yield bind
    except sa.exc.DBAPIError as error:
        probe = None
        if ended(error.orig):
            superseded = await probe_sqlalchemy_async(bind)(fencing_token, scope)
            probe = lambda _token, _scope: superseded  # noqa: E731 - the verdict, read by _translate
        _translate(error.orig, fencing_token, scope, "postgres", op_id, probe)
        raise


# -- protected tables (docs/fence-postgres.md; the rule in `_postgres_protect` and SQL's stockade.cover) --------


def _edged(function: Callable[P, T]) -> Callable[P, T]:
    """``function`` inside `_edge` (a lost connection as `BackendUnavailable`), its name and docstring kept."""

    @functools.wraps(function)
    def edged(*args: P.args, **kwargs: P.kwargs) -> T:
        with _edge():
            return function(*args, **kwargs)

    return edged


protect = _edged(protected.protect)
unprotect = _edged(protected.unprotect)
install_ddl_guard = _edged(protected.install_ddl_guard)


# -- marks and floors (R4) -------------------------------------------------------------------------


def high_waters(conn: Connection) -> dict[str, int]:
    """Every scope's effective mark (its own raised to the default floor)."""
    with _edge(), conn.transaction():
        rows = conn.execute("SELECT h.scope, greatest(h.high_water, s.default_floor) FROM stockade.high_water h, "
                            "stockade.settings s ORDER BY h.scope").fetchall()
    return {text_of(scope): int(mark) for scope, mark in rows}


def default_floor(conn: Connection) -> int:
    """The floor of every scope the database has no mark of its own for."""
    with _edge(), conn.transaction():
        return int(conn.execute("SELECT default_floor FROM stockade.settings").fetchone()[0])


def raise_high_waters(conn: Connection, floors: Mapping[str, int] | FenceFloors, *,
                      default: int = 0) -> dict[str, int]:
    """Raise marks to floors, never lowering one, in one transaction (R4: after a failover or a restore).

    Waits for every open fenced transaction to end (each holds the floor's gate,
    a view only the installing role can name), so no check admitted below the new
    floor commits after it; a transaction whose snapshot predates the raise is
    refused, or fails with a serialization failure (40001) under REPEATABLE READ
    or SERIALIZABLE.

    Args:
        conn: a psycopg 3 connection.
        floors: scope -> floor, or a `FenceFloors` (its ``default`` then counts too).
        default: the floor of every scope not named, including ones never seen (kept durably).

    Returns:
        The named scopes' marks after.

    Raises:
        InvalidArgument: a bad scope or value (nothing changes).
    """
    default = validate_int("default", default, 0, TOKEN_VALUE_MAX)
    if isinstance(floors, FenceFloors):
        default = max(default, floors.default)
        checked = check_floors(floors.floors)
    else:
        checked = check_floors(floors)
    with _edge(), conn.transaction():
        conn.execute(f"LOCK TABLE {q.FLOOR_GATE} IN ACCESS EXCLUSIVE MODE")  # waits for every open check
        conn.execute("UPDATE stockade.settings SET default_floor = greatest(default_floor, %s)", (default,))
        if checked:  # one statement, not executemany (a pipeline's Flush disarms the idle timeout)
            conn.execute(
                "INSERT INTO stockade.high_water AS h (scope, high_water) SELECT * FROM unnest(%s::text[], "
                "%s::bigint[]) ON CONFLICT (scope) DO UPDATE SET high_water = greatest(h.high_water, "
                "excluded.high_water)", (list(checked), list(checked.values())))
        rows = conn.execute("SELECT h.scope, greatest(h.high_water, s.default_floor) FROM stockade.high_water h, "
                            "stockade.settings s WHERE h.scope = ANY(%s)", (list(checked),)).fetchall()
    return {text_of(scope): int(mark) for scope, mark in rows}


class PostgresFence:
    """A PostgreSQL database fenced by stockade, by its connection string (what ``stockade floor`` opens).

    Each call opens its own short connection. ``dsn`` is a libpq connection
    string or a ``postgresql://`` url.

    Args:
        dsn: where the database is.
        keys: the coordinator's keys, for `install`, `sync_keys` and `fenced` (None: only the floors).
        connect_timeout_s: how long a connection attempt may take.
    """

    def __init__(self, dsn: str, *, keys: object = None, connect_timeout_s: int = 10) -> None:
        if not isinstance(dsn, str) or not dsn:
            raise InvalidArgument("dsn", "must be a libpq connection string or a postgresql:// url")
        self.dsn = dsn
        self.keys = keys
        self.connect_timeout_s = validate_int("connect_timeout_s", connect_timeout_s, 1, 3600)

    def __repr__(self) -> str:
        return "PostgresFence(<dsn>)"  # a dsn may hold a password

    def connect(self) -> Any:
        """A new psycopg connection (autocommit: each `fenced` block is its own transaction)."""
        with _edge():
            return open_connection(psycopg.connect, self.dsn, autocommit=True, connect_timeout=self.connect_timeout_s)

    def install(self, *, cluster_id: str | None = None) -> None:
        with self.connect() as conn:
            install(conn, keys=self.keys, cluster_id=cluster_id)

    def sync_keys(self) -> None:
        with self.connect() as conn:
            sync_keys(conn, self.keys)

    def high_waters(self) -> dict[str, int]:
        with self.connect() as conn:
            return high_waters(conn)

    def default_floor(self) -> int:
        with self.connect() as conn:
            return default_floor(conn)

    def raise_high_waters(self, floors: Mapping[str, int] | FenceFloors, *, default: int = 0) -> dict[str, int]:
        with self.connect() as conn:
            return raise_high_waters(conn, floors, default=default)

    def close(self) -> None:
        """Nothing is held between calls; here for the resource protocol."""


def open_floor_target(url: str, *, cluster_id: str) -> PostgresFence:
    """``postgresql://...``, a fenced database, opened for the floor (``stockade floor``; R4).

    The floor verifies no token, so no keys are needed. A database where
    `install` never ran, or that trusts another coordinator cluster, is refused:
    nothing is created, and a typo in a url cannot floor the wrong database.

    Raises:
        InvalidArgument: not installed, or installed for another cluster.
        BackendUnavailable: the database cannot be reached.
    """
    fence = PostgresFence(url)
    with fence.connect() as conn, _edge():
        installed = conn.execute("SELECT to_regclass('stockade.settings') IS NOT NULL").fetchone()
        if not installed or not installed[0]:
            raise InvalidArgument("resource", "no stockade fence in this database (install() never ran here)")
        row = conn.execute("SELECT cluster_id FROM stockade.settings WHERE id = 1").fetchone()
    if row is None or row[0] != cluster_id:
        raise InvalidArgument(
            "resource", f"this database trusts coordinator cluster {row[0] if row else None}, not {cluster_id}"
        )
    return fence
