"""The coordinator file: what it is, what it never reissues, what it may forget, whose clock it is on.

Each test here reproduces a way the file used to break C1 or leak (an older
copy brought back, a store file or foreign database adopted, scopes never
forgotten, a lease from another time namespace, files readable by others),
with a control where one makes sense.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import time

import pytest
from conftest import python_env

import stockade
from stockade.coordinators.memory import MemoryRecords
from stockade.coordinators.sqlite import (
    APPLICATION_ID,
    SQLiteCoordinator,
    SQLiteRecords,
    monotonic_offset_ns,
    new_lease_id,
)
from stockade.core.engine import LeaseEngine
from stockade.core.errors import ClockMismatch, WrongFileKind
from stockade.core.leases import Granted
from stockade.core.tokens import COUNTER_BITS, COUNTER_MAX, epoch_floor, epoch_of
from stockade.testing.clock import ManualClock as FakeClock

SCOPES = [f"s{i}" for i in range(4)]


def _grant(engine: LeaseEngine, scope: str) -> int:
    lease_id = new_lease_id()
    outcome = engine.try_acquire(scope, lease_id=lease_id, holder="t", ttl_ms=1000, wait_deadline_ns=0)
    assert isinstance(outcome, Granted)
    engine.release(lease_id)
    return outcome.lease.token.value


def _restore_run(tmp_path, grants_after: int = 104) -> tuple[int, int]:
    """Grants, a copy, more grants, the copy brought back, more grants: (reissued, grants after)."""
    path = tmp_path / "coord.db"
    issued: dict[str, int] = {}
    with SQLiteCoordinator(path) as coord:
        for scope in SCOPES:
            issued[scope] = _grant(coord, scope)
    shutil.copy(path, tmp_path / "backup.db")  # the file backup / VM snapshot
    with SQLiteCoordinator(path) as coord:
        for i in range(40):
            scope = SCOPES[i % len(SCOPES)]
            issued[scope] = max(issued[scope], _grant(coord, scope))
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"coord.db{suffix}").unlink(missing_ok=True)
    shutil.copy(tmp_path / "backup.db", path)  # the older copy is brought back
    reissued = 0
    with SQLiteCoordinator(path) as coord:
        for i in range(grants_after):
            scope = SCOPES[i % len(SCOPES)]
            value = _grant(coord, scope)
            reissued += value <= issued[scope]
    return reissued, grants_after


def test_older_coord_db_brought_back_never_reissues(tmp_path):
    """C1 across a restore: an older copy of coord.db brought back issues nothing at or below what was issued."""
    reissued, n = _restore_run(tmp_path)
    print(f"\nolder coord.db brought back, then {n} grants: tokens at or below an earlier issued one {reissued} of {n}")
    assert reissued == 0


def test_older_coord_db_control_without_epochs_reissues(tmp_path, monkeypatch):
    """The control: with epochs off, the same restore hands out tokens that were already issued."""
    monkeypatch.setattr(SQLiteRecords, "epochs", False)
    reissued, n = _restore_run(tmp_path)
    print(f"\ncontrol (epochs off): tokens at or below an earlier issued one {reissued} of {n}")
    assert reissued > 0


def test_every_open_starts_a_higher_epoch_past_on_the_wall_clock(tmp_path):
    path = tmp_path / "coord.db"
    epochs = []
    for _ in range(5):  # opens within the same millisecond still get distinct, increasing epochs
        records = SQLiteRecords(path)
        epochs.append(records.epoch)
        records.close()
    assert epochs == sorted(set(epochs))
    assert all(epoch_floor(e) < epoch_floor(e + 1) for e in epochs)


def test_openers_that_join_others_keep_their_epoch(tmp_path):
    """Only an opener that is alone starts an epoch: processes sharing the file count on contiguously."""
    path = tmp_path / "coord.db"
    first = SQLiteCoordinator(path)
    a = _grant(first, "s")
    joined = SQLiteCoordinator(path)
    assert joined.records.epoch == first.records.epoch
    assert _grant(joined, "s") == a + 1 and _grant(first, "s") == a + 2
    joined.close()
    first.close()


def test_counter_run_out_moves_to_a_new_epoch(tmp_path):
    """A scope whose counter is used up in an epoch moves to a new epoch, never into the next one's values."""
    path = tmp_path / "coord.db"
    with SQLiteCoordinator(path) as coord:
        first = _grant(coord, "hot")
        epoch = epoch_of(first)
        with coord.records._write() as conn:  # as if 4 million grants had been made in this epoch
            conn.execute("UPDATE scopes SET last_token = ? WHERE scope = 'hot'", (epoch_floor(epoch) + COUNTER_MAX,))
        after = _grant(coord, "hot")
        assert epoch_of(after) > epoch and after & COUNTER_MAX == 1
        assert after > epoch_floor(epoch) + COUNTER_MAX
    with sqlite3.connect(path) as conn:
        assert int(conn.execute("SELECT v FROM meta WHERE k = 'epoch'").fetchone()[0]) >= epoch_of(after)


