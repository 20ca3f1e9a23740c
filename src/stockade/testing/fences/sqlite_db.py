"""Fence harnesses over a user's own SQLite file (`stockade.resources.sqlite_db`): stdlib and SQLAlchemy.

The user's data is a table of their own, ``user_data(scope, key, value)``; a
unit's writes are plain ``INSERT ... ON CONFLICT`` statements inside the fenced
transaction, as an application would write them. The file is in WAL mode with
``synchronous=FULL`` (the durable settings docs/fence-sqlite.md asks for).

Controls: ``fencing-off`` and ``strict-greater`` swap the fence's
``fence_rule``; ``check-then-write`` reads the mark in one step (its own read),
judges it, calls ``between_check_and_write``, then applies each write in a
fenced transaction of its own whose rule trusts the earlier check. The retry
suite's ``op-ids-off`` drops the operation id of ``fenced_once`` (every harness
here offers operation ids).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stockade.core.errors import InvalidArgument
from stockade.core.fence import Accept, FenceDecision, Reject, decide
from stockade.core.limits import validate_key, validate_value
from stockade.core.tokens import FencingToken
from stockade.keys import FixedKeys
from stockade.resources._inputs import coerce_token
from stockade.resources._observe import reject
from stockade.resources.sqlite_db import SQLiteFence
from stockade.testing.mutants import accept_everything, reject_equal

SCOPES = ("a", "b")
USER_TABLE = (
    "CREATE TABLE IF NOT EXISTS user_data (scope TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,"
    " PRIMARY KEY (scope, key))"
)
UPSERT = (
    "INSERT INTO user_data (scope, key, value) VALUES (?, ?, ?)"
    " ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value"
)
SELECT = "SELECT value FROM user_data WHERE scope = ? AND key = ?"


def user_database(path: Path) -> None:
    """The user's database before stockade: WAL, their own table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(USER_TABLE)
    finally:
        conn.close()


def trusting(checked: Accept) -> Callable[..., FenceDecision]:
    """The check-then-write bug's second half: believe the earlier check instead of the mark now."""

    def trust(token: FencingToken, *, cluster: str, scope: str, high_water: int) -> FenceDecision:
        return Accept(max(high_water, checked.new_high_water))

    return trust


class SQLUnit:
    def __init__(self, execute: Callable[..., Any], scope: str, value_bytes_max: int) -> None:
        self._execute = execute
        self._scope = scope
        self._max = value_bytes_max

    def write(self, key: str, value: bytes) -> None:
        self._execute(UPSERT, (self._scope, validate_key(key), validate_value(value, self._max)))

    def read(self, key: str) -> bytes | None:
        row = self._execute(SELECT, (self._scope, key)).fetchone()
        return None if row is None else bytes(row[0])


