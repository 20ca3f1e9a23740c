"""The SQLite fence's quick path on a WAL file: the check is under the write lock, or the block does not run.

On a WAL connection `fenced` begins deferred, reads the mark in a read snapshot, and then takes
the file's write lock with its raise or `sqlite_db._LOCK` (docs/fence-sqlite.md, "Cost"). Holding
a snapshot, SQLite refuses the lock at once when another connection holds it or committed after
the snapshot; the fence then rolls back and waits for the lock the bounded way (``BEGIN
IMMEDIATE``), reading the mark again. So:

- **A raise committed between the snapshot and the lock is seen**: another connection commits a
  higher token right after the fence's read; the lower token is refused (`StaleToken`) and its
  block never runs. Control: `sqlite_db._LOCK` made a plain read (the lock left to the block's
  own first write): the block runs under the token that was stale by then.
- **A lock held by another connection keeps the block out**: another connection holds the write
  lock through the fenced call; it ends in `BackendUnavailable` (the bounded wait's) before the
  block. Control as above: the block runs and meets "database is locked" in its own statement.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stockade.core.errors import BackendUnavailable, StaleToken
from stockade.core.tokens import FencingToken
from stockade.keys import FixedKeys, ephemeral_keyring
from stockade.resources import sqlite_db
from stockade.resources.sqlite_db import SQLiteFence, install
from stockade.testing.fences.sqlite_db import UPSERT, user_database

CLUSTER = "feedfacefeedface"
KEYS = FixedKeys(ephemeral_keyring(CLUSTER))
ROUNDS = 10


def tok(value: int, scope: str = "a") -> FencingToken:
    return KEYS.sign(FencingToken(CLUSTER, scope, value))


class _AfterRead(sqlite3.Connection):
    """A connection that runs ``after_read`` once, right after the fence's `sqlite_db._READ` returned."""

    after_read: Callable[[], None] | None = None

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        cursor = super().execute(sql, *args)
        if sql == sqlite_db._READ and self.after_read is not None:
            hook, self.after_read = self.after_read, None
            hook()
        return cursor


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "user.db"
    user_database(path)  # WAL
    conn = sqlite3.connect(str(path))
    install(conn, cluster_id=CLUSTER)
    conn.close()
    yield path


@pytest.fixture(params=["fence", "control: the lock left to the block"])
def variant(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param != "fence":
        monkeypatch.setattr(sqlite_db, "_LOCK", "SELECT schema_version FROM stockade_fence WHERE 0")
    return str(request.param)


def test_a_raise_committed_after_the_snapshot_refuses_the_lower_token(db: Path, variant: str) -> None:
    ran = refused = 0
    with SQLiteFence(db, keys=KEYS) as fence, SQLiteFence(db, keys=KEYS) as other:
        conn = sqlite3.connect(str(db), isolation_level=None, factory=_AfterRead)
        try:
            for i in range(ROUNDS):
                low, high = 10 + 2 * i, 11 + 2 * i
                with fence.fenced(tok(low), conn=conn):  # the mark at low: the next one under it is quick
                    conn.execute(UPSERT, ("a", "k", b"low"))

                def overtake(high: int = high) -> None:
                    with other.fenced(tok(high)):
                        other.connection.execute(UPSERT, ("a", "k", b"high"))

                conn.after_read = overtake
                try:
                    with fence.fenced(tok(low), conn=conn):
                        ran += 1
                        conn.execute(UPSERT, ("a", "k", b"stale"))
                except StaleToken:
                    refused += 1
                except sqlite3.OperationalError as exc:  # the control's block, stopped by SQLite itself
                    assert "locked" in str(exc)
                assert not conn.in_transaction
                assert fence.high_water("a") == high
        finally:
            conn.close()
    print(f"{variant}: {ran} of {ROUNDS} blocks ran under a token overtaken after the fence's read; "
          f"{refused} refused")
    if variant == "fence":
        assert (ran, refused) == (0, ROUNDS)
    else:
        assert ran == ROUNDS


def test_a_lock_held_by_another_connection_keeps_the_block_out(db: Path, variant: str) -> None:
    ran = busy = 0
    with SQLiteFence(db, keys=KEYS) as fence:
        conn = sqlite3.connect(str(db), isolation_level=None, timeout=0.05)
        holder = sqlite3.connect(str(db), isolation_level=None)
        try:
            with fence.fenced(tok(10), conn=conn):
                conn.execute(UPSERT, ("a", "k", b"first"))
            for _ in range(ROUNDS):
                holder.execute("BEGIN IMMEDIATE")
                try:
                    with fence.fenced(tok(10), conn=conn):
                        ran += 1
                        conn.execute(UPSERT, ("a", "k", b"while held"))
                except BackendUnavailable:
                    busy += 1
                except sqlite3.OperationalError as exc:  # the control's block
                    assert "locked" in str(exc)
                finally:
                    holder.execute("ROLLBACK")
                assert not conn.in_transaction
        finally:
            holder.close()
            conn.close()
    print(f"{variant}: {ran} of {ROUNDS} blocks ran while another connection held the write lock; {busy} waited "
          f"and gave up")
    if variant == "fence":
        assert (ran, busy) == (0, ROUNDS)
    else:
        assert ran == ROUNDS