def test_tokens_keep_order_across_opens(tmp_path):
    path = tmp_path / "coord.db"
    values = []
    for _ in range(3):
        with SQLiteCoordinator(path) as coord:
            values += [_grant(coord, "s") for _ in range(3)]
    assert values == sorted(values) and len(set(values)) == len(values)
    assert values[0] >> COUNTER_BITS > 0  # the epoch is in the high bits


# -- the kind marker ---------------------------------------------------------------------------------


def _snapshot(path):
    st = os.stat(path)
    return path.read_bytes(), st.st_mtime_ns, st.st_size


def _listing(directory):
    return sorted(p.name for p in directory.iterdir())


def _store_file(tmp_path):
    store = stockade.open_store(f"sqlite:///{tmp_path / 'store.db'}", cluster_id="0123456789abcdef", keys="unsigned")
    store.close()
    return tmp_path / "store.db"


def _foreign_file(tmp_path):
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.close()
    return path


def _not_sqlite(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"these are not the droids\n" * 20)
    return path


@pytest.mark.parametrize("make,found", [
    (_store_file, "stockade store"),
    (_foreign_file, "foreign SQLite"),
    (_not_sqlite, "not an SQLite"),
])
def test_connect_refuses_a_file_that_is_not_a_coordinator_touching_nothing(tmp_path, make, found):
    path = make(tmp_path)
    before, listing = _snapshot(path), _listing(tmp_path)
    time.sleep(0.01)  # an mtime change would show
    with pytest.raises(WrongFileKind, match=found) as caught:
        stockade.connect(f"sqlite:///{path}?process=embedded")
    assert isinstance(caught.value, stockade.BackendUnavailable) and caught.value.certain_no_effect
    assert _snapshot(path) == before, "byte- and mtime-identical"
    assert _listing(tmp_path) == listing, "no .lock, -wal or -shm left behind"
    if found != "not an SQLite":
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        conn.close()
        assert "leases" not in tables and "waiters" not in tables


def test_connect_refuses_a_directory_and_dev_null_leaving_no_lock_files(tmp_path):
    directory = tmp_path / "data"
    directory.mkdir()
    with pytest.raises(WrongFileKind, match="a directory"):
        stockade.connect(f"sqlite:///{directory}?process=embedded")
    assert _listing(tmp_path) == ["data"] and _listing(directory) == []
    dev_null_lock_before = os.path.exists("/dev/null.lock")
    with pytest.raises(WrongFileKind, match="not a regular file"):
        stockade.connect("sqlite:////dev/null?process=embedded")
    assert os.path.exists("/dev/null.lock") == dev_null_lock_before
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_an_empty_or_missing_file_becomes_a_coordinator(tmp_path):
    empty = tmp_path / "empty.db"
    empty.touch()
    for path in (empty, tmp_path / "sub" / "new.db"):
        coord = SQLiteCoordinator(path)
        _grant(coord, "s")
        coord.close()
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
            assert conn.execute("SELECT v FROM meta WHERE k = 'kind'").fetchone()[0] == "coordinator"
        conn.close()
        SQLiteCoordinator(path).close()  # and opens again as one


def test_a_coordinator_file_of_the_earlier_version_is_adopted(tmp_path):
    """A file written before the marker existed (the coordinator's tables, no application id) keeps working."""
    path = tmp_path / "coord.db"
    with SQLiteCoordinator(path) as coord:
        first = _grant(coord, "s")
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA application_id = 0")
        conn.execute("DELETE FROM meta WHERE k IN ('kind', 'epoch', 'mono_offset_ns')")
    conn.close()
    with SQLiteCoordinator(path) as coord:
        assert _grant(coord, "s") > first
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    conn.close()


