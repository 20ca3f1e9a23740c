"""One deadline per SQLite shard-log append, whatever holds its file (docs/shard-log.md, "A frozen writer").

A writer process (tests/helpers/shardlog_writer.py ``freeze-in-append``) stops
itself with SIGSTOP inside its append's write transaction, holding its
partition file's write lock. While it is stopped (read from /proc, not slept
for), this process appends to shards of that same file from `THREADS` threads
through one `SQLiteShardLog` (as a service's request threads do), thread i
starting i * `STAGGER_MS` after the first, and times each append. SQLite
cannot take the lock from the stopped process, so each must fail; what is
checked is *when*:

- every append raises `BackendUnavailable` (``certain_no_effect``) within its
  bound, ``busy_timeout_ms`` = `BOUND_MS`, plus `SLACK_MS` for the scheduling
  of a loaded host, counted per append;
- control (``SQLiteStore.bounded_waits`` off, as appends were): each append
  waited up to ``busy_timeout_ms`` for the object's lock, then
  ``busy_timeout_ms`` anew for SQLite's. The second thread gets the object's
  lock when the first gives up, `STAGGER_MS` before its own wait for it ends,
  and then waits a whole bound for SQLite: 2 * `BOUND_MS` - `STAGGER_MS` in
  all, more than `BOUND_MS` + `SLACK_MS` on any host (a lower bound: sleeps
  only ever overrun).

A new process, started while the writer is stopped, opens the log and appends
to a shard of another file (it lands) and to one of the frozen writer's file
(refused within the one bound: opening that file and appending share it).
Control (``SQLiteShardLog.lazy_partitions`` off, as logs were opened): every
partition file is opened, in a write transaction, with the log, so the new
process cannot open the log at all while one file is held.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.stopped import read_line as _read_line
from helpers.stopped import stopped as _stopped

from stockade.core.errors import BackendUnavailable
from stockade.keys import save_keyring
from stockade.recipes.log import SQLiteShardLog, partition_of
from stockade.testing.conformance.fence import CLUSTER, KEYS, tok

ROOT = Path(__file__).resolve().parent.parent
HELPER = str(ROOT / "tests" / "helpers" / "shardlog_writer.py")
LONG = os.environ.get("STOCKADE_LONG") == "1"
ROUNDS = 50 if LONG else 4
CONTROL_ROUNDS = 10 if LONG else 2
OPENER_ROUNDS = 20 if LONG else 3
OPENER_CONTROL_ROUNDS = 10 if LONG else 1
PARTITIONS = 4
THREADS = 3
BOUND_MS = 600  # busy_timeout_ms: the caller's stated bound on one append
SLACK_MS = 300  # the stated slack: a loaded host's scheduling
STAGGER_MS = 200  # thread i starts i * STAGGER_MS after the first; the control's second takes >= 1000 ms
FROZEN = "orders.frozen"

if not sys.platform.startswith("linux"):
    pytest.skip("reads a stopped process's state from /proc", allow_module_level=True)


def _neighbours() -> list[str]:
    """`THREADS` shards in the frozen shard's partition file (the frozen shard itself first)."""
    mine = partition_of(FROZEN, PARTITIONS)
    names = (f"orders.shard-{i}" for i in range(10_000))
    return [FROZEN] + [n for n in names if partition_of(n, PARTITIONS) == mine][: THREADS - 1]


def _timed_append(log: SQLiteShardLog, shard: str, index: int, start: threading.Barrier, took_ms: list[float],
                  errors: list[BaseException]) -> None:
    """One thread's append, `STAGGER_MS` * ``index`` after the others start; its time and its error noted."""
    start.wait()
    time.sleep(index * STAGGER_MS / 1000)
    began = time.monotonic()
    try:
        log.append(shard, b"newer", token=tok(9, shard))
        errors.append(AssertionError(f"{shard}: an append got past a stopped writer's lock"))
    except BackendUnavailable as exc:
        took_ms.append((time.monotonic() - began) * 1000)
        errors.append(exc)


