"""A writer frozen inside an SQLite shard-log append (docs/shard-log.md, "A frozen writer").

The writer (tests/helpers/shardlog_writer.py ``freeze-in-append``) stops
itself with SIGSTOP inside its append's write transaction, holding its file's
write lock; while it is stopped (its state read from /proc, not slept for),
this process appends to the other shards and once, with a newer token, to the
frozen writer's own shard. Then the writer is continued and commits.

- Spread over partition files (``partitions=8``): every other shard's append
  lands, at the next offset, within the file's busy timeout; the frozen shard's
  newer writer gets `BackendUnavailable` (``certain_no_effect``) at that bound,
  as the page says: SQLite cannot take a lock from a stopped process.
- Control, the one-file layout as logs were before: the other shards' appends
  stall with the frozen one and fail at the busy timeout.
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
from stockade.keys import save_keyring
from stockade.recipes.log import READ_LIMIT_MAX, SQLiteShardLog, partition_of
from stockade.testing.conformance.fence import CLUSTER, KEYS, tok

ROOT = Path(__file__).resolve().parent.parent
HELPER = str(ROOT / "tests" / "helpers" / "shardlog_writer.py")
LONG = os.environ.get("STOCKADE_LONG") == "1"
FREEZES = 200 if LONG else 20
CONTROL_FREEZES = 20 if LONG else 3
PARTITIONS = 8
BOUND_MS = 250  # the test's busy timeout: an append waits at most this long for its file's lock
FROZEN = "orders.frozen"

if not sys.platform.startswith("linux"):
    pytest.skip("reads a stopped process's state from /proc", allow_module_level=True)


def _others(partitions: int) -> list[str]:
    """Six shards, none in the frozen shard's partition file (when there are several)."""
    names = (f"orders.shard-{i}" for i in range(1000))
    return [n for n in names if partitions == 1 or partition_of(n, partitions) != partition_of(FROZEN, partitions)][:6]


def run_freezes(tmp_path: Path, partitions: int, rounds: int) -> dict[str, object]:
    path = tmp_path / "log.db"
    log = SQLiteShardLog(path, cluster_id=CLUSTER, keys=KEYS, partitions=partitions, busy_timeout_ms=BOUND_MS)
    save_keyring(tmp_path / "log.keys", KEYS.keyring)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests" / "helpers")]))
    writer = subprocess.Popen([sys.executable, HELPER, "freeze-in-append", f"sqlite:///{path}", FROZEN,
                               tok(5, FROZEN).encode()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    assert writer.stdin is not None
    others = _others(partitions)
    landed = stalled = newer_refused = 0
    slowest_ms = newer_ms = 0.0
    try:
        for round_ in range(1, rounds + 1):
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert _read_line(writer) == f"frozen {round_}"
            while not _stopped(writer.pid):  # the SIGSTOP it sent itself has taken effect
                time.sleep(0.001)
            for shard in others:
                began = time.monotonic()
                try:
                    result = log.append(shard, f"r{round_}".encode(), token=tok(7, shard))
                    assert result.first_offset == round_ - 1  # in order, no gap
                    landed += 1
                except BackendUnavailable as exc:
                    assert exc.certain_no_effect
                    stalled += 1
                slowest_ms = max(slowest_ms, (time.monotonic() - began) * 1000)
            assert _stopped(writer.pid)  # it held its lock all along
            began = time.monotonic()
            try:  # the frozen shard's newer writer: held up by the stopped one, refused at the bound
                log.append(FROZEN, b"newer", token=tok(9, FROZEN))
                raise AssertionError("an append got past a stopped writer's lock")
            except BackendUnavailable as exc:
                assert exc.certain_no_effect
                newer_refused += 1
            newer_ms = max(newer_ms, (time.monotonic() - began) * 1000)
            writer.send_signal(signal.SIGCONT)
            assert _read_line(writer) == f"ack {round_} {round_ - 1}"
        entries = log.read(FROZEN, 0, READ_LIMIT_MAX)
        assert [e.data for e in entries] == [f"frozen-writer {r}".encode() for r in range(1, rounds + 1)]
    finally:
        writer.kill()
        writer.wait()
        log.close()
    attempts = rounds * len(others)
    print(f"partitions={partitions}: {rounds} freezes, other shards' appends landed {landed} of {attempts}, "
          f"stalled {stalled} of {attempts}, slowest {slowest_ms:.0f} ms; the frozen shard's newer writer "
          f"refused at the bound {newer_refused} of {rounds} (slowest {newer_ms:.0f} ms, bound {BOUND_MS} ms)")
    return {"landed": landed, "stalled": stalled, "attempts": attempts, "newer_refused": newer_refused}


def test_a_frozen_writer_holds_up_only_its_own_partition_file(tmp_path: Path) -> None:
    counts = run_freezes(tmp_path, PARTITIONS, FREEZES)
    assert counts["stalled"] == 0  # 0 of FREEZES * 6
    assert counts["landed"] == counts["attempts"]
    assert counts["newer_refused"] == FREEZES


def test_control_one_file_a_frozen_writer_stalls_every_shard(tmp_path: Path) -> None:
    counts = run_freezes(tmp_path, 1, CONTROL_FREEZES)
    assert counts["stalled"] == counts["attempts"]  # every other shard held up by the one frozen writer
    assert counts["landed"] == 0


def test_the_layout_is_recorded_and_a_one_file_log_keeps_its_shards(tmp_path: Path) -> None:
    from stockade.core.errors import InvalidArgument

    spread = SQLiteShardLog(tmp_path / "spread.db", cluster_id=CLUSTER, keys=KEYS, partitions=4)
    spread.append("a", b"1", token=tok(3, "a"))
    spread.close()
    assert sorted(p.name for p in tmp_path.glob("spread.db.part*")) == [f"spread.db.part{i:03d}" for i in range(4)]
    reopened = SQLiteShardLog(tmp_path / "spread.db", keys=KEYS)  # None: the recorded layout
    assert (reopened.partitions, reopened.next_offset("a"), reopened.high_water("a")) == (4, 1, 3)
    reopened.close()
    for bad in (0, 257, "4", 2):
        with pytest.raises(InvalidArgument):
            SQLiteShardLog(tmp_path / "spread.db", keys=KEYS, partitions=bad)
    old = SQLiteShardLog(tmp_path / "old.db", cluster_id=CLUSTER, keys=KEYS)  # a log as they were: one file
    old.append("a", b"1", token=tok(3, "a"))
    old.close()
    with sqlite3.connect(tmp_path / "old.db") as conn:  # written before the layout was recorded
        conn.execute("DROP TABLE log_layout")
    with pytest.raises(InvalidArgument, match="partitions"):
        SQLiteShardLog(tmp_path / "old.db", keys=KEYS, partitions=4)
    again = SQLiteShardLog(tmp_path / "old.db", keys=KEYS)
    assert (again.partitions, [e.data for e in again.read("a")]) == (1, [b"1"])  # unchanged, still one file
    again.close()
    assert not list(tmp_path.glob("old.db.part*"))