def test_a_store_refuses_nothing_here_but_a_coordinator_file_is_not_a_store_file(tmp_path):
    """The marker tells the two kinds apart: a coordinator file opened as a coordinator is fine."""
    path = tmp_path / "coord.db"
    SQLiteCoordinator(path).close()
    with pytest.raises(WrongFileKind):
        SQLiteCoordinator(_store_file(tmp_path))
    SQLiteCoordinator(path).close()


# -- file modes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o000, 0o277])
def test_coordinator_files_are_created_0600_whatever_the_umask(tmp_path, umask):
    path = tmp_path / "coord.db"
    old = os.umask(umask)
    try:
        coord = SQLiteCoordinator(path)
        _grant(coord, "s")
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
        coord.close()
    finally:
        os.umask(old)
    assert set(modes) >= {"coord.db", "coord.db-wal", "coord.db-shm", "coord.db.lock"}
    assert all(mode == 0o600 for mode in modes.values()), modes


# -- forgetting idle scopes -------------------------------------------------------------------------


def _memory_engine(scopes_max: int, clock: FakeClock | None = None, records: MemoryRecords | None = None):
    records = records or MemoryRecords(scopes_max=scopes_max)
    return LeaseEngine(records, cluster_id="0123456789abcdef", clock=clock or FakeClock(1_000_000_000), forget_batch=8)


def test_a_full_scope_table_forgets_idle_scopes_and_keeps_granting(tmp_path):
    """Finding 5: filling the scope cap no longer stops new scopes; busy scopes are never forgotten."""
    engine = _memory_engine(scopes_max=100)
    held = {}
    for i in range(100):
        scope = f"fill{i}"
        if i < 10:  # ten stay held: they must survive
            lease_id = new_lease_id()
            outcome = engine.try_acquire(scope, lease_id=lease_id, holder="h", ttl_ms=60_000, wait_deadline_ns=0)
            held[scope] = outcome.lease.token.value
        else:
            _grant(engine, scope)
    granted = sum(1 for i in range(1000) if _grant(engine, f"new{i}"))
    print(f"\nscope cap 100 filled, then 1000 new scopes: granted {granted} of 1000")
    assert granted == 1000
    assert len(engine.records) <= 100
    for scope, value in held.items():
        assert engine.inspect(scope).token.value == value  # still held, never forgotten


def _scans_at_the_bound(monkeypatch, cycles: int = 50) -> tuple[int, int]:
    """A table full of held leases but one stored, idle scope: how many times ``cycles`` acquires of that scope
    looked for scopes to forget, and how many one acquire of a new scope did (it is refused: nothing is idle)."""
    from stockade.coordinators.memory import _MemoryTx
    from stockade.core.errors import LimitExceeded

    scans = []
    oldest = _MemoryTx.oldest
    monkeypatch.setattr(_MemoryTx, "oldest", lambda tx, limit: scans.append(limit) or oldest(tx, limit))
    engine = _memory_engine(scopes_max=100)
    for i in range(99):
        engine.try_acquire(f"held{i}", lease_id=new_lease_id(), holder="h", ttl_ms=60_000, wait_deadline_ns=0)
    for _ in range(cycles):
        _grant(engine, "probe")
    stored = len(scans)
    with pytest.raises(LimitExceeded):
        engine.try_acquire("new", lease_id=new_lease_id(), holder="h", ttl_ms=60_000, wait_deadline_ns=0)
    return stored, len(scans) - stored


def test_a_full_table_looks_for_room_only_for_a_new_scope(monkeypatch):
    """At the bound, an acquire of a scope already stored needs no room: it does not scan the oldest scopes for
    idle ones (held leases at the front of the table made every such acquire look at 256 of them: about 100 µs of
    server CPU a cycle with 99,999 held, benchmarks/held_leases.py). A new scope still looks, and is refused."""
    stored, new = _scans_at_the_bound(monkeypatch)
    print(f"\nscope table full of held leases: scans for room in 50 acquires of a stored scope {stored}, "
          f"for a new scope {new}")
    assert (stored, new) == (0, 1)


def test_a_full_table_control_scanning_for_every_acquire_is_caught(monkeypatch):
    """The control: the test above fails when every acquire at the bound scans, as before."""
    class Anything:
        def __eq__(self, other: object) -> bool:
            return True

    monkeypatch.setattr("stockade.core.engine.ScopeRecord", lambda scope: Anything())
    stored, new = _scans_at_the_bound(monkeypatch)
    print(f"\ncontrol: scans for room in 50 acquires of a stored scope {stored}")
    assert stored == 49 and new == 1  # every acquire but the first (the table was full once it stored "probe")