class SQLiteDbHarness:
    value_bytes_max = 4096
    between_check_and_write: Callable[[], None] | None = None

    def __init__(self, path: Path, cluster_id: str, keys: FixedKeys, mutant: str | None,
                 sqlalchemy: bool = False) -> None:
        self.path, self.cluster_id, self.keys, self.mutant, self.sqlalchemy = path, cluster_id, keys, mutant, sqlalchemy
        self.fence = SQLiteFence(path, keys=keys, cluster_id=cluster_id, busy_timeout_ms=30_000)
        if mutant == "fencing-off":
            self.fence.fence_rule = accept_everything
        elif mutant == "strict-greater":
            self.fence.fence_rule = reject_equal
        else:
            assert mutant in (None, "check-then-write", "op-ids-off"), mutant
        self._engine: Any = None
        if sqlalchemy:
            import sqlalchemy as sa

            self._engine = sa.create_engine(f"sqlite:///{path}", poolclass=sa.pool.NullPool,
                                            connect_args={"timeout": 30, "check_same_thread": False})

    # -- one unit ----------------------------------------------------------------------------------

    @contextmanager
    def _unit(self, fence: SQLiteFence, scope: str, token: Any, op_id: str | None = None) -> Iterator[SQLUnit]:
        if not self.sqlalchemy:
            with fence.fenced(token, scope=scope, op_id=op_id) as conn:
                yield SQLUnit(conn.execute, scope, self.value_bytes_max)
            return
        from sqlalchemy.orm import Session

        with Session(self._engine) as session:
            with fence.fenced_sqlalchemy(session, token, scope=scope, op_id=op_id):
                connection = session.connection()
                yield SQLUnit(connection.exec_driver_sql, scope, self.value_bytes_max)

    def fenced(self, scope: str, token: Any) -> Any:
        if self.mutant == "check-then-write":
            return self._check_then_write(scope, token)
        return self._unit(self.fence, scope, token)

    def fenced_once(self, scope: str, token: Any, op_id: str) -> Any:
        return self._unit(self.fence, scope, token, None if self.mutant == "op-ids-off" else op_id)

    @contextmanager
    def _check_then_write(self, scope: str, token: Any) -> Iterator[Any]:
        checked_token = coerce_token(token)
        decision = decide(checked_token, cluster=self.cluster_id, scope=scope, high_water=self.fence.high_water(scope))
        if isinstance(decision, Reject):
            reject(decision, resource=self.fence.resource, cluster=self.cluster_id, token=checked_token,
                   scope=scope, key=None)
        assert isinstance(decision, Accept)
        accepted = decision
        if self.between_check_and_write is not None:
            self.between_check_and_write()
        harness = self

        class EachStepAlone:
            def write(self, key: str, value: bytes) -> None:
                fence = SQLiteFence(harness.path, keys=harness.keys, cluster_id=harness.cluster_id,
                                    busy_timeout_ms=30_000)
                fence.fence_rule = trusting(accepted)
                try:
                    with harness._unit(fence, scope, checked_token) as unit:
                        unit.write(key, value)
                finally:
                    fence.close()

            def read(self, key: str) -> bytes | None:
                return harness.read(scope, key)

        yield EachStepAlone()

    # -- the optional capability of stockade.testing.conformance.fence_isolation ----------------------

    isolation_levels = ("deferred",)  # a transaction that read before the check (WAL: a snapshot)
    isolation_refusals: tuple[type[BaseException], ...] = (InvalidArgument,)  # fenced() refuses an open one

    @contextmanager
    def fenced_after_read(self, level: str, scope: str, token: Any, between: Callable[[], None]) -> Iterator[Any]:
        assert level == "deferred", level
        if self.sqlalchemy:
            from sqlalchemy.orm import Session

            with Session(self._engine) as session:
                session.connection().exec_driver_sql("SELECT count(*) FROM user_data").fetchall()
                between()
                with self.fence.fenced_sqlalchemy(session, token, scope=scope):
                    yield SQLUnit(session.connection().exec_driver_sql, scope, self.value_bytes_max)
            return
        conn = sqlite3.connect(str(self.path), isolation_level=None, timeout=30)
        try:
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("BEGIN DEFERRED")
            conn.execute("SELECT count(*) FROM user_data").fetchall()  # the read snapshot (WAL) starts here
            between()
            with self.fence.fenced(token, scope=scope, conn=conn):
                yield SQLUnit(conn.execute, scope, self.value_bytes_max)
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.close()

    # -- the harness -------------------------------------------------------------------------------

    def read(self, scope: str, key: str) -> bytes | None:
        row = self.fence.connection.execute(SELECT, (scope, key)).fetchone()
        return None if row is None else bytes(row[0])

    def high_water(self, scope: str) -> int:
        return self.fence.high_water(scope)

    def raise_high_waters(self, floors: Mapping[str, int], *, default: int = 0) -> dict[str, int]:
        return self.fence.raise_high_waters(floors, default=default)

    def state(self) -> Any:
        conn = self.fence.connection
        return (
            self.fence.high_waters(), self.fence.default_floor(),
            conn.execute("SELECT scope, key, value FROM user_data ORDER BY scope, key").fetchall(),
        )

    def clone(self) -> SQLiteDbHarness:
        other = SQLiteDbHarness(self.path, self.cluster_id, self.keys, self.mutant, self.sqlalchemy)
        other.between_check_and_write = self.between_check_and_write
        return other

    def close(self) -> None:
        self.fence.close()
        if self._engine is not None:
            self._engine.dispose()


def make_sqlite_db_harness(path: Path, cluster_id: str, keys: FixedKeys, mutant: str | None,
                           *, sqlalchemy: bool = False) -> SQLiteDbHarness:
    """The suite's factory: a fresh user database under ``path`` (stdlib sqlite3)."""
    database = path / "user.db"
    user_database(database)
    return SQLiteDbHarness(database, cluster_id, keys, mutant, sqlalchemy)


def make_sqlite_db_sqlalchemy_harness(
    path: Path, cluster_id: str, keys: FixedKeys, mutant: str | None
) -> SQLiteDbHarness:
    """The same through SQLAlchemy sessions."""
    return make_sqlite_db_harness(path, cluster_id, keys, mutant, sqlalchemy=True)
