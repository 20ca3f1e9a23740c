"""The SQLite fence's work per transaction, as counts (rule L3), and what its handle remembers (nothing of the mark).

- **Statements per fenced transaction**, counted by the connection's trace
  callback (every statement SQLite runs for it, the pragma function's own
  included), the user's statements left out: `SAME_TOKEN_STATEMENTS` under a
  lease's current token on a WAL file (the journal mode read before
  ``BEGIN``; one ``SELECT`` of the fence row, the mark and ``synchronous``,
  whose pragma function traces one statement; `sqlite_db._LOCK`, which takes
  the write lock; ``COMMIT``), as many with a new token (the raise takes the
  lock instead). Controls exceed the budget: the mark read again in a
  statement of its own (what a second look at the mark would add); the quick
  path off (every transaction waits for the lock the bounded way, its
  ``busy_timeout`` read, set and put back around ``BEGIN IMMEDIATE``).
- **A handle remembers tokens, never marks**: `SQLiteFence` remembers for one
  second the tokens whose MAC verified; the mark, the fence row and the
  settings are read in every transaction. A token remembered by the handle is
  refused once another connection raised the mark past it, every round.
  Control: a handle that remembers each scope's fence row (a cache without
  invalidation) lets the stale token through.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stockade.core.errors import StaleToken
from stockade.core.tokens import FencingToken
from stockade.keys import FixedKeys, ephemeral_keyring
from stockade.resources import sqlite_db
from stockade.resources.sqlite_db import SQLiteFence, install
from stockade.testing.fences.sqlite_db import UPSERT, user_database

CLUSTER = "feedfacefeedface"
KEYS = FixedKeys(ephemeral_keyring(CLUSTER))
WRITES = 10
SAME_TOKEN_STATEMENTS = 6  # the budget (see the module docstring); measure with benchmarks/fence_files.py
NEW_TOKEN_STATEMENTS = 6


def tok(value: int, scope: str = "a") -> FencingToken:
    return KEYS.sign(FencingToken(CLUSTER, scope, value))


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "user.db"
    user_database(path)
    conn = sqlite3.connect(str(path))
    install(conn, cluster_id=CLUSTER)
    conn.close()
    yield path


def _statements_per_write(fence: SQLiteFence, conn: sqlite3.Connection, *, new_token: bool) -> float:
    traced: list[str] = []
    conn.set_trace_callback(traced.append)
    try:
        for i in range(WRITES):
            with fence.fenced(tok(10 + i if new_token else 9), conn=conn):
                conn.execute(UPSERT, ("a", "k", b"v%d" % i))
    finally:
        conn.set_trace_callback(None)
    user = sum(1 for statement in traced if statement.startswith("INSERT INTO user_data"))
    assert user == WRITES
    return (len(traced) - user) / WRITES


@pytest.mark.parametrize("variant", ["fence", "control: the mark read twice", "control: no quick path"])
def test_statements_per_fenced_transaction_within_the_budget(
    db: Path, monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    if variant == "control: no quick path":  # every transaction the bounded way, as before the quick path
        monkeypatch.setattr(sqlite_db, "quick_path", False)
    elif variant != "fence":
        admit = sqlite_db._Admission.admit

        def read_twice(self: Any, execute: Any, token: FencingToken, scope: str, *args: Any, **kw: Any) -> int:
            execute("SELECT high_water FROM stockade_high_water WHERE scope = ?", (scope,)).fetchone()
            return admit(self, execute, token, scope, *args, **kw)

        monkeypatch.setattr(sqlite_db._Admission, "admit", read_twice)
    with SQLiteFence(db, keys=KEYS) as fence:
        conn = sqlite3.connect(str(db), isolation_level=None)
        try:
            with fence.fenced(tok(9), conn=conn):  # the mark at 9 before counting
                pass
            same = _statements_per_write(fence, conn, new_token=False)
            new = _statements_per_write(fence, conn, new_token=True)
        finally:
            conn.close()
    print(f"{variant}: {same} statements per fenced transaction under one token, {new} with a new token each")
    within = same <= SAME_TOKEN_STATEMENTS and new <= NEW_TOKEN_STATEMENTS
    if variant == "fence":
        assert within, (f"{same} / {new} statements per fenced transaction, budget {SAME_TOKEN_STATEMENTS} / "
                        f"{NEW_TOKEN_STATEMENTS} (benchmarks/fence_files.py measures what each costs)")
    else:
        assert not within


class _RemembersTheFenceRow(SQLiteFence):
    """The control: a handle that remembers each scope's first fence row (mark included) and never reads it again."""

    def _admission(self, resource: str | None = None) -> Any:
        admission = super()._admission(resource or self.resource)  # a fresh one: its admit is replaced below
        rows: dict[str, Any] = self.__dict__.setdefault("_rows", {})

        def execute(sql: str, params: tuple[Any, ...]) -> Any:
            cursor = self.connection.execute(sql, params)
            if sql != sqlite_db._READ:
                return cursor
            row = rows.setdefault(params[0], cursor.fetchone())
            return type("Row", (), {"fetchone": lambda _self: row})()

        admit = admission.admit
        admission.admit = lambda _execute, *args, **kw: admit(execute, *args, **kw)  # type: ignore[method-assign]
        return admission


@pytest.mark.parametrize("handle", [SQLiteFence, _RemembersTheFenceRow])
def test_a_remembered_token_is_refused_once_another_connection_raised_the_mark(
    db: Path, handle: type[SQLiteFence]
) -> None:
    rounds = 10
    admitted = 0
    with handle(db, keys=KEYS) as fence, SQLiteFence(db, keys=KEYS) as other:
        for i in range(rounds):
            low, high = 10 + 2 * i, 11 + 2 * i
            with fence.fenced(tok(low)):  # remembered by the handle from here on
                fence.connection.execute(UPSERT, ("a", "k", b"low"))
            with other.fenced(tok(high)):
                other.connection.execute(UPSERT, ("a", "k", b"high"))
            try:
                with fence.fenced(tok(low)):
                    fence.connection.execute(UPSERT, ("a", "k", b"stale"))
                admitted += 1
            except StaleToken:
                pass
    print(f"{handle.__name__}: {admitted} of {rounds} remembered tokens admitted after another connection's raise")
    if handle is SQLiteFence:
        assert admitted == 0
    else:
        assert admitted == rounds