def run_rounds(tmp_path: Path, rounds: int) -> dict[str, int]:
    path = tmp_path / "log.db"
    log = SQLiteShardLog(path, cluster_id=CLUSTER, keys=KEYS, partitions=PARTITIONS, busy_timeout_ms=BOUND_MS)
    save_keyring(tmp_path / "log.keys", KEYS.keyring)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests" / "helpers")]))
    writer = subprocess.Popen([sys.executable, HELPER, "freeze-in-append", f"sqlite:///{path}", FROZEN,
                               tok(5, FROZEN).encode()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    assert writer.stdin is not None
    shards = _neighbours()
    within = late = said_why = 0
    slowest_ms = 0.0
    try:
        for round_ in range(1, rounds + 1):
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert _read_line(writer) == f"frozen {round_}"
            while not _stopped(writer.pid):  # the SIGSTOP it sent itself has taken effect
                time.sleep(0.001)
            start = threading.Barrier(THREADS)
            took_ms: list[float] = []
            errors: list[BaseException] = []
            threads = [threading.Thread(target=_timed_append, args=(log, shard, i, start, took_ms, errors))
                       for i, shard in enumerate(shards)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert _stopped(writer.pid)  # it held its lock all along
            for exc in errors:
                assert isinstance(exc, BackendUnavailable) and exc.certain_no_effect, exc
                said_why += "held by another connection" in str(exc) or "another thread of this process" in str(exc)
            within += sum(ms <= BOUND_MS + SLACK_MS for ms in took_ms)
            late += sum(ms > BOUND_MS + SLACK_MS for ms in took_ms)
            slowest_ms = max([slowest_ms, *took_ms])
            writer.send_signal(signal.SIGCONT)
            assert _read_line(writer) == f"ack {round_} {round_ - 1}"
    finally:
        writer.kill()
        writer.wait()
        log.close()
    attempts = rounds * THREADS
    print(f"bounded_waits={SQLiteShardLog.bounded_waits}: {rounds} freezes x {THREADS} threads: appends done within "
          f"{BOUND_MS} + {SLACK_MS} ms {within} of {attempts}, late {late} of {attempts} (slowest {slowest_ms:.0f} "
          f"ms); errors saying what holds them up {said_why} of {attempts}")
    return {"within": within, "late": late, "attempts": attempts, "said_why": said_why}


def test_an_append_behind_a_frozen_writer_ends_within_its_one_bound(tmp_path: Path) -> None:
    counts = run_rounds(tmp_path, ROUNDS)
    assert counts["within"] + counts["late"] == counts["attempts"]
    assert counts["late"] <= counts["attempts"] // 10  # 0 of 12 here; the tenth is the loaded host's margin
    assert counts["said_why"] == counts["attempts"]


def test_control_two_waits_per_append_overrun_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SQLiteShardLog, "bounded_waits", False)  # the object's lock, then SQLite's: each a bound
    counts = run_rounds(tmp_path, CONTROL_ROUNDS)
    assert counts["late"] >= CONTROL_ROUNDS  # the second thread of each round: two waits, >= 1000 ms


OPENER = r"""
import json, sys, time
from stockade.core.errors import BackendUnavailable
from stockade.recipes.log import SQLiteShardLog
path, other, other_token, neighbour, neighbour_token, control, bound_ms = sys.argv[1:8]
SQLiteShardLog.lazy_partitions = control != "control"
out = {}
began = time.monotonic()
try:
    log = SQLiteShardLog(path, keys=path.removesuffix(".db") + ".keys", busy_timeout_ms=int(bound_ms))
    out["open"] = "opened"
except BackendUnavailable as exc:
    out["open"] = type(exc).__name__
out["open_ms"] = (time.monotonic() - began) * 1000
if out["open"] == "opened":
    for name, shard, token in (("other", other, other_token), ("neighbour", neighbour, neighbour_token)):
        began = time.monotonic()
        try:
            out[name] = f"landed {log.append(shard, b'new process', token=token).first_offset}"
        except BackendUnavailable as exc:
            out[name] = "refused" if exc.certain_no_effect else "unknown"
        out[name + "_ms"] = (time.monotonic() - began) * 1000
print(json.dumps(out), flush=True)
"""


def run_new_processes(tmp_path: Path, rounds: int, *, control: bool) -> dict[str, int]:
    path = tmp_path / "log.db"
    SQLiteShardLog(path, cluster_id=CLUSTER, keys=KEYS, partitions=PARTITIONS, busy_timeout_ms=BOUND_MS).close()
    save_keyring(tmp_path / "log.keys", KEYS.keyring)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests" / "helpers")]))
    writer = subprocess.Popen([sys.executable, HELPER, "freeze-in-append", f"sqlite:///{path}", FROZEN,
                               tok(5, FROZEN).encode()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    assert writer.stdin is not None
    other = next(n for n in (f"orders.shard-{i}" for i in range(1000))
                 if partition_of(n, PARTITIONS) != partition_of(FROZEN, PARTITIONS))
    neighbour = _neighbours()[1]
    opened = landed = refused_within = 0
    slowest_ms = 0.0
    try:
        for round_ in range(1, rounds + 1):
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert _read_line(writer) == f"frozen {round_}"
            while not _stopped(writer.pid):
                time.sleep(0.001)
            argv = [sys.executable, "-c", OPENER, str(path), other, tok(7, other).encode(), neighbour,
                    tok(7, neighbour).encode(), "control" if control else "lazy", str(BOUND_MS)]
            seen = json.loads(subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120,
                                             check=True).stdout)
            assert _stopped(writer.pid)
            opened += seen["open"] == "opened"
            landed += seen.get("other") == f"landed {round_ - 1}"
            refused_within += seen.get("neighbour") == "refused" and seen["neighbour_ms"] <= BOUND_MS + SLACK_MS
            slowest_ms = max(slowest_ms, seen.get("neighbour_ms", seen["open_ms"]))
            writer.send_signal(signal.SIGCONT)
            assert _read_line(writer) == f"ack {round_} {round_ - 1}"
    finally:
        writer.kill()
        writer.wait()
    print(f"lazy_partitions={not control}: {rounds} new processes while a writer was frozen in one of "
          f"{PARTITIONS} files: opened the log {opened} of {rounds}, appended to another file's shard {landed} of "
          f"{rounds}, refused on the frozen file within {BOUND_MS} + {SLACK_MS} ms {refused_within} of {rounds} "
          f"(slowest {slowest_ms:.0f} ms)")
    return {"opened": opened, "landed": landed, "refused_within": refused_within}


def test_a_new_process_opens_the_log_and_appends_beside_a_frozen_writer(tmp_path: Path) -> None:
    counts = run_new_processes(tmp_path, OPENER_ROUNDS, control=False)
    assert counts["opened"] == counts["landed"] == OPENER_ROUNDS
    assert counts["refused_within"] >= OPENER_ROUNDS - OPENER_ROUNDS // 10


def test_control_a_log_that_opens_every_file_cannot_be_opened_beside_a_frozen_writer(tmp_path: Path) -> None:
    counts = run_new_processes(tmp_path, OPENER_CONTROL_ROUNDS, control=True)
    assert counts["opened"] == counts["landed"] == 0
