"""The fenced shard log (docs/shard-log.md) on the store file and on a real PostgreSQL.

- Both backends: consecutive offsets, batches, idempotency keys (a replay even
  after a newer writer), expected offsets, stale / forged / other-scope appends
  refused with nothing written, bad input refused with nothing written, tailing
  with a bounded wait, floors (R4) through `stockade.resources.floor`.
- PostgreSQL, with processes: 8 writer processes handing the shard's lease
  around (offsets 0..N-1, every acknowledged append once); a zombie writer
  (SIGSTOP past its lease, SIGCONT) refused; kill -9 of a writer in the middle
  of its batches (no gap, no half batch); kill -9 of PostgreSQL during appends
  (no acknowledged append lost); 4 logs opened at once on a database whose default
  isolation is REPEATABLE READ or SERIALIZABLE, appending (none fails).
- Controls, which must fail: fencing off (the zombie's append accepted), a
  check-then-append without the head's lock (duplicate offsets), the store's
  fence rule swapped for one that accepts everything.
The sharded key-value example built on the log is tested in tests/test_shardkv_example.py.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import PG_ISOLATION_VARIANTS, PG_VARIANTS, fresh_pg_url
from helpers.at_once import errors_at_once

import stockade
from stockade.core.errors import BackendUnavailable, InvalidArgument, LimitExceeded, StaleToken, TokenMismatch
from stockade.core.values import FenceFloors
from stockade.keys import save_keyring
from stockade.recipes._log_postgres import PostgresShardLog, install_log
from stockade.recipes.log import (
    BATCH_ENTRIES_MAX,
    READ_LIMIT_MAX,
    READ_WAIT_MS_MAX,
    OffsetConflict,
    SQLiteShardLog,
    open_postgres_log,
)
from stockade.resources import postgres as pg
from stockade.resources.floor import open_floor_target, raise_to_floors
from stockade.resources.postgres import _sql as q
from stockade.testing.conformance.fence import CLUSTER, KEYS, OTHER_CLUSTER, OTHER_KEYS, ROGUE_KEYS, tok
from stockade.testing.mutants import fencing_off
from stockade.testing.servers.postgres import PostgresServer, available, drop_database, fresh_database, shared_server

ROOT = Path(__file__).resolve().parent.parent
HELPER = str(ROOT / "tests" / "helpers" / "shardlog_writer.py")
LONG = os.environ.get("STOCKADE_LONG") == "1"
WRITERS = 8
HANDOFF_ROUNDS = 6 if LONG else 1
ZOMBIE_ROUNDS = 50 if LONG else 3
WRITER_KILLS = 25 if LONG else 3
SERVER_KILLS = 10 if LONG else 2
STALE_ATTEMPTS = 200
LINE_WAIT_S = 120.0

if not available():
    if os.environ.get("CI") == "true":
        raise RuntimeError("PostgreSQL 15 is not installed (scripts/test.sh installs it)")
    pytest.skip("PostgreSQL 15 is not installed", allow_module_level=True)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests" / "helpers")])
    return env


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "sqlite-partitions", "postgres", "postgres-sql_ascii"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The log on SQLite (one file, and spread over 4 partition files), on a UTF8 PostgreSQL database,
    and on a SQL_ASCII one (text came back as bytes)."""
    if request.param.startswith("sqlite"):
        opened: Any = SQLiteShardLog(tmp_path / "log.db", cluster_id=CLUSTER, keys=KEYS,
                                     partitions=4 if request.param == "sqlite-partitions" else None)
        opened.floor_url = f"sqlite:///{tmp_path / 'log.db'}"
        yield opened
        opened.close()
        return
    server = shared_server()
    name = fresh_database(server, *PG_VARIANTS.get(request.param, ("UTF8", {})))
    opened = open_postgres_log(server.dsn_of(name), keys=KEYS)
    opened.floor_url = server.url(name)
    try:
        yield opened
    finally:
        opened.close()
        drop_database(server, name)


def values(log: Any, shard: str) -> list[bytes]:
    return [entry.data for entry in log.read(shard, 0, READ_LIMIT_MAX)]


