"""The fence on a user's own SQLite file: what the conformance suite cannot see.

- A writer *process* SIGSTOPped inside its fenced transaction holds SQLite's
  write lock (BEGIN IMMEDIATE): a higher token's transaction waits, and the
  paused one commits whole before it (control: check-then-write).
- Connections in every isolation mode work; one already in a transaction, in
  Python 3.12's ``autocommit=False`` mode, or with settings that are not
  durable is refused with a clear error, and nothing changes.
- `install` is idempotent and refuses another cluster; a block that commits
  the transaction itself is an error; SQLAlchemy sessions and connections.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from helpers.fence_files import paused_rounds

import stockade
from stockade.core.errors import InvalidArgument, StaleToken
from stockade.core.tokens import FencingToken
from stockade.core.values import FenceFloors
from stockade.keys import FixedKeys, KeyFile, create_keyring, ephemeral_keyring
from stockade.resources.sqlite_db import SQLiteFence, fenced, fenced_sqlalchemy, install
from stockade.testing.fences.sqlite_db import UPSERT, USER_TABLE, user_database

CLUSTER = "feedfacefeedface"
KEYS = FixedKeys(ephemeral_keyring(CLUSTER))
PAUSED_ROUNDS = 20 if os.environ.get("STOCKADE_LONG") == "1" else 5


def tok(value: int, scope: str = "a") -> FencingToken:
    return KEYS.sign(FencingToken(CLUSTER, scope, value))


def rows(path: Path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(str(path))
    try:
        return conn.execute("SELECT scope, key, value FROM user_data ORDER BY 1, 2").fetchall()
    finally:
        conn.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "user.db"
    user_database(path)
    conn = sqlite3.connect(str(path))
    install(conn, cluster_id=CLUSTER)
    conn.close()
    return path


def test_a_paused_writer_process_holds_off_a_higher_token_and_commits_whole_before_it(tmp_path: Path) -> None:
    create_keyring(tmp_path / "coord.keys", CLUSTER)
    results = paused_rounds("sqlite-db", tmp_path, KeyFile(tmp_path / "coord.keys"), PAUSED_ROUNDS)
    assert results["none"] == 0, f"interleavings {results['none']} of {PAUSED_ROUNDS}"
    assert results["check-then-write"] > 0, "the control was not caught"


@pytest.mark.parametrize("isolation_level", [None, "DEFERRED", "IMMEDIATE", "EXCLUSIVE"])
def test_every_isolation_level_runs_one_fenced_transaction(db: Path, isolation_level: str | None) -> None:
    conn = sqlite3.connect(str(db), isolation_level=isolation_level)
    with fenced(conn, tok(2), keys=KEYS):
        conn.execute(UPSERT, ("a", "k", b"1"))
        conn.execute(UPSERT, ("a", "j", b"1"))
    assert not conn.in_transaction
    with pytest.raises(StaleToken):
        with fenced(conn, tok(1), keys=KEYS):
            conn.execute(UPSERT, ("a", "k", b"stale"))
    with pytest.raises(RuntimeError):
        with fenced(conn, tok(3), keys=KEYS):
            conn.execute(UPSERT, ("a", "k", b"3"))
            raise RuntimeError("the caller failed")
    conn.close()
    assert rows(db) == [("a", "j", b"1"), ("a", "k", b"1")]
    with SQLiteFence(db, keys=KEYS) as fence:
        assert fence.high_waters() == {"a": 2}


def test_a_connection_inside_a_transaction_is_refused_and_nothing_changes(db: Path) -> None:
    conn = sqlite3.connect(str(db))  # the legacy default: DML begins a transaction implicitly
    conn.execute(UPSERT, ("a", "mine", b"uncommitted"))
    assert conn.in_transaction
    with pytest.raises(InvalidArgument, match="already inside a transaction"):
        with fenced(conn, tok(1), keys=KEYS):
            conn.execute(UPSERT, ("a", "k", b"v"))
    conn.rollback()
    conn.close()
    assert rows(db) == []


def test_settings_that_are_not_durable_are_refused(db: Path) -> None:
    conn = sqlite3.connect(str(db), isolation_level=None)
    conn.execute("PRAGMA synchronous=NORMAL")
    with pytest.raises(InvalidArgument, match="synchronous"):
        with fenced(conn, tok(1), keys=KEYS):
            conn.execute(UPSERT, ("a", "k", b"v"))
    with fenced(conn, tok(1), keys=KEYS, durable=False):  # the caller accepts losing the last commits
        conn.execute(UPSERT, ("a", "k", b"v"))
    conn.close()
    memory_journal = sqlite3.connect(":memory:", isolation_level=None)
    memory_journal.execute(USER_TABLE)
    install(memory_journal, cluster_id=CLUSTER)
    with pytest.raises(InvalidArgument, match="journal_mode"):
        with fenced(memory_journal, tok(1), keys=KEYS):
            pass


def test_install_is_idempotent_and_refuses_another_cluster(db: Path) -> None:
    conn = sqlite3.connect(str(db), isolation_level=None)
    install(conn, cluster_id=CLUSTER)
    with pytest.raises(InvalidArgument, match="fenced for cluster"):
        install(conn, cluster_id="0000000000000001")
    other = FixedKeys(ephemeral_keyring("0000000000000001"))
    with pytest.raises(InvalidArgument, match="fenced for cluster"):
        with fenced(conn, other.sign(FencingToken("0000000000000001", "a", 1)), keys=other):
            pass
    conn.close()
    assert rows(db) == []


def test_a_block_that_commits_itself_is_an_error(db: Path) -> None:
    conn = sqlite3.connect(str(db))
    with pytest.raises(InvalidArgument, match="ended the fenced transaction"):
        with fenced(conn, tok(1), keys=KEYS):
            conn.execute(UPSERT, ("a", "k", b"v"))
            conn.commit()
    conn.close()


def test_the_floor_takes_fence_floors_and_never_lowers(db: Path) -> None:
    with SQLiteFence(db, keys=KEYS) as fence:
        with fence.fenced(tok(5)) as conn:
            conn.execute(UPSERT, ("a", "k", b"v"))
        assert fence.raise_high_waters(FenceFloors({"a": 3, "b": 7}, default=4)) == {"a": 5, "b": 7}
        assert fence.high_water("never-seen") == 4 and fence.default_floor() == 4
        with pytest.raises(StaleToken):
            with fence.fenced(tok(3, "c")):
                pass


def test_sqlalchemy_session_and_connection(db: Path) -> None:
    sa = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    engine = sa.create_engine(f"sqlite:///{db}")
    try:
        with Session(engine) as session:
            with fenced_sqlalchemy(session, tok(2), keys=KEYS):
                session.execute(sa.text("INSERT INTO user_data VALUES ('a', 'k', x'01')"))
            session.execute(sa.text("SELECT 1"))  # autobegins a session transaction
            with pytest.raises(InvalidArgument, match="already inside a transaction"):
                with fenced_sqlalchemy(session, tok(2), keys=KEYS):
                    pass
            session.rollback()
            with pytest.raises(StaleToken):
                with fenced_sqlalchemy(session, tok(1), keys=KEYS):
                    session.execute(sa.text("INSERT INTO user_data VALUES ('a', 'z', x'01')"))
        with engine.connect() as connection:
            with fenced_sqlalchemy(connection, tok(3), keys=KEYS):
                connection.execute(sa.text("INSERT INTO user_data VALUES ('a', 'j', x'02')"))
            assert not connection.in_transaction()
    finally:
        engine.dispose()
    assert rows(db) == [("a", "j", b"\x02"), ("a", "k", b"\x01")]


@pytest.mark.parametrize("doc", ["fence-sqlite.md", "fence-files.md"])
def test_the_docs_snippets_run(tmp_path: Path, doc: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The usage snippets of docs/fence-*.md, run in order in one namespace, in tmp_path (their paths,
    ``app-data/...``, are relative)."""
    import re

    text = (Path(__file__).resolve().parent.parent / "docs" / doc).read_text()
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    for snippet in re.findall(r"```python\n(.*?)```", text, re.DOTALL):
        exec(compile(snippet, doc, "exec"), namespace)  # noqa: S102
    for value in namespace.values():
        close = getattr(value, "close", None)
        if isinstance(value, (SQLiteFence, sqlite3.Connection, stockade.Coordinator)) and callable(close):
            close()


