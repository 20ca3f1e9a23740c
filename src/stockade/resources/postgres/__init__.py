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
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from stockade.core import limits
from stockade.core.errors import AlreadyApplied, InvalidArgument, Superseded
from stockade.core.limits import TOKEN_VALUE_MAX, validate_int
from stockade.core.signing import Keyring
from stockade.core.tokens import validate_cluster_id
from stockade.core.values import FenceFloors
from stockade.keys import KeyFile, load_keyring, verifier_of
from stockade.resources._inputs import check_floors
from stockade.resources._verify import UNSIGNED, refuse_unsigned_after_signed
from stockade.resources.postgres import _protect as protected
from stockade.resources.postgres import _sql as q
from stockade.resources.postgres._async.fence import fenced_async, fenced_sqlalchemy_async
from stockade.resources.postgres._errors import _edge, _lost, _rejection, _translate, ended  # noqa: F401
from stockade.resources.postgres._fenced import FENCE_OP_SQL, FENCE_SQL, Connection, _resource
from stockade.resources.postgres._protect import read_committed_transaction as _read_committed_transaction
from stockade.resources.postgres._supersede import SupersedeWarning, warn_without_signal_right
from stockade.resources.postgres._sync.fence import fenced, fenced_sqlalchemy
from stockade.transport.postgres import open_connection, text_of

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError("stockade.resources.postgres needs psycopg 3: pip install 'stockade[postgres]'") from exc

__all__ = [
    "install", "sync_keys", "fenced", "fenced_async", "fenced_sqlalchemy", "fenced_sqlalchemy_async",
    "protect", "unprotect", "install_ddl_guard", "AlreadyApplied", "high_waters", "default_floor",
    "raise_high_waters", "PostgresFence", "Superseded", "SupersedeWarning",
    "FENCE_SQL", "FENCE_OP_SQL", "REJECT_SQLSTATE", "NO_TOKEN_SQLSTATE", "ALREADY_APPLIED_SQLSTATE",
]

REJECT_SQLSTATE = q.REJECT_SQLSTATE
NO_TOKEN_SQLSTATE = q.NO_TOKEN_SQLSTATE
ALREADY_APPLIED_SQLSTATE = q.ALREADY_APPLIED_SQLSTATE

P = ParamSpec("P")
T = TypeVar("T")


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
    with _edge(), _read_committed_transaction(conn):
        protected.one_at_a_time(conn)
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

    Safe from several processes at once: it takes the install's lock first, then reads as committed (at any
    level, two at once deleted the keys and both inserted them again: a unique violation).

    Raises:
        InvalidArgument: keys of another cluster than the installed one.
    """
    with _edge(), _read_committed_transaction(conn):
        protected.one_at_a_time(conn)
        installed = text_of(conn.execute("SELECT cluster_id FROM stockade.settings").fetchone()[0])
        keyring, _ = _keyring_of(keys, installed)
        _write_keys(conn, keyring)


# -- fenced transactions ---------------------------------------------------------------------------


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