# -- both backends -------------------------------------------------------------------------------


def test_offsets_are_consecutive_and_batches_are_whole(log: Any) -> None:
    results = [log.append("s", b"a", token=tok(5, "s")),
               log.append_batch("s", [b"b", "c", b""], token=tok(5, "s")),
               log.append("s", b"d", token=tok(7, "s")),
               log.append("t", b"other shard", token=tok(3, "t"))]
    assert [(r.first_offset, r.count) for r in results] == [(0, 1), (1, 3), (4, 1), (0, 1)]
    entries = log.read("s", 0, 100)
    assert [(e.offset, e.token_value, e.data) for e in entries] == [
        (0, 5, b"a"), (1, 5, b"b"), (2, 5, b"c"), (3, 5, b""), (4, 7, b"d")]
    assert [e.offset for e in log.read("s", 2, 2)] == [2, 3]
    assert log.next_offset("s") == 5 and log.next_offset("never") == 0
    assert log.shards() == ["s", "t"]


def test_a_stale_append_is_refused_and_writes_nothing(log: Any) -> None:
    log.append("s", b"current", token=tok(10, "s"))
    accepted = 0
    for i in range(STALE_ATTEMPTS):
        try:
            log.append_batch("s", [b"stale"] * (1 + i % 3), token=tok(1 + i % 9, "s"))
            accepted += 1
        except StaleToken as refused:
            assert refused.high_water == 10
    assert accepted == 0  # 0 of STALE_ATTEMPTS
    assert values(log, "s") == [b"current"] and log.next_offset("s") == 1
    assert log.append("s", b"equal", token=tok(10, "s")).first_offset == 1  # equal is accepted (one lease)


def test_forged_and_foreign_tokens_are_refused_and_write_nothing(log: Any) -> None:
    log.append("s", b"x", token=tok(5, "s"))
    for bad in [tok(9, "s", keys=ROGUE_KEYS), tok(9, "s", keys=None), tok(9, "other"),
                tok(9, "s", cluster=OTHER_CLUSTER, keys=OTHER_KEYS)]:
        with pytest.raises(TokenMismatch):
            log.append("s", b"evil", token=bad)
    with pytest.raises(TokenMismatch):  # a forged token learns nothing, not even an earlier append's offsets
        log.append("s", b"x", token=tok(9, "s", keys=ROGUE_KEYS), idempotency_key="k")
    assert values(log, "s") == [b"x"] and log.high_water("s") == 5


def test_idempotency_key_replays_even_after_a_newer_writer(log: Any) -> None:
    first = log.append_batch("s", [b"a", b"b"], token=tok(5, "s"), idempotency_key="op-1")
    again = log.append_batch("s", [b"a", b"b"], token=tok(5, "s"), idempotency_key="op-1")
    assert (again.first_offset, again.count, again.replayed) == (first.first_offset, 2, True)
    log.append("s", b"newer", token=tok(8, "s"))
    late = log.append_batch("s", [b"a", b"b"], token=tok(5, "s"), idempotency_key="op-1")  # R3 before R1
    assert (late.first_offset, late.replayed) == (0, True)
    with pytest.raises(InvalidArgument):
        log.append("s", b"something else", token=tok(8, "s"), idempotency_key="op-1")
    with pytest.raises(StaleToken):  # a stale append with a key never used is refused
        log.append("s", b"c", token=tok(5, "s"), idempotency_key="op-2")
    assert values(log, "s") == [b"a", b"b", b"newer"]


def test_expected_offset_makes_an_append_conditional(log: Any) -> None:
    assert log.append("s", b"a", token=tok(5, "s"), expected_offset=0).first_offset == 0
    with pytest.raises(OffsetConflict) as conflict:
        log.append("s", b"b", token=tok(5, "s"), expected_offset=0)
    assert conflict.value.next_offset == 1 and isinstance(conflict.value, InvalidArgument)
    assert log.append("s", b"b", token=tok(5, "s"), expected_offset=1).first_offset == 1
    assert values(log, "s") == [b"a", b"b"]