def test_the_users_own_errors_pass_through_and_roll_back(db: Path) -> None:
    conn = sqlite3.connect(str(db), isolation_level=None)
    with pytest.raises(sqlite3.IntegrityError):
        with fenced(conn, tok(4), keys=KEYS):
            conn.execute(UPSERT, ("a", "k", b"v"))
            conn.execute("INSERT INTO user_data VALUES ('a', 'k', x'00')")  # the user's constraint
    conn.close()
    assert rows(db) == []
    with SQLiteFence(db, keys=KEYS) as fence:
        assert fence.high_waters() == {}


def test_a_file_that_verified_refuses_unsigned_at_opening_and_admission_and_tokenless_still_opens(db: Path) -> None:
    """L2: the first transaction with keys makes ``stockade_verified``; after it, ``keys="unsigned"`` is refused
    by `SQLiteFence` (opening) and by `fenced` (admission), nothing written; a tokenless handle still opens."""
    conn = sqlite3.connect(str(db), isolation_level=None)
    conn.execute("PRAGMA synchronous=FULL")
    # Never verified: unsigned mode is the caller's choice.
    with fenced(conn, FencingToken(CLUSTER, "a", 1), keys="unsigned", cluster_id=CLUSTER):
        conn.execute(UPSERT, ("a", "k", "unsigned"))
    with fenced(conn, tok(2), keys=KEYS):
        conn.execute(UPSERT, ("a", "k", "signed"))
    assert conn.execute("SELECT count(*) FROM stockade_verified").fetchone() == (1,)
    with pytest.raises(InvalidArgument, match="has verified signed tokens before") as info:
        with fenced(conn, FencingToken(CLUSTER, "a", 9), keys="unsigned", cluster_id=CLUSTER):
            conn.execute(UPSERT, ("a", "k", "forged"))
    assert "\n" not in str(info.value)
    with pytest.raises(InvalidArgument, match="has verified signed tokens before"):
        SQLiteFence(db, keys="unsigned", cluster_id=CLUSTER)
    assert rows(db) == [("a", "k", "signed")]
    with SQLiteFence(db, keys="tokenless", cluster_id=CLUSTER) as floor:  # floors, backups: no token admitted
        assert floor.raise_high_waters({"a": 5}) == {"a": 5}
    conn.close()


def test_a_file_fenced_before_the_memory_keeps_working_and_learns_it(db: Path) -> None:
    """A file installed without ``stockade_verified`` (every file before it) opens unsigned as before, and the
    first transaction with keys adds the table inside that transaction."""
    with SQLiteFence(db, keys="unsigned", cluster_id=CLUSTER) as fence:
        assert fence.connection.execute(
            "SELECT count(*) FROM sqlite_master WHERE name = 'stockade_verified'").fetchone() == (0,)
    with SQLiteFence(db, keys=KEYS) as fence, fence.fenced(tok(3)) as conn:
        conn.execute(UPSERT, ("a", "k", "v"))
    with pytest.raises(InvalidArgument, match="has verified signed tokens before"):
        SQLiteFence(db, keys="unsigned", cluster_id=CLUSTER)
