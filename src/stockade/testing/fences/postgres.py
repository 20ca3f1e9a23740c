"""Fence harnesses over a real PostgreSQL: ``postgres`` (psycopg sync), ``postgres-async`` (psycopg
async, driven from a private event loop thread) and ``postgres-sqlalchemy`` (a sync SQLAlchemy Session),
each on a UTF8 database; ``postgres-sql_ascii`` is ``postgres`` on a SQL_ASCII database (the user's
connection then gets text back as bytes: `stockade.testing.servers.postgres.ENCODINGS`).

Each harness gets an empty database on one shared server (a new one, or one a
closed harness left, emptied), `install`s the fence in it and keeps the user's
data in a plain table ``kv(scope, key, value bytea)``, written with ordinary SQL
inside the adapter's fenced transaction.

The controls:

- ``fencing-off`` / ``strict-greater``: the SQL function is installed with
  another comparison (the adapter's private seam `_postgres_sql.STALE_WHEN`).
- ``check-then-write``: the mark is read in one transaction and judged with
  `stockade.core.fence.decide`; then every write runs in a transaction of its
  own that raises the mark without comparing (it trusts the earlier check).
- ``advisory-locks``: schema 1's function (`_postgres_sql.FENCE_BODIES`): it reads
  the default floor through the transaction's snapshot and serialises with
  advisory locks any role can take (the control of the optional capabilities of
  `stockade.testing.conformance.fence_isolation`, which the plain ``postgres``
  harness offers: a floor raised mid-transaction, and an outsider role).
- ``op-ids-off`` (the retry suite's): ``fenced_once`` drops the operation id.
- ``no-supersede`` (the paused-writer class's, `stockade.testing.conformance.fence_paused`):
  installed without supersession, so a newer token waits as long as a paused lower one lasts.

Every harness offers operation ids (``fenced_once``, the retry suite's capability).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg

from stockade.core import limits
from stockade.core.errors import InvalidArgument
from stockade.core.fence import Reject, decide
from stockade.core.limits import validate_scope
from stockade.keys import FixedKeys
from stockade.resources import postgres as pg
from stockade.resources._observe import reject
from stockade.resources.postgres import _sql as q
from stockade.resources.postgres._fenced import _prepare
from stockade.testing.servers.postgres import (
    SUPERUSER,
    PostgresServer,
    fresh_database,
    keep_what_succeeds,
    shared_server,
)

T = TypeVar("T")

#: The paused-writer control: the fence installed without supersession (the behaviour before it).
NO_SUPERSEDE = "no-supersede"
KV_TABLE = "CREATE TABLE kv (scope text NOT NULL, key text NOT NULL, value bytea NOT NULL, PRIMARY KEY (scope, key))"
UPSERT = ("INSERT INTO kv (scope, key, value) VALUES (%s, %s, %s) "
          "ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value")
SELECT = "SELECT value FROM kv WHERE scope = %s AND key = %s"
# The check-then-write control's write: raises the mark without comparing, in a transaction of its own.
TRUSTING_UPSERT = (
    "WITH mark AS (INSERT INTO stockade.high_water AS h (scope, high_water) VALUES (%s, %s) "
    "ON CONFLICT (scope) DO UPDATE SET high_water = greatest(h.high_water, excluded.high_water)) " + UPSERT
)


class PgUnit:
    def __init__(self, harness: PgHarness, scope: str) -> None:
        self._harness = harness
        self._scope = scope

    def write(self, key: str, value: bytes) -> None:
        if len(value) > self._harness.value_bytes_max:
            raise InvalidArgument("value", f"must be at most {self._harness.value_bytes_max} bytes")
        self._harness.execute(UPSERT, (self._scope, key, value))

    def read(self, key: str) -> bytes | None:
        rows = self._harness.execute(SELECT, (self._scope, key))
        return None if not rows else bytes(rows[0][0])


class TrustingUnit(PgUnit):
    """The check-then-write control's unit: every write is its own transaction, trusting an old check."""

    def __init__(self, harness: PgHarness, scope: str, token_value: int) -> None:
        super().__init__(harness, scope)
        self._token_value = token_value

    def write(self, key: str, value: bytes) -> None:
        if len(value) > self._harness.value_bytes_max:
            raise InvalidArgument("value", f"must be at most {self._harness.value_bytes_max} bytes")
        self._harness.execute_alone(TRUSTING_UPSERT, (self._scope, self._token_value, self._scope, key, value))