def test_bad_input_is_refused_and_changes_nothing(log: Any) -> None:
    log.append("s", b"x", token=tok(5, "s"))
    bad_appends: list[tuple[type[Exception], dict[str, Any]]] = [
        (InvalidArgument, {"entries": b"bytes, not a list"}),
        (InvalidArgument, {"entries": []}),
        (InvalidArgument, {"entries": [1]}),
        (LimitExceeded, {"entries": [b"x" * (log.entry_bytes_max + 1)]}),
        (LimitExceeded, {"entries": [b"x"] * (BATCH_ENTRIES_MAX + 1)}),
        (InvalidArgument, {"shard": "bad shard"}),
        (InvalidArgument, {"token": 5}),
        (InvalidArgument, {"token": "stk1.nonsense"}),
        (InvalidArgument, {"idempotency_key": "has space"}),
        (InvalidArgument, {"expected_offset": -1}),
        (InvalidArgument, {"expected_offset": True}),
    ]
    for error, change in bad_appends:
        arguments: dict[str, Any] = {"shard": "s", "entries": [b"y"], "token": tok(6, "s"), **change}
        with pytest.raises(error):
            log.append_batch(arguments.pop("shard"), arguments.pop("entries"), **arguments)
    for arguments in [{"from_offset": -1}, {"limit": 0}, {"limit": READ_LIMIT_MAX + 1}, {"wait_ms": -1},
                      {"wait_ms": READ_WAIT_MS_MAX + 1}, {"from_offset": "0"}]:
        with pytest.raises(InvalidArgument):
            log.read("s", **arguments)
    assert values(log, "s") == [b"x"] and log.high_water("s") == 5


def test_a_reader_tails_the_shard_with_a_bounded_wait(log: Any) -> None:
    log.append("s", b"0", token=tok(5, "s"))
    assert log.read("s", 1, 10, wait_ms=50) == []  # nothing new: back after the wait, empty
    started = threading.Event()

    def later() -> None:
        started.wait()
        log.append("s", b"1", token=tok(5, "s"))

    thread = threading.Thread(target=later)
    thread.start()
    started.set()
    entries = log.read("s", 1, 10, wait_ms=30_000)
    thread.join()
    assert [(e.offset, e.data) for e in entries] == [(1, b"1")]


def test_floors_make_old_tokens_stale(log: Any) -> None:
    log.append("s", b"before", token=tok(5, "s"))
    target = open_floor_target(log.floor_url, cluster_id=CLUSTER)
    try:
        raise_to_floors(target, FenceFloors({"s": 50}, default=20))
    finally:
        target.close()
    assert log.high_waters()["s"] == 50
    for stale in [tok(49, "s"), tok(19, "new")]:
        with pytest.raises(StaleToken):
            log.append(stale.scope, b"restored away", token=stale)
    assert log.append("s", b"after", token=tok(50, "s")).first_offset == 1
    assert log.append("new", b"after", token=tok(20, "new")).first_offset == 0


def test_control_the_store_log_with_fencing_off_accepts_a_stale_append(tmp_path: Path) -> None:
    log = fencing_off(SQLiteShardLog(tmp_path / "log.db", cluster_id=CLUSTER, keys=KEYS))
    log.append("s", b"current", token=tok(10, "s"))
    log.append("s", b"stale", token=tok(3, "s"))  # what the fence is for
    assert values(log, "s") == [b"current", b"stale"]
    log.close()


# -- PostgreSQL, with processes -------------------------------------------------------------------


def _lines(process: subprocess.Popen[str]) -> Iterator[str]:
    assert process.stdout is not None
    for line in process.stdout:
        yield line.strip()


def _read_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise AssertionError(f"helper exited: {process.wait()} {process.stderr.read() if process.stderr else ''}")
    return line.strip()


def _all_entries(log: Any, shard: str) -> list[Any]:
    entries: list[Any] = []
    while page := log.read(shard, len(entries), READ_LIMIT_MAX):
        entries += page
    return entries


