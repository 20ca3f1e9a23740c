"""What a writer frozen inside `fenced` holds up in the user's SQLite file (docs/fence-sqlite.md, "A paused writer").

A writer process (tests/helpers/sqlite_db_frozen.py) stops itself with SIGSTOP
inside its fenced transaction, holding SQLite's write lock. While it is stopped
(read from /proc, not slept for), this process opens a fenced transaction with a
newer token on its own connection, whose busy timeout is `BOUND_MS`:

- SQLite cannot take a lock from another process, so the newer holder cannot
  get in: it raises `BackendUnavailable` (``certain_no_effect``) within its
  connection's busy timeout plus `SLACK_MS`, counted per round, and the error
  names the file and says that a writer inside its transaction holds it (not a
  bare "database is locked");
- continued, the frozen writer commits (its lower token was admitted before the
  newer one came, R6: whole, before it); the newer holder's next try then lands.

Control (``sqlite_db.bounded_waits`` off, as `fenced` was): SQLite's busy
handler alone; its error says "database is locked" and nothing more.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.stopped import read_line as _read_line
from helpers.stopped import stopped as _stopped

from stockade.core.errors import BackendUnavailable
from stockade.core.tokens import FencingToken
from stockade.keys import FixedKeys, ephemeral_keyring, save_keyring
from stockade.resources import sqlite_db
from stockade.resources.sqlite_db import fenced, install
from stockade.testing.fences.sqlite_db import UPSERT, user_database

ROOT = Path(__file__).resolve().parent.parent
HELPER = str(ROOT / "tests" / "helpers" / "sqlite_db_frozen.py")
LONG = os.environ.get("STOCKADE_LONG") == "1"
ROUNDS = 30 if LONG else 4
CONTROL_ROUNDS = 10 if LONG else 2
BOUND_MS = 500  # the newer holder's connection's busy timeout: its own stated bound
SLACK_MS = 300  # the stated slack: a loaded host's scheduling
CLUSTER = "feedfacefeedface"
KEYS = FixedKeys(ephemeral_keyring(CLUSTER))
SCOPE = "orders"

if not sys.platform.startswith("linux"):
    pytest.skip("reads a stopped process's state from /proc", allow_module_level=True)


def _tok(value: int) -> FencingToken:
    return KEYS.sign(FencingToken(CLUSTER, SCOPE, value))


def run_rounds(tmp_path: Path, rounds: int) -> dict[str, int]:
    path = tmp_path / "user.db"
    user_database(path)
    with sqlite3.connect(str(path)) as setup:
        install(setup, cluster_id=CLUSTER)
    save_keyring(tmp_path / "coord.keys", KEYS.keyring)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
    writer = subprocess.Popen([sys.executable, HELPER, str(path), str(tmp_path / "coord.keys")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert writer.stdin is not None
    newer = sqlite3.connect(str(path), isolation_level=None, timeout=BOUND_MS / 1000)
    within = said_why = paused_committed = newer_after = 0
    slowest_ms = 0.0
    try:
        for round_ in range(1, rounds + 1):
            older, newest = _tok(10 * round_), _tok(10 * round_ + 5)
            writer.stdin.write(older.encode() + "\n")
            writer.stdin.flush()
            assert _read_line(writer) == f"frozen {older.value}"
            while not _stopped(writer.pid):  # the SIGSTOP it sent itself has taken effect
                time.sleep(0.001)
            began = time.monotonic()
            with pytest.raises(BackendUnavailable) as refused:
                with fenced(newer, newest, keys=KEYS):
                    newer.execute(UPSERT, (SCOPE, f"newer-{round_}", b"y"))
            took_ms = (time.monotonic() - began) * 1000
            assert refused.value.certain_no_effect and _stopped(writer.pid)
            within += took_ms <= BOUND_MS + SLACK_MS
            said_why += "held by another connection" in str(refused.value) and str(path) in str(refused.value)
            slowest_ms = max(slowest_ms, took_ms)
            writer.send_signal(signal.SIGCONT)
            paused_committed += _read_line(writer) == f"committed {older.value}"
            with fenced(newer, newest, keys=KEYS):  # the frozen one is gone from the lock: the newer gets in
                newer.execute(UPSERT, (SCOPE, f"newer-{round_}", b"y"))
            newer_after += 1
    finally:
        writer.kill()
        writer.wait()
        newer.close()
    print(f"bounded_waits={sqlite_db.bounded_waits}: {rounds} freezes: the newer holder refused within {BOUND_MS} + "
          f"{SLACK_MS} ms {within} of {rounds} (slowest {slowest_ms:.0f} ms), its error saying what holds it up "
          f"{said_why} of {rounds}; the frozen writer, continued, committed {paused_committed} of {rounds}; the "
          f"newer holder's next try landed {newer_after} of {rounds}; last error: {refused.value}")
    return {"within": within, "said_why": said_why, "paused_committed": paused_committed, "newer_after": newer_after}


def test_a_newer_holder_behind_a_frozen_writer_is_refused_at_its_bound_saying_why(tmp_path: Path) -> None:
    counts = run_rounds(tmp_path, ROUNDS)
    assert counts["within"] >= ROUNDS - ROUNDS // 10  # all 4 here; the tenth is the loaded host's margin
    assert counts["said_why"] == ROUNDS
    assert counts["paused_committed"] == counts["newer_after"] == ROUNDS  # SQLite cannot end the frozen one


def test_control_sqlites_busy_handler_alone_says_only_database_is_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_db, "bounded_waits", False)
    counts = run_rounds(tmp_path, CONTROL_ROUNDS)
    assert counts["said_why"] == 0