class PgHarness:
    """The psycopg (sync) harness; the base of the other two (they replace the driver calls)."""

    value_bytes_max = 4096
    between_check_and_write: Callable[[], None] | None = None

    def __init__(self, server: PostgresServer, dbname: str, cluster_id: str, keys: FixedKeys,
                 mutant: str | None, *, owner: bool, encoding: str = "UTF8") -> None:
        self.server, self.dbname, self.cluster_id, self.keys, self.mutant = server, dbname, cluster_id, keys, mutant
        self.encoding = encoding
        self._owner = owner
        self.admin = psycopg.connect(server.dsn_of(dbname), autocommit=True)
        if owner:
            rule = q.STALE_WHEN[mutant] if mutant in ("fencing-off", "strict-greater") else q.STALE_WHEN["decide"]
            pg._install(self.admin, keys.keyring, cluster_id, rule,
                        body="advisory" if mutant == "advisory-locks" else "private",
                        supersede_after_ms=0 if mutant == NO_SUPERSEDE else limits.SUPERSEDE_AFTER_MS)
        self.open_driver()

    # -- the driver (replaced by the subclasses) --

    def open_driver(self) -> None:
        self.conn = psycopg.connect(self.server.dsn_of(self.dbname), autocommit=True)

    def close_driver(self) -> None:
        self.conn.close()

    @contextmanager
    def native_fenced(self, scope: str, token: Any, op_id: str | None = None) -> Iterator[None]:
        with pg.fenced(self.conn, token, scope, keys=self.keys, op_id=op_id):
            yield

    def execute(self, statement: str, params: tuple[Any, ...]) -> list[Any]:
        cur = self.conn.execute(statement, params)
        return cur.fetchall() if cur.description else []

    def execute_alone(self, statement: str, params: tuple[Any, ...]) -> None:
        self.conn.execute(statement, params)  # autocommit: its own transaction

    def clone(self) -> PgHarness:
        return type(self)(self.server, self.dbname, self.cluster_id, self.keys, self.mutant, owner=False,
                          encoding=self.encoding)

    # -- the harness protocol --

    @contextmanager
    def fenced(self, scope: str, token: Any) -> Iterator[PgUnit]:
        if self.mutant == "check-then-write":
            yield self._checked_then_trusted(scope, token)
            return
        with self.native_fenced(scope, token):
            yield PgUnit(self, scope)

    @contextmanager
    def fenced_once(self, scope: str, token: Any, op_id: str) -> Iterator[PgUnit]:
        with self.native_fenced(scope, token, None if self.mutant == "op-ids-off" else op_id):
            yield PgUnit(self, scope)

    def _checked_then_trusted(self, scope: str, token: Any) -> PgUnit:
        fencing_token, scope = _prepare(token, validate_scope(scope), self.keys)
        mark = self.high_water(scope)  # one transaction ...
        decision = decide(fencing_token, cluster=self.cluster_id, scope=scope, high_water=mark)
        if isinstance(decision, Reject):
            reject(decision, resource="postgres-control", cluster=self.cluster_id, token=fencing_token,
                   scope=scope, key=None)
        if self.between_check_and_write is not None:
            self.between_check_and_write()
        return TrustingUnit(self, scope, fencing_token.value)  # ... the writes in others

    def read(self, scope: str, key: str) -> bytes | None:
        row = self.admin.execute(SELECT, (scope, key)).fetchone()
        return None if row is None else bytes(row[0])

    def high_water(self, scope: str) -> int:
        return pg.high_waters(self.admin).get(scope, pg.default_floor(self.admin))

    def raise_high_waters(self, floors: Mapping[str, int], *, default: int = 0) -> dict[str, int]:
        return pg.raise_high_waters(self.admin, floors, default=default)

    def state(self) -> Any:
        rows = self.admin.execute("SELECT scope, key, value FROM kv ORDER BY scope, key").fetchall()
        return (pg.high_waters(self.admin), pg.default_floor(self.admin), [(s, k, bytes(v)) for s, k, v in rows])

    def close(self) -> None:
        self.close_driver()
        self.admin.close()
        if self._owner:
            _free.setdefault((self.server.port, self.encoding), []).append(self.dbname)


    # -- the optional capabilities (stockade.testing.conformance.fence_isolation) --

    isolation_levels = ("repeatable read", "serializable")
    isolation_refusals: tuple[type[BaseException], ...] = (psycopg.errors.SerializationFailure,)

    @contextmanager
    def fenced_after_read(self, level: str, scope: str, token: Any, between: Callable[[], None]) -> Iterator[Any]:
        with psycopg.connect(self.server.dsn_of(self.dbname)) as conn:  # not autocommit: psycopg begins
            conn.isolation_level = _LEVELS[level]
            conn.execute("SELECT count(*) FROM kv")  # the transaction's snapshot is taken here
            between()
            try:
                with pg.fenced(conn, token, scope, keys=self.keys):  # a savepoint of the open transaction
                    yield _ConnUnit(conn, scope, self.value_bytes_max)
                conn.commit()
            except BaseException:
                conn.rollback()
                raise

    @contextmanager
    def outsider_holds_what_it_can(self, scopes: list[str]) -> Iterator[list[str]]:
        """A session of `OUTSIDER_ROLE` (LOGIN, CONNECT on this database, nothing else), holding what it can."""
        self.admin.execute(f"REVOKE ALL ON DATABASE {self.dbname} FROM PUBLIC")
        self.admin.execute(f"GRANT CONNECT ON DATABASE {self.dbname} TO {OUTSIDER_ROLE}")
        held: list[str] = []
        dsn = self.server.dsn_of(self.dbname).replace(f"user={SUPERUSER}", f"user={OUTSIDER_ROLE}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET idle_in_transaction_session_timeout = 0")
            keys = [f"pg_advisory_lock({q.FLOOR_LOCK_KEY})", f"pg_advisory_lock({q.INSTALL_LOCK_KEY})"]
            keys += [f"pg_advisory_lock({q.SCOPE_LOCK_CLASS}, hashtext('{s}'))" for s in scopes]
            for key in keys:  # session locks: outside any transaction, no idle timeout applies
                conn.execute(f"SELECT {key}")
                held.append(key)
            conn.execute("BEGIN")
            tables = [r[0] for r in conn.execute(
                "SELECT schemaname || '.' || tablename FROM pg_tables WHERE schemaname LIKE 'stockade%' "
                "UNION ALL SELECT schemaname || '.' || viewname FROM pg_views WHERE schemaname LIKE 'stockade%'"
            ).fetchall()]
            tables.append(q.FLOOR_GATE)
            attempts = []
            for n, table in enumerate(tables):
                attempts += [f"PREPARE p{n} AS SELECT * FROM {table}", f"LOCK TABLE {table} IN ACCESS SHARE MODE",
                             f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE", f"SELECT 1 FROM {table} FOR SHARE"]
            attempts += [f"SELECT scope FROM stockade.high_water WHERE scope = '{s}' FOR UPDATE" for s in scopes]
            attempts += [f"SELECT stockade.fence('stk1.{self.cluster_id}.9.{s}', '{s}')" for s in scopes]
            held += keep_what_succeeds(conn, attempts)
            try:
                yield held
            finally:
                conn.execute("ROLLBACK")


_LEVELS = {"repeatable read": psycopg.IsolationLevel.REPEATABLE_READ,
           "serializable": psycopg.IsolationLevel.SERIALIZABLE}
#: The role of `PgHarness.outsider_holds_what_it_can`: it may log in, and nothing else.
OUTSIDER_ROLE = "stockade_outsider"


class _ConnUnit(PgUnit):
    """A unit on a connection of its own (`PgHarness.fenced_after_read`)."""

    def __init__(self, conn: psycopg.Connection[Any], scope: str, value_bytes_max: int) -> None:
        self._conn, self._scope, self._value_bytes_max = conn, scope, value_bytes_max

    def write(self, key: str, value: bytes) -> None:
        if len(value) > self._value_bytes_max:
            raise InvalidArgument("value", f"must be at most {self._value_bytes_max} bytes")
        self._conn.execute(UPSERT, (self._scope, key, value))

    def read(self, key: str) -> bytes | None:
        row = self._conn.execute(SELECT, (self._scope, key)).fetchone()
        return None if row is None else bytes(row[0])


class AsyncPgHarness(PgHarness):
    """psycopg's ``AsyncConnection`` and `fenced_async`, run on a private event loop thread."""

    def open_driver(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.aconn = self._run(psycopg.AsyncConnection.connect(self.server.dsn_of(self.dbname), autocommit=True))

    def close_driver(self) -> None:
        self._run(self.aconn.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @contextmanager
    def native_fenced(self, scope: str, token: Any, op_id: str | None = None) -> Iterator[None]:
        manager = pg.fenced_async(self.aconn, token, scope, keys=self.keys, op_id=op_id)
        self._run(manager.__aenter__())
        try:
            yield
        except BaseException as error:
            if not self._run(manager.__aexit__(type(error), error, error.__traceback__)):
                raise
        else:
            self._run(manager.__aexit__(None, None, None))

    def execute(self, statement: str, params: tuple[Any, ...]) -> list[Any]:
        async def go() -> list[Any]:
            cur = await self.aconn.execute(statement, params)
            return await cur.fetchall() if cur.description else []

        return self._run(go())

    def execute_alone(self, statement: str, params: tuple[Any, ...]) -> None:
        self._run(self.aconn.execute(statement, params))


class SqlAlchemyHarness(PgHarness):
    """A sync SQLAlchemy ``Session`` (driver ``postgresql+psycopg``) and `fenced_sqlalchemy`."""

    def open_driver(self) -> None:
        import sqlalchemy
        from sqlalchemy.orm import Session

        self.engine = sqlalchemy.create_engine(
            "postgresql+psycopg://" + self.server.url(self.dbname).removeprefix("postgresql://"), pool_size=1)
        self.session = Session(self.engine)

    def close_driver(self) -> None:
        self.session.close()
        self.engine.dispose()

    @contextmanager
    def native_fenced(self, scope: str, token: Any, op_id: str | None = None) -> Iterator[None]:
        with pg.fenced_sqlalchemy(self.session, token, scope, keys=self.keys, op_id=op_id):
            yield

    def execute(self, statement: str, params: tuple[Any, ...]) -> list[Any]:
        result = self.session.connection().exec_driver_sql(statement, params)
        return list(result.fetchall()) if result.returns_rows else []

    def execute_alone(self, statement: str, params: tuple[Any, ...]) -> None:
        with self.session.begin():
            self.session.connection().exec_driver_sql(statement, params)


#: kind -> (harness, database encoding).
HARNESSES = {"postgres": (PgHarness, "UTF8"), "postgres-async": (AsyncPgHarness, "UTF8"),
             "postgres-sqlalchemy": (SqlAlchemyHarness, "UTF8"), "postgres-sql_ascii": (PgHarness, "SQL_ASCII")}


#: Databases of closed harnesses, by server port and encoding, to be emptied and used again: creating
#: a database costs ~0.3 s (it copies and fsyncs a template), emptying one ~0.05 s.
_free: dict[tuple[int, str], list[str]] = {}


def _database(server: PostgresServer, encoding: str) -> str:
    """An empty database in ``encoding`` with ``kv`` and the fence's schema but no cluster, keys or marks."""
    free = _free.setdefault((server.port, encoding), [])
    name = free.pop() if free else fresh_database(server, encoding)
    with psycopg.connect(server.dsn_of(name), autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('kv')").fetchone()[0] is None:  # type: ignore[index]
            conn.execute(KV_TABLE)
        if conn.execute("SELECT to_regclass('stockade.settings')").fetchone()[0] is not None:  # type: ignore[index]
            conn.execute("TRUNCATE kv, stockade.high_water, stockade.keys, stockade.settings, stockade.operations")
    return name


def _outsider_role(server: PostgresServer) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (OUTSIDER_ROLE,)).fetchone() is None:
            try:
                conn.execute(f"CREATE ROLE {OUTSIDER_ROLE} LOGIN")
            except psycopg.errors.DuplicateObject:
                pass  # another worker made it meanwhile


def make_postgres_harness(kind: str) -> Callable[[Any, str, FixedKeys, str | None], PgHarness]:
    """A `TARGETS` factory: a fresh database on the shared server, with the ``kind`` harness over it."""

    def make(tmp_path: Any, cluster_id: str, keys: FixedKeys, mutant: str | None) -> PgHarness:
        server = shared_server()
        harness, encoding = HARNESSES[kind]
        _outsider_role(server)
        return harness(server, _database(server, encoding), cluster_id, keys, mutant, owner=True, encoding=encoding)

    return make
