"""A writer paused inside a PostgreSQL shard-log append does not stall a newer writer (docs/shard-log.md).

A writer process (tests/helpers/shardlog_writer.py ``pause-in-append``) stops
itself with SIGSTOP inside its append's transaction, after the fence admitted
its token and its entries went in, before the COMMIT: it holds the shard's
scope and its head row. The fence is installed with supersession
(``supersede_after_ms`` = `BOUND_MS`; no ``idle_in_transaction_session_timeout``):

- the newer writer's append (a higher token) completes while the paused one is
  still stopped, within `BOUND_MS` plus `SLACK_MS`, counted per round;
- continued, the paused writer's append fails with a fencing error
  (`Superseded`, a `StaleToken`), and nothing of it is in the log.

Control: installed without supersession (as before it existed), the newer
writer is still waiting at 10 times the bound, and the paused writer commits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from stockade.recipes._log_postgres import install_log
from stockade.recipes.log import READ_LIMIT_MAX, open_postgres_log
from stockade.resources import postgres as pg
from stockade.resources.postgres import _sql as q
from stockade.testing.conformance.fence import KEYS, tok
from stockade.testing.servers.postgres import PostgresServer, available

ROOT = Path(__file__).resolve().parent.parent
HELPER = str(ROOT / "tests" / "helpers" / "shardlog_writer.py")
LONG = os.environ.get("STOCKADE_LONG") == "1"
ROUNDS = 20 if LONG else 3
CONTROL_ROUNDS = 5 if LONG else 1
BOUND_MS = 300  # supersede_after_ms: how long a newer token waits for a paused lower holder
SLACK_MS = 1_700  # the stated slack: the ended session's exit and a loaded host's scheduling
SHARD = "kv.shard-p"

if not available():
    pytest.skip("PostgreSQL 15 is not installed", allow_module_level=True)


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests" / "helpers")]))


def _timed_append(log: Any, data: str, token: Any, took: list[float], done: threading.Event) -> None:
    began = time.monotonic()
    log.append(SHARD, data.encode(), token=token)
    took.append(time.monotonic() - began)
    done.set()


def run_rounds(server: PostgresServer, name: str, rounds: int, *, supersede: bool) -> dict[str, object]:
    with psycopg.connect(server.dsn_of(name), autocommit=True) as conn:
        keyring, cluster = pg._keyring_of(KEYS, None)
        pg._install(conn, keyring, cluster, q.STALE_WHEN["decide"], supersede_after_ms=BOUND_MS if supersede else 0)
        install_log(conn)
    log = open_postgres_log(server.dsn_of(name), keys=KEYS, install=False)
    within = 0
    slowest_s = 0.0
    paused_answers: dict[str, int] = {}
    try:
        for round_ in range(1, rounds + 1):
            older, newer = tok(2 * round_, SHARD), tok(2 * round_ + 1, SHARD)
            paused = subprocess.Popen([sys.executable, HELPER, "pause-in-append", server.url(name), SHARD,
                                       older.encode()], stdout=subprocess.PIPE, text=True, env=_env())
            assert paused.stdout is not None
            try:
                assert paused.stdout.readline().strip() == "paused"
                done = threading.Event()
                took: list[float] = []
                thread = threading.Thread(target=_timed_append, args=(log, f"newer {round_}", newer, took, done))
                thread.start()
                done.wait((BOUND_MS + SLACK_MS) / 1000 if supersede else 10 * BOUND_MS / 1000)
                within += done.is_set() and took[0] * 1000 <= BOUND_MS + SLACK_MS
                paused.send_signal(signal.SIGCONT)
                answer = paused.stdout.readline().strip()
                paused_answers[answer] = paused_answers.get(answer, 0) + 1
                thread.join(60)
                slowest_s = max(slowest_s, *took)
            finally:
                paused.kill()
                paused.wait()
        data = [e.data for e in log.read(SHARD, 0, READ_LIMIT_MAX)]
    finally:
        log.close()
    print(f"supersede={supersede}: {rounds} pauses: the newer writer's append done within {BOUND_MS} + {SLACK_MS} ms "
          f"while the older was stopped {within} of {rounds} (slowest {slowest_s * 1000:.0f} ms); the paused "
          f"writers, continued: {paused_answers}; paused entries in the log "
          f"{sum(d.startswith(b'paused') for d in data)}")
    return {"within": within, "answers": paused_answers, "data": data}


def test_a_paused_writer_is_superseded_and_the_newer_append_goes_on(pg_db: tuple[PostgresServer, str]) -> None:
    counts = run_rounds(*pg_db, ROUNDS, supersede=True)
    assert counts["within"] == ROUNDS
    assert counts["answers"] == {"failed Superseded": ROUNDS}
    assert counts["data"] == [f"newer {r}".encode() for r in range(1, ROUNDS + 1)]


def test_control_without_supersession_the_newer_append_waits_for_the_paused_one(
        pg_db: tuple[PostgresServer, str]) -> None:
    counts = run_rounds(*pg_db, CONTROL_ROUNDS, supersede=False)
    assert counts["within"] == 0
    assert counts["answers"] == {"accepted": CONTROL_ROUNDS}
