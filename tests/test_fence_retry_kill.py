"""A writer killed with SIGKILL around its commits, restarted, retrying with the same token and operation id.

PostgreSQL and SQLite (docs/fence-postgres.md, docs/fence-sqlite.md, "Retries"). The writer
(tests/helpers/retry_writer.py) is a real process: each operation inserts one row in a fenced
transaction; it prints ``commit i`` just before the commit and ``committed i`` once it returned,
and waits for the test's answer after each. The test answers every line in turn (so that a busy
machine cannot put it behind a writer that has already finished) and kills it at a random moment
after one answer (before the commit was sent, during it, or after it landed and before the writer
recorded that it had). Restarted, the writer
retries the operation whose outcome it does not know with the same token and the same id.
Applications are counted from the data: rows per operation. With operation ids, 0 operations
are applied twice; the control (the same writer without ids) applies some twice.

``STOCKADE_LONG=1`` runs 300 kills per adapter, the control too (the figures); by default 8, and the
control stops at its first operation applied twice (at most 40 kills).
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from stockade.core.tokens import FencingToken
from stockade.keys import KeyFile, create_keyring
from stockade.resources import postgres, sqlite_db
from stockade.testing.servers.postgres import available, drop_database, fresh_database, shared_server

ROOT = Path(__file__).resolve().parent.parent
WRITER = Path(__file__).resolve().parent / "helpers" / "retry_writer.py"
LONG = os.environ.get("STOCKADE_LONG") == "1"
KILLS = 300 if LONG else 8
CONTROL_KILLS_MAX = 300 if LONG else 40
CLUSTER = "c0ffee00c0ffee00"
KILL_DELAY_S_MAX = 0.004  # the kill lands within this after an answer: around the commit and its record
WAIT_S = 60.0


def _writer(kind: str, target: str, token: str, keyring: Path, journal: Path, ops: int, op_ids: bool
            ) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, str(WRITER), kind, target, token, str(keyring), str(journal), str(ops),
         "1" if op_ids else "0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _run(kind: str, target: str, tmp_path: Path, op_ids: bool, kills: int, seed: int, *,
         until_doubled: bool = False) -> dict[str, int]:
    """Kill the writer ``kills`` times around its commits, then let it finish; count applications per op.

    ``until_doubled``: stop killing once an operation was applied twice (the control's short form).
    """
    rng = random.Random(seed)
    keyring = tmp_path / "keyring"
    if not keyring.exists():
        create_keyring(keyring, CLUSTER)
    token = KeyFile(keyring).sign(FencingToken(CLUSTER, "acct", 7)).encode()
    journal = tmp_path / f"journal-{op_ids}"
    ops = 8 * kills  # at most one kill per operation: each one's window is around its own commit
    killed = 0
    while True:
        writer = _writer(kind, target, token, keyring, journal, ops, op_ids)
        assert writer.stdout is not None and writer.stdin is not None
        victim = killed < kills
        for line in writer.stdout:
            if not line.startswith("commit"):  # "commit i" or "committed i": the writer waits for an answer
                continue
            kill = victim and rng.random() < 0.25
            try:
                writer.stdin.write("go\n")
                writer.stdin.flush()
            except BrokenPipeError:
                break
            if kill:
                time.sleep(rng.uniform(0, KILL_DELAY_S_MAX))
                writer.send_signal(signal.SIGKILL)
                killed += 1
                break
        writer.wait(WAIT_S)
        if writer.returncode != -signal.SIGKILL:
            assert writer.returncode == 0, writer.stderr.read() if writer.stderr else ""
            break
        if until_doubled and any(n > 1 for n in _count(kind, target).values()):
            kills = killed  # the retry that doubled ran in the process just killed: enough
    counts = _count(kind, target)
    return {"ops": ops, "kills": killed, "applied twice": sum(1 for n in counts.values() if n > 1),
            "lost": sum(1 for i in range(ops) if counts.get(i, 0) == 0)}


def _count(kind: str, target: str) -> dict[int, int]:
    if kind == "postgres":
        with psycopg.connect(target, autocommit=True) as conn:
            rows = conn.execute("SELECT op, count(*) FROM applied GROUP BY op").fetchall()
    else:
        conn = sqlite3.connect(target)
        try:
            rows = conn.execute("SELECT op, count(*) FROM applied GROUP BY op").fetchall()
        finally:
            conn.close()
    return {int(op): int(n) for op, n in rows}


def _postgres(tmp_path: Path) -> tuple[str, Callable[[], None]]:
    if not available():
        pytest.skip("PostgreSQL 15 is not installed")
    server = shared_server()
    name = fresh_database(server)
    keyring = tmp_path / "keyring"
    create_keyring(keyring, CLUSTER)
    with psycopg.connect(server.dsn_of(name), autocommit=True) as conn:
        postgres.install(conn, keys=KeyFile(keyring))
        conn.execute("CREATE TABLE applied (op int NOT NULL)")
    return server.dsn_of(name), lambda: drop_database(server, name)


def _sqlite(tmp_path: Path) -> tuple[str, Callable[[], None]]:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE applied (op INTEGER NOT NULL)")
    sqlite_db.install(conn, cluster_id=CLUSTER)
    conn.close()
    return str(path), lambda: None


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
@pytest.mark.parametrize("op_ids", [True, False], ids=["op-ids", "control-no-op-ids"])
def test_a_writer_killed_around_its_commit_and_retrying_applies_each_operation_once(
        tmp_path: Path, kind: str, op_ids: bool) -> None:
    target, cleanup = (_postgres if kind == "postgres" else _sqlite)(tmp_path)
    seed = random.randrange(2**32)
    try:
        if op_ids:
            result = _run(kind, target, tmp_path, True, KILLS, seed)
        else:
            result = _run(kind, target, tmp_path, False, CONTROL_KILLS_MAX, seed, until_doubled=not LONG)
    finally:
        cleanup()
    print(f"{kind}, {'op ids' if op_ids else 'control, no op ids'} (seed {seed}): "
          f"{result['applied twice']} of {result['kills']} retried operations applied twice, "
          f"{result['lost']} of {result['ops']} lost")
    assert result["lost"] == 0
    if op_ids:
        assert result["kills"] == KILLS and result["applied twice"] == 0
    else:
        assert result["applied twice"] > 0, "the control should apply some retried operations twice"