def _forget_cycles(engine: LeaseEngine, cycles: int = 64) -> tuple[int, int]:
    regressions = 0
    last = 0
    for _ in range(cycles):
        for _ in range(3):
            value = _grant(engine, "again")
            regressions += value <= last
            last = value
        assert engine.forget_idle(10_00) >= 1  # "again" is idle: forgotten
        assert engine.records.peek("again") is None
    return regressions, cycles


def test_forgetting_and_recreating_a_scope_never_lowers_its_token():
    regressions, n = _forget_cycles(_memory_engine(scopes_max=100))
    print(f"\nforget and re-create a scope {n} times: token regressions {regressions} of {n}")
    assert regressions == 0


def test_forgetting_control_without_a_floor_regresses(monkeypatch):
    """The control: a store that forgets without folding into its floor hands out lower tokens again."""
    monkeypatch.setattr(MemoryRecords, "forgotten_floor", property(lambda self: 0, lambda self, v: None), raising=False)
    regressions, n = _forget_cycles(_memory_engine(scopes_max=100))
    print(f"\ncontrol (no floor): token regressions {regressions} of {n}")
    assert regressions > 0


def test_a_scope_in_lock_delay_or_with_a_waiter_is_not_forgotten():
    from stockade.core.leases import LeasePolicy

    clock = FakeClock(1_000_000_000)
    records = MemoryRecords(scopes_max=100)
    engine = LeaseEngine(records, cluster_id="0123456789abcdef", clock=clock, policy=LeasePolicy(lock_delay_ms=1000))
    lease_id = new_lease_id()
    engine.try_acquire("delayed", lease_id=lease_id, holder="h", ttl_ms=100, wait_deadline_ns=0)
    engine.try_acquire("queued", lease_id=new_lease_id(), holder="h", ttl_ms=60_000, wait_deadline_ns=0)
    engine.try_acquire("queued", lease_id=new_lease_id(), holder="w", ttl_ms=100,
                       wait_deadline_ns=clock.now_ns() + 10**12, live_until_ns=clock.now_ns() + 10**12)
    clock.advance(200_000_000)  # "delayed" expired: in lock-delay until 1.1 s
    assert engine.forget_idle(100) == 0
    clock.advance(2_000_000_000)
    assert engine.forget_idle(100) == 1  # the lock-delay is over; "queued" still has its holder and waiter
    assert records.peek("delayed") is None and records.peek("queued") is not None


def test_forgotten_scopes_in_the_file_and_fence_floors(tmp_path):
    """The file forgets too (the server's path), keeps the floor across opens, and names it in fence_floors."""
    path = tmp_path / "coord.db"
    with SQLiteCoordinator(path) as coord:
        kept = _grant(coord, "kept")
        gone = _grant(coord, "gone")
        gone = _grant(coord, "gone")
        assert coord.forget_idle(1) == 1  # the oldest idle one: "kept" (changed first)
        _grant(coord, "kept2")
        floors = coord.fence_floors()
    floors_map, default = (floors.floors, floors.default) if hasattr(floors, "floors") else floors
    assert "kept" not in floors_map and default >= kept
    assert floors_map["gone"] == gone
    with SQLiteCoordinator(path) as coord:
        again = _grant(coord, "kept")
        assert again > kept and again > default


def test_server_table_forgets_into_the_file(tmp_path):
    """The server's path: memory records at the cap forget, the file forgets the same scopes, a reload stays above."""
    path = tmp_path / "coord.db"
    file = SQLiteCoordinator(path, exclusive=True)

    def commit(changes):
        for error in file.records.commit_records(list(changes)):
            assert error is None

    epoch_floor_, forgotten = file.records.token_floor_now()
    table = MemoryRecords(file.records.records(), scopes_max=20, on_commit=commit, epoch_floor=epoch_floor_,
                          forgotten_floor=forgotten, wall_ns=time.time_ns)
    engine = LeaseEngine(table, cluster_id=file.cluster_id, clock=FakeClock(1_000_000_000), forget_batch=4)
    issued = {}
    for i in range(200):
        scope = f"s{i % 50}"
        issued[scope] = max(issued.get(scope, 0), _grant(engine, scope))
    file.close()
    stored = sqlite3.connect(path)
    assert stored.execute("SELECT COUNT(*) FROM scopes").fetchone()[0] <= 20
    stored.close()
    with SQLiteCoordinator(path) as coord:
        lower = sum(1 for scope, value in issued.items() if _grant(coord, scope) <= value)
    assert lower == 0