def test_eight_writer_processes_hand_the_lease_around(pg_db: tuple[PostgresServer, str]) -> None:
    server, name = pg_db
    url = server.url(name)
    coord = stockade.connect(url)
    log = open_postgres_log(url, keys=coord.verify_keys())
    appends = 5
    writers = [subprocess.Popen([sys.executable, HELPER, "handoff", url, "kv.shard-0", str(HANDOFF_ROUNDS),
                                 str(appends), f"w{i}"], stdout=subprocess.PIPE, text=True, env=child_env())
               for i in range(WRITERS)]
    acks = [line.split() for writer in writers for line in _lines(writer)]
    print(f"hand-off: {WRITERS} processes, {len(acks)} acknowledged appends")
    assert [writer.wait(LINE_WAIT_S) for writer in writers] == [0] * WRITERS
    entries = _all_entries(log, "kv.shard-0")
    assert [e.offset for e in entries] == list(range(WRITERS * HANDOFF_ROUNDS * appends))  # no gap
    assert len(acks) == len(entries)
    by_offset = {e.offset: e.data.decode() for e in entries}
    assert sum(by_offset[int(offset)] != value for _, offset, value in acks) == 0  # acknowledged lost: 0
    assert max(Counter(e.data for e in entries).values()) == 1  # duplicated: 0
    tokens = [e.token_value for e in entries]
    assert tokens == sorted(tokens) and len(set(tokens)) == WRITERS * HANDOFF_ROUNDS  # one lease per run
    log.close()
    coord.close()


def _zombie_rounds(url: str, log_url: str, rounds: int) -> int:
    """A writer acquires, is stopped past its lease while the test writes under a newer lease, then appends."""
    coord = stockade.connect(url)
    log = open_postgres_log(log_url, keys="unsigned", install=False)
    zombie = subprocess.Popen([sys.executable, HELPER, "zombie", log_url, "kv.shard-z", str(rounds), url],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env())
    accepted = 0
    try:
        for _ in range(rounds):
            held = int(_read_line(zombie).split()[1])
            zombie.send_signal(signal.SIGSTOP)
            newer = coord.acquire("kv.shard-z", ttl_ms=5_000, wait_ms=60_000, keepalive=False)  # after its expiry
            assert newer.token.value > held
            log.append("kv.shard-z", b"new writer", token=newer.token)
            newer.release()
            zombie.send_signal(signal.SIGCONT)
            assert zombie.stdin is not None
            zombie.stdin.write("\n")
            zombie.stdin.flush()
            accepted += _read_line(zombie) == "accepted"
        assert zombie.wait(LINE_WAIT_S) == 0
    finally:
        if zombie.poll() is None:
            zombie.send_signal(signal.SIGCONT)
            zombie.kill()
            zombie.wait()
        log.close()
        coord.close()
    return accepted


def test_a_zombie_writer_is_refused(pg_db: tuple[PostgresServer, str]) -> None:
    server, name = pg_db
    coord = stockade.connect(server.url(name))
    open_postgres_log(server.url(name), keys=coord.verify_keys()).close()
    coord.close()
    accepted = _zombie_rounds(server.url(name), server.url(name), ZOMBIE_ROUNDS)
    print(f"zombie appends accepted: {accepted} of {ZOMBIE_ROUNDS}")
    assert accepted == 0


def test_control_fencing_off_accepts_the_zombie(pg_db: tuple[PostgresServer, str]) -> None:
    server, name = pg_db
    control = fresh_database(server)
    try:
        coord = stockade.connect(server.url(name))
        with psycopg.connect(server.dsn_of(control), autocommit=True) as conn:
            keyring, cluster = pg._keyring_of(coord.verify_keys(), None)
            pg._install(conn, keyring, cluster, q.STALE_WHEN["fencing-off"])
            install_log(conn)
        coord.close()
        accepted = _zombie_rounds(server.url(name), server.url(control), ZOMBIE_ROUNDS)
        print(f"control, fencing off: zombie appends accepted: {accepted} of {ZOMBIE_ROUNDS}")
        assert accepted == ZOMBIE_ROUNDS
    finally:
        drop_database(server, control)


