"""What a writer frozen inside an append holds up on the PostgreSQL shard log, with the fence's defaults (L1).

A writer process appends a batch to shard ``kv.shard-p`` under token 7 and
stops itself with SIGSTOP after the entries' insert, before its COMMIT: it
holds the shard's row lock in an open transaction. While it stays stopped, a
newer writer appends to the same shard under token 8, and an honest writer
appends to another shard. The log is installed as `open_postgres_log` installs
it (the fence's supersession, `supersede_after_ms` 2,000 ms by default; the
database's ``idle_in_transaction_session_timeout`` is left at its default,
off), the test's role a superuser, so the fence may end the paused session.

What is held (docs/frozen.md): the other shard's append is not delayed; the
newer writer's append lands within `supersede_after_ms` + `SLACK_MS`, while
the writer is still stopped; the resumed writer's batch fails (nothing of it
in the log). The control installs the fence with supersession out of reach
(60 s, as the log's idle-timeout test does): the newer writer still waits
when the test gives up at 4 times the bound.

``STOCKADE_LONG=1`` runs 10 rounds; the default runs 1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from stockade.recipes.log import READ_LIMIT_MAX, open_postgres_log
from stockade.resources import postgres as pg
from stockade.testing.conformance.fence import KEYS, tok
from stockade.testing.servers.postgres import available, drop_database, fresh_database, shared_server

ROOT = Path(__file__).resolve().parent.parent
HELPER = str(ROOT / "tests" / "helpers" / "shardlog_writer.py")
ROUNDS = 10 if os.environ.get("STOCKADE_LONG") == "1" else 1
SUPERSEDE_AFTER_MS = 2_000  # the default of `install`
SLACK_MS = 1_500  # the ended session's exit, the newer append's own round trips, a loaded 2-core host

if not available():
    if os.environ.get("CI") == "true":
        raise RuntimeError("PostgreSQL 15 is not installed (scripts/test.sh installs it)")
    pytest.skip("PostgreSQL 15 is not installed", allow_module_level=True)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests" / "helpers")])
    return env


def _round(supersede_after_ms: int) -> dict[str, object]:
    server = shared_server()
    name = fresh_database(server)
    try:
        log = open_postgres_log(server.dsn_of(name), keys=KEYS)  # installs the fence with its defaults
        with psycopg.connect(server.dsn_of(name), autocommit=True) as conn:  # then the round's bound
            pg.install(conn, keys=KEYS, supersede_after_ms=supersede_after_ms)
        paused = subprocess.Popen([sys.executable, HELPER, "pause-in-append", server.url(name), "kv.shard-p",
                                   tok(7, "kv.shard-p").encode()], stdout=subprocess.PIPE, text=True, env=_env())
        try:
            assert paused.stdout is not None
            assert paused.stdout.readline().strip() == "paused"
            began = time.monotonic()
            other = log.append("kv.shard-q", b"other", token=tok(3, "kv.shard-q"))  # another shard, meanwhile
            other_ms = round((time.monotonic() - began) * 1000)
            done = threading.Event()

            def newer() -> None:
                log.append("kv.shard-p", b"next", token=tok(8, "kv.shard-p"))
                done.set()

            threading.Thread(target=newer, daemon=True).start()
            landed = done.wait(4 * SUPERSEDE_AFTER_MS / 1000)  # while the writer is still stopped
            newer_ms = round((time.monotonic() - began) * 1000)
            paused.send_signal(signal.SIGCONT)
            done.wait(30)
            outcome = paused.stdout.readline().strip()
            entries = [entry.data for entry in log.read("kv.shard-p", 0, READ_LIMIT_MAX)]
        finally:
            if paused.poll() is None:
                paused.send_signal(signal.SIGCONT)
                paused.kill()
            paused.wait()
            log.close()
        return {"other_ms": other_ms, "other_offset": other.first_offset, "landed_while_stopped": landed,
                "newer_ms": newer_ms, "paused": outcome, "entries": entries}
    finally:
        drop_database(server, name)


def _rounds(rounds: int, supersede_after_ms: int) -> dict[str, int]:
    counts = {"rounds": 0, "other_in_time": 0, "newer_in_bound": 0, "paused_failed": 0, "slowest_newer_ms": 0}
    for n in range(rounds):
        seen = _round(supersede_after_ms)
        print(f"round {n} supersede_after_ms={supersede_after_ms}: {seen}")
        counts["rounds"] += 1
        counts["other_in_time"] += seen["other_offset"] == 0 and int(seen["other_ms"]) <= SLACK_MS  # type: ignore[call-overload]
        counts["newer_in_bound"] += bool(seen["landed_while_stopped"]) and int(seen["newer_ms"]) <= (  # type: ignore[call-overload]
            SUPERSEDE_AFTER_MS + SLACK_MS)
        counts["paused_failed"] += str(seen["paused"]).startswith("failed") and seen["entries"] == [b"next"]
        counts["slowest_newer_ms"] = max(counts["slowest_newer_ms"], int(seen["newer_ms"]))  # type: ignore[call-overload]
    print(f"PostgreSQL shard log, writer frozen inside an append (supersede_after_ms={supersede_after_ms}): other "
          f"shard's append in time {counts['other_in_time']} of {rounds}; newer writer landed while it was stopped, "
          f"within {SUPERSEDE_AFTER_MS + SLACK_MS} ms, {counts['newer_in_bound']} of {rounds} (slowest "
          f"{counts['slowest_newer_ms']} ms); resumed writer's batch failed, nothing of it kept "
          f"{counts['paused_failed']} of {rounds}")
    return counts


def test_a_frozen_appender_holds_its_shard_no_longer_than_the_supersession_bound() -> None:
    counts = _rounds(ROUNDS, SUPERSEDE_AFTER_MS)
    assert counts["other_in_time"] == ROUNDS
    assert counts["newer_in_bound"] == ROUNDS
    assert counts["paused_failed"] == ROUNDS


def test_control_without_supersession_the_shard_waits_for_the_whole_freeze() -> None:
    counts = _rounds(1, 60_000)
    assert counts["other_in_time"] == 1
    assert counts["newer_in_bound"] == 0