# -- time namespaces ----------------------------------------------------------------------------------


def test_monotonic_offset_is_read_from_timens_offsets(tmp_path):
    fake = tmp_path / "timens_offsets"
    fake.write_text("monotonic      100000         5\nboottime            0         0\n")
    assert monotonic_offset_ns(fake) == 100_000 * 10**9 + 5
    fake.write_text("1 -7 0\n7 0 0\n")  # older kernels print clock ids
    assert monotonic_offset_ns(fake) == -7 * 10**9
    assert monotonic_offset_ns(tmp_path / "missing") == 0


def test_a_file_with_leases_on_another_monotonic_clock_is_refused(tmp_path, monkeypatch):
    """Detection without a namespace: the opener's offsets file says its clock is 100,000 s ahead."""
    import stockade.coordinators.sqlite as sqlite_module

    path = tmp_path / "coord.db"
    fake = tmp_path / "timens_offsets"
    fake.write_text("monotonic      100000         0\nboottime            0         0\n")
    host, other = ("/nonexistent",), (str(fake),)
    holder = SQLiteCoordinator(path)
    lease_id = new_lease_id()
    holder.try_acquire("s", lease_id=lease_id, holder="h", ttl_ms=60_000, wait_deadline_ns=0)
    monkeypatch.setattr(sqlite_module.monotonic_offset_ns, "__defaults__", other)
    with pytest.raises(ClockMismatch, match="time namespace"):
        SQLiteCoordinator(path)  # a lease is held on the host's clock
    holder.release(lease_id)
    with pytest.raises(ClockMismatch, match="others have it open"):
        SQLiteCoordinator(path)  # idle, but the host's processes still use it
    holder.close()
    with SQLiteCoordinator(path) as coord:  # idle and alone: the file moves to this clock
        coord.try_acquire("s", lease_id=new_lease_id(), holder="ns", ttl_ms=60_000, wait_deadline_ns=0)
    monkeypatch.setattr(sqlite_module.monotonic_offset_ns, "__defaults__", host)
    with pytest.raises(ClockMismatch):  # now the host's opener is the stranger
        SQLiteCoordinator(path)


def _can_unshare_time() -> bool:
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--time", "--monotonic", "1000", "true"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_unshare_time(), reason="needs unshare --time (root, Linux 5.6+)")
def test_a_lease_from_another_time_namespace_is_refused_not_shown_wrong(tmp_path):
    """Finding 8: a lease taken under ``unshare --time --monotonic 100000`` is not shown as held for 100,001 s."""
    url = f"sqlite:///{tmp_path / 'coord.db'}?process=embedded"  # beside the test's own engine
    SQLiteCoordinator(tmp_path / "coord.db").close()  # made by a process of the host's namespace
    script = ("import sys, stockade\n"
              "try:\n"
              "    lease = stockade.connect(sys.argv[1]).acquire('s', ttl_ms=1000)\n"
              "    print('granted', lease.token.value)\n"
              "except stockade.BackendUnavailable as exc:\n"
              "    print(type(exc).__name__, exc)\n")
    busy = SQLiteCoordinator(tmp_path / "coord.db")  # the host's processes are using it
    busy.try_acquire("other", lease_id=new_lease_id(), holder="h", ttl_ms=60_000, wait_deadline_ns=0)
    result = subprocess.run(["unshare", "--time", "--monotonic", "100000", sys.executable, "-c", script, url],
                            capture_output=True, text=True, env=python_env(), timeout=60, check=False)
    busy.close()
    print(f"\nopen from another time namespace: {result.stdout.strip()}")
    assert result.stdout.startswith("ClockMismatch"), result.stdout + result.stderr
    info = stockade.connect(url).inspect("s")
    assert info.holder is None and info.remaining_ms == 0


def test_a_live_coordinator_file_is_opened_by_a_second_user_by_any_spelling_of_its_path(tmp_path):
    """Regression: the kind check read a live file (marker still in its -wal) through a url that named a host."""
    first = stockade.connect(f"sqlite:///{tmp_path}/coord.db?process=embedded")
    try:
        lease = first.acquire("live", ttl_ms=10_000)
        for url in (f"sqlite:///{tmp_path}/coord.db", f"sqlite:///{tmp_path}/coord.db", f"sqlite:////{tmp_path}/coord.db"):
            second = stockade.connect(f"{url}?process=embedded")
            try:
                assert second.inspect("live").token == lease.token
            finally:
                second.close()
    finally:
        first.close()
