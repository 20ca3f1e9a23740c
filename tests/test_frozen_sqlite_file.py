"""What a writer frozen inside its fenced transaction holds up on a user's own SQLite file (rule L1).

A writer process opens ``fenced(conn, token 2)`` on scope ``a``, writes a row
and stops itself with SIGSTOP before the block ends: it holds the file's write
lock (``BEGIN IMMEDIATE``). While it stays stopped (it is resumed only after
the others have answered: order, not a sleep), a newer holder of ``a``
(token 3) and an honest writer of another scope ``b`` each open their own
fenced transaction on connections whose busy timeout is `BUSY_MS`.

What is held is what docs/frozen.md says SQLite allows: both get a typed
``BackendUnavailable`` (``certain_no_effect``) within `BUSY_MS` + `SLACK_MS`,
never a hang, and nothing of theirs is applied; the frozen writer, resumed,
commits (nobody could raise the mark meanwhile). The whole file waits for the
whole freeze: SQLite cannot take a write lock away from a stopped process.
The control: a connection with the stdlib's default 5 s timeout waits 5 s.

``STOCKADE_LONG=1`` runs 20 rounds; the default runs 2.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import stockade
from stockade.core.tokens import FencingToken
from stockade.keys import FixedKeys, create_keyring, load_keyring
from stockade.resources.sqlite_db import fenced, install
from stockade.testing.fences.sqlite_db import UPSERT, user_database

CLUSTER = "feedfacefeedface"
ROUNDS = 20 if os.environ.get("STOCKADE_LONG") == "1" else 2
BUSY_MS = 1_000
SLACK_MS = 500

_WRITER = """
import os, signal, sqlite3, sys
import stockade
from stockade.core.tokens import FencingToken
from stockade.keys import FixedKeys, load_keyring
from stockade.resources.sqlite_db import fenced
keys = FixedKeys(load_keyring(sys.argv[2]))
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
try:
    with fenced(conn, keys.sign(FencingToken("feedfacefeedface", "a", 2)), keys=keys):
        conn.execute("INSERT INTO user_data (scope, key, value) VALUES ('a', 'k', x'02')"
                     " ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value")
        os.kill(os.getpid(), signal.SIGSTOP)  # inside the fenced transaction: the write lock is held
    print("committed", flush=True)
except stockade.StockadeError as exc:
    print(type(exc).__name__, flush=True)
"""


def _wait_stopped(pid: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        waited, status = os.waitpid(pid, os.WUNTRACED | os.WNOHANG)
        if waited and os.WIFSTOPPED(status):
            return
        assert not waited, f"the writer ended instead of stopping: {status}"
        time.sleep(0.005)
    raise AssertionError("the writer never stopped")


def _try(path: Path, keys: FixedKeys, scope: str, value: int, timeout_s: float) -> tuple[str, int, bool]:
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=timeout_s)
    began = time.monotonic()
    try:
        with fenced(conn, keys.sign(FencingToken(CLUSTER, scope, value)), keys=keys):
            conn.execute(UPSERT, (scope, "k", bytes([value])))
        outcome, no_effect = "committed", False
    except stockade.BackendUnavailable as exc:
        outcome, no_effect = "BackendUnavailable", exc.certain_no_effect
    finally:
        conn.close()
    return outcome, round((time.monotonic() - began) * 1000), no_effect


def _rounds(tmp_path: Path, rounds: int, timeout_s: float) -> dict[str, int]:
    create_keyring(tmp_path / "coord.keys", CLUSTER)
    keys = FixedKeys(load_keyring(tmp_path / "coord.keys"))
    counts = {"rounds": 0, "typed_in_bound": 0, "slowest_ms": 0, "applied_meanwhile": 0, "frozen_committed": 0}
    script = textwrap.dedent(_WRITER)
    for n in range(rounds):
        path = tmp_path / f"user-{n}.db"
        user_database(path)
        setup = sqlite3.connect(str(path), isolation_level=None)
        install(setup, cluster_id=CLUSTER)
        setup.close()
        writer = subprocess.Popen([sys.executable, "-c", script, str(path), str(tmp_path / "coord.keys")],
                                  stdout=subprocess.PIPE, text=True)
        try:
            _wait_stopped(writer.pid)
            newer = _try(path, keys, "a", 3, timeout_s)  # the next holder of the frozen writer's scope
            other = _try(path, keys, "b", 1, timeout_s)  # an honest writer of another scope in the same file
            os.kill(writer.pid, signal.SIGCONT)
            out, _ = writer.communicate(timeout=60)
        finally:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
        counts["rounds"] += 1
        for outcome, ms, no_effect in (newer, other):
            counts["typed_in_bound"] += outcome == "BackendUnavailable" and no_effect and ms <= BUSY_MS + SLACK_MS
            counts["applied_meanwhile"] += outcome == "committed"
            counts["slowest_ms"] = max(counts["slowest_ms"], ms)
        counts["frozen_committed"] += out.strip() == "committed"
        print(f"round {n}: newer {newer}, other scope {other}, frozen writer {out.strip()}")
    print(f"user's SQLite file, writer frozen inside fenced() ({timeout_s * 1000:.0f} ms busy timeout): typed "
          f"BackendUnavailable within {BUSY_MS + SLACK_MS} ms {counts['typed_in_bound']} of {2 * rounds} (slowest "
          f"{counts['slowest_ms']} ms), applied while frozen {counts['applied_meanwhile']} of {2 * rounds}, frozen "
          f"writer committed on resume {counts['frozen_committed']} of {rounds}")
    return counts


def test_a_frozen_writer_holds_the_whole_file_and_the_others_get_a_typed_error_within_their_timeout(
    tmp_path: Path,
) -> None:
    counts = _rounds(tmp_path, ROUNDS, BUSY_MS / 1000)
    assert counts["typed_in_bound"] == 2 * ROUNDS
    assert counts["applied_meanwhile"] == 0
    assert counts["frozen_committed"] == ROUNDS


@pytest.mark.parametrize("timeout_s", [5.0], ids=["stdlib-default-timeout"])
def test_control_the_wait_is_the_connections_own_timeout(tmp_path: Path, timeout_s: float) -> None:
    counts = _rounds(tmp_path, 1, timeout_s)
    assert counts["typed_in_bound"] == 0
    assert counts["slowest_ms"] >= timeout_s * 1000