def _paused_in_append(server: PostgresServer, name: str, *extra: str) -> tuple[float, list[str]]:
    """A writer stops (SIGSTOP) between its entries' insert and its COMMIT; how long the next writer waits."""
    with psycopg.connect(server.dsn_of(name), autocommit=True) as conn:  # what docs/fence-postgres.md asks for
        conn.execute(f"ALTER DATABASE {name} SET idle_in_transaction_session_timeout = '1s'")
    log = open_postgres_log(server.dsn_of(name), keys=KEYS)
    with psycopg.connect(server.dsn_of(name), autocommit=True) as conn:
        # Supersession (a newer token ends a lower holder's session after 2 s) would cut both waits
        # short; this test isolates the idle timeout, so the bound is put past its 5 s window.
        pg.install(conn, keys=KEYS, supersede_after_ms=60_000)
    paused = subprocess.Popen([sys.executable, HELPER, "pause-in-append", server.url(name), "kv.shard-p",
                               tok(7, "kv.shard-p").encode(), *extra],
                              stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert _read_line(paused) == "paused"
        waited = time.monotonic()
        done = threading.Event()
        threading.Thread(target=lambda: (log.append("kv.shard-p", b"next", token=tok(8, "kv.shard-p")),
                                         done.set()), daemon=True).start()
        done.wait(5)  # the next writer, blocked by the paused one's lock until its session ends
        waited = time.monotonic() - waited
        paused.send_signal(signal.SIGCONT)
        done.wait(30)
        outcome = list(_lines(paused))
        return (waited if done.is_set() else float("inf")), outcome + [
            entry.data.decode() for entry in log.read("kv.shard-p", 0, READ_LIMIT_MAX)]
    finally:
        paused.kill()
        paused.wait()
        log.close()


def test_a_writer_paused_inside_an_append_holds_the_shard_no_longer_than_the_idle_timeout(
        pg_db: tuple[PostgresServer, str]) -> None:
    """The entries went in with executemany, whose pipeline's Flush disarmed idle_in_transaction_session_timeout:
    the next writer waited for as long as the paused one stayed paused. The control puts that back."""
    server, name = pg_db
    waited, seen = _paused_in_append(server, name)
    control = fresh_database(server)
    try:
        waited_control, _ = _paused_in_append(server, control, "control")
    finally:
        drop_database(server, control)
    print(f"writer paused inside an append (idle timeout 1 s): the next writer waited {waited:.1f} s; "
          f"control (executemany): {waited_control:.1f} s, until SIGCONT at 5 s")
    assert waited < 5 and seen[0].startswith("failed") and seen[1:] == ["next"]  # the paused batch: gone whole
    assert waited_control >= 5  # the control: blocked for as long as the writer stayed paused


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_kill9_of_a_writer_mid_append_leaves_no_gap_and_no_half_batch(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if backend == "postgres":
        server, name = request.getfixturevalue("pg_db")
        log: Any = open_postgres_log(server.dsn_of(name), keys=KEYS)
        url = server.url(name)
    else:
        log = SQLiteShardLog(tmp_path / "log.db", cluster_id=CLUSTER, keys=KEYS)
        save_keyring(tmp_path / "log.keys", KEYS.keyring)  # the writers verify with the same keys (L2)
        url = f"sqlite:///{tmp_path / 'log.db'}"
    token = tok(7, "kv.shard-k").encode()
    count, size = 50, 2048
    rng = random.Random(13)
    acked: dict[str, int] = {}
    killed_after_begin = 0
    for run in range(WRITER_KILLS):
        writer = subprocess.Popen([sys.executable, HELPER, "batches", url, "kv.shard-k", token,
                                   f"r{run}", str(count), str(size)], stdout=subprocess.PIPE, text=True,
                                  env=child_env())
        begins, target = 0, rng.randint(1, 3)
        while begins < target:
            kind, batch, *rest = _read_line(writer).split()
            begins += kind == "begin"
            if kind == "ack":
                acked[batch] = int(rest[0])
        time.sleep(rng.uniform(0, 0.02))  # somewhere inside the append (50 rows, one transaction)
        writer.send_signal(signal.SIGKILL)
        killed_after_begin += 1
        for line in _lines(writer):  # whatever it printed before it died
            kind, batch, *rest = line.split()
            if kind == "ack":
                acked[batch] = int(rest[0])
        writer.wait()
    entries = _all_entries(log, "kv.shard-k")
    assert [e.offset for e in entries] == list(range(len(entries)))  # no gap
    batches: dict[str, list[tuple[int, int]]] = {}
    for entry in entries:
        label, part = entry.data.split(b" ")[:2]
        index, _ = part.split(b"/")
        batches.setdefault(label.decode(), []).append((entry.offset, int(index)))
    half = [b for b, rows in batches.items()
            if [i for _, i in rows] != list(range(count)) or rows[-1][0] - rows[0][0] != count - 1]
    print(f"{backend} writer kill -9: {WRITER_KILLS} kills, {len(entries)} entries, half batches {len(half)} of "
          f"{len(batches)}, acknowledged {len(acked)}")
    assert half == []  # no half batch: 0 of len(batches)
    assert sum(batches.get(batch, [(-1, 0)])[0][0] != first for batch, first in acked.items()) == 0  # none lost
    assert killed_after_begin == WRITER_KILLS
    log.close()


def test_kill9_of_postgres_during_appends_loses_no_acknowledged_append() -> None:
    server = PostgresServer()
    try:
        name = fresh_database(server)
        log = open_postgres_log(server.dsn_of(name), keys=KEYS, connect_timeout_s=5)
        token = tok(9, "kv.shard-p")
        acked: dict[str, int] = {}
        unknown = 0
        stop = threading.Event()

        def write() -> None:
            nonlocal unknown
            number = 0
            while not stop.is_set():
                number += 1
                value = f"v{number}"
                while not stop.is_set():
                    try:
                        acked[value] = log.append("kv.shard-p", value.encode(), token=token,
                                                  idempotency_key=value).first_offset
                        break
                    except BackendUnavailable:
                        unknown += 1  # the same key again: appended at most once
                        time.sleep(0.05)

        writer = threading.Thread(target=write)
        writer.start()
        try:
            for _ in range(SERVER_KILLS):
                goal = len(acked) + 10
                deadline = time.monotonic() + LINE_WAIT_S
                while len(acked) < goal and time.monotonic() < deadline:
                    time.sleep(0.01)
                server.kill9()
                server.start()
            goal = len(acked) + 10
            deadline = time.monotonic() + LINE_WAIT_S
            while len(acked) < goal and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            stop.set()
            writer.join()
        entries = _all_entries(log, "kv.shard-p")
        assert [e.offset for e in entries] == list(range(len(entries)))
        by_offset = {e.offset: e.data.decode() for e in entries}
        print(f"server kill -9: {SERVER_KILLS} kills, acknowledged {len(acked)}, lost "
              f"{sum(by_offset.get(o) != v for v, o in acked.items())}, unknown outcomes retried {unknown}")
        assert sum(by_offset.get(offset) != value for value, offset in acked.items()) == 0  # lost: 0 of len(acked)
        assert max(Counter(by_offset.values()).values()) == 1  # an unknown outcome retried: never twice
        assert len(acked) >= 10 * (SERVER_KILLS + 1) and unknown > 0
        log.close()
    finally:
        server.close()


def _concurrent_appends(log: PostgresShardLog, shard: str, threads: int = 8, each: int = 15) -> list[int]:
    token = tok(4, shard)

    def run(number: int) -> None:
        for i in range(each):
            log_of_thread = logs[number]
            log_of_thread.append(shard, f"{number}-{i}".encode(), token=token)

    logs = [PostgresShardLog(log.dsn, keys=KEYS, _schema=log._schema, _lock_head=log._lock_head)
            for _ in range(threads)]
    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    for each_log in logs:
        each_log.close()
    return [e.offset for e in _all_entries(log, shard)]


#: The appenders at once on a database whose default isolation is stricter (conftest's
#: `PG_ISOLATION_VARIANTS`), the appends each makes (every other one on a shard they share), and the control's
#: rounds at most.
APPENDERS = 4
APPENDS_EACH = 40
CONTROL_ROUNDS_MAX = 5


def _opens_and_appends_at_once(url: str) -> tuple[Counter[str], list[int]]:
    """`APPENDERS` logs opened at once on a fresh database (each installs), each making `APPENDS_EACH` appends:
    the failures (each ends its appender), and the shared shard's offsets."""
    def appender(index: int) -> None:
        log = open_postgres_log(url, keys=KEYS)
        try:
            for n in range(APPENDS_EACH):
                shard = "shared" if n % 2 == 0 else f"own-{index}"
                log.append(shard, b"x", token=tok(5, shard))
        finally:
            log.close()

    errors = errors_at_once(APPENDERS, appender)
    log = open_postgres_log(url, keys=KEYS)
    offsets = [entry.offset for entry in log.read("shared", 0, READ_LIMIT_MAX)]
    log.close()
    return errors, offsets


@pytest.mark.parametrize("variant", PG_ISOLATION_VARIANTS)
def test_opens_and_appends_at_once_on_a_stricter_default_isolation(variant: str) -> None:
    """An append locks its shard's head row, then reads what is committed; at a default of REPEATABLE READ or
    SERIALIZABLE its snapshot was of before the lock (about one append in four failed with 40001, and opens
    at once failed in the fence's install). The log's sessions are READ COMMITTED now: every append lands,
    the shared shard's offsets consecutive."""
    with fresh_pg_url(*PG_VARIANTS[variant]) as url:
        errors, offsets = _opens_and_appends_at_once(url)
    assert not errors, dict(errors)
    assert offsets == list(range(APPENDERS * APPENDS_EACH // 2))


@pytest.mark.parametrize("variant", PG_ISOLATION_VARIANTS)
def test_control_appends_at_the_default_isolation_fail(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the log's sessions keep the database's default level (the install's own transaction,
    READ COMMITTED, kept: the appends' failures, not the opens')."""
    connect = PostgresShardLog._connect

    def keeps_the_default(self: PostgresShardLog) -> Any:
        conn = connect(self)
        conn.execute("RESET default_transaction_isolation")
        return conn

    monkeypatch.setattr(PostgresShardLog, "_connect", keeps_the_default)
    for _ in range(CONTROL_ROUNDS_MAX):
        with fresh_pg_url(*PG_VARIANTS[variant]) as url:
            errors, _ = _opens_and_appends_at_once(url)
        if errors:
            break
    print(f"\ncontrol, {variant}: {dict(errors)}")
    assert any("40001" in error or "serialize" in error for error in errors), dict(errors)


def test_control_check_then_append_without_the_lock_duplicates_offsets(pg_db: tuple[PostgresServer, str]) -> None:
    server, name = pg_db
    locked = open_postgres_log(server.dsn_of(name), keys=KEYS)
    unlocked = PostgresShardLog(server.dsn_of(name), keys=KEYS, _schema="stockade_log_control", _lock_head=False)
    unlocked.install()
    offsets = {"locked": _concurrent_appends(locked, "c"), "unlocked": _concurrent_appends(unlocked, "c")}
    problems = {kind: len(found) - len(set(found)) + (max(found) + 1 - len(set(found)))
                for kind, found in offsets.items()}
    print(f"duplicate or missing offsets of 120 concurrent appends: {problems}")
    assert offsets["locked"] == list(range(8 * 15))
    assert problems["locked"] == 0 and problems["unlocked"] > 0, problems
    locked.close()
    unlocked.close()


def test_a_transaction_the_server_ended_is_an_unknown_outcome_and_the_retry_is_replayed(
    pg_db: tuple[PostgresServer, str],
) -> None:
    """A writer stopped inside its append finds its transaction ended by the server (SQLSTATE 25P03)."""
    server, name = pg_db
    log = open_postgres_log(server.dsn_of(name), keys=KEYS)
    log.append("s", b"a", token=tok(5, "s"), idempotency_key="a")
    with pytest.raises(BackendUnavailable), log._connection():
        raise psycopg.errors.IdleInTransactionSessionTimeout("terminating connection")
    assert log._conn is None  # dropped: the next call connects again
    again = log.append("s", b"a", token=tok(5, "s"), idempotency_key="a")
    assert again.replayed and again.first_offset == 0 and log.next_offset("s") == 1
    log.close()
