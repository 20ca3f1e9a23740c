"""`stockade serve`'s record log (``coord.log``, `stockade.coordinators.sqlite._log`): what it acknowledges survives.

Real servers (subprocesses, kill -9), real files. Each test has a control that must fail:

- a torn or corrupt frame after the last acknowledged one is not applied, and nothing acknowledged is lost
  (control: the same frame written whole is applied, so the check sees what a frame changes);
- a log of a later generation than the file (an older copy of the file restored) is moved aside, not applied,
  and the next token is still above every token acknowledged before (control: a server with the token epochs
  off gives a token that went back);
- ``stockade status`` and ``stockade history``, the store's last-issued check and an embedded opener see a
  change that is still only in the log (control: the same reads without the log do not);
- a fold at the threshold keeps the log at its preallocated size (control: with the fold off it grows);
- a failed write fails the batch with `BackendUnavailable` and acknowledges nothing;
- a change that lowers a last token is refused before it reaches the log (control: its frame written anyway is
  folded into a row whose token went back).
- a fold (its events inserted in batches) writes the same rows as its changes written one by one, as a direct
  commit writes them, a scope granted and forgotten within one fold included (control: the batched fold without
  its scope trims leaves more events).

The kill -9 storm that checks no acknowledged grant is lost is tests/test_server_faults.py's (its controls:
acknowledging before the commit, and acknowledging without writing the frame).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
import time
from pathlib import Path

import pytest
from conftest import HELPERS

from stockade.cli import _readonly
from stockade.coordinators.sqlite import SQLiteCoordinator
from stockade.coordinators.sqlite import _log as record_log
from stockade.core.errors import BackendUnavailable, InvariantViolation
from stockade.core.leases import Lease, ScopeRecord
from stockade.core.tokens import FencingToken
from stockade.resources._issued import CoordinatorIssued

sys.path.insert(0, str(HELPERS))
from server_fixtures import cluster_id_of, request, start_server  # noqa: E402


def _cycles(url: str, scope: str, n: int) -> list[int]:
    """``n`` acquire + release cycles of ``scope``: the acknowledged tokens."""
    tokens = []
    for _ in range(n):
        status, _, body = request(url, "POST", f"/v1/locks/{scope}/acquire", json_body={"ttl_ms": 60_000})
        assert status == 200, body
        doc = json.loads(body)
        tokens.append(doc["token_value"])
        assert request(url, "DELETE", f"/v1/leases/{doc['lease_id']}")[0] == 204
    return tokens


def _hold(url: str, scope: str) -> dict[str, object]:
    status, _, body = request(url, "POST", f"/v1/locks/{scope}/acquire", json_body={"ttl_ms": 600_000})
    assert status == 200, body
    return json.loads(body)  # type: ignore[no-any-return]


def _last_token(url: str, scope: str) -> int:
    return int(json.loads(request(url, "GET", f"/v1/locks/{scope}")[2])["last_token"])


def _frames_end(data: bytes, cluster_id: str) -> tuple[int, int, int]:
    """``(offset after the log's run of frames, their generation, the last frame's number)``."""
    seed = record_log.cluster_seed(cluster_id)
    offset, generation, number = 0, 0, 0
    while (frame := record_log._valid_frame(data, offset, seed)) is not None and (
            number == 0 or frame[:2] == (generation, number + 1)):
        generation, number = frame[0], frame[1]
        offset += record_log._HEAD.size + len(frame[2])
    return offset, generation, number


def _killed_with_log(tmp_path: Path) -> tuple[Path, list[int], str]:
    """A server killed (-9) after acknowledged cycles of scope ``a`` that are only in its log."""
    proc = start_server(tmp_path / "data")
    try:
        acked = _cycles(proc.url, "a", 20)
    finally:
        proc.kill9()
    data = tmp_path / "data"
    assert _frames_end((data / "coord.log").read_bytes(), cluster_id_of(data / "coord.db"))[2] > 0  # in the log
    return data, acked, cluster_id_of(data / "coord.db")


def _forged_frame(data: Path, cluster_id: str, token: int) -> tuple[int, bytes]:
    """Where the next frame goes and a whole frame there granting scope ``a`` ``token`` (never acknowledged)."""
    end, generation, number = _frames_end((data / "coord.log").read_bytes(), cluster_id)
    lease = Lease("forged-lease-id-0000000000000000", "nobody", FencingToken(cluster_id, "a", token), 60_000, 1, 2)
    payload = record_log.encode_record(ScopeRecord("a", token, lease), "a", 0)
    return end, record_log.encode_frame(record_log.cluster_seed(cluster_id), generation, number + 1, payload)


def _write_at(path: Path, offset: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


@pytest.mark.parametrize("damage", ["torn", "corrupt", "control-whole"])
def test_a_torn_or_corrupt_tail_is_ignored_and_nothing_acknowledged_is_lost(tmp_path, damage):
    data, acked, cluster_id = _killed_with_log(tmp_path)
    forged = max(acked) + 1_000  # above every acknowledged token (tokens carry an epoch: large numbers)
    offset, frame = _forged_frame(data, cluster_id, forged)
    if damage == "torn":  # the write stopped part way: its last bytes never reached the disk
        frame = frame[:-7]
    elif damage == "corrupt":
        frame = frame[:-3] + bytes([frame[-3] ^ 0x40]) + frame[-2:]
    _write_at(data / "coord.log", offset, frame)
    proc = start_server(data)
    try:
        last = _last_token(proc.url, "a")
    finally:
        proc.stop()
    assert last >= max(acked), "an acknowledged grant was lost"
    if damage == "control-whole":
        assert last == forged  # a whole frame is applied: the check above would see a lost or extra change
    else:
        assert last < forged, f"a {damage} frame was applied"


def _restore_run(tmp_path: Path, control: str | None) -> tuple[list[int], int, Path]:
    data = tmp_path / "data"
    proc = start_server(data)
    first = _cycles(proc.url, "a", 5)
    proc.stop()  # a clean stop: everything folded into the file
    backup = tmp_path / "backup"
    backup.mkdir()
    for name in ("coord.db", "coord.keys"):
        shutil.copy2(data / name, backup / name)
    proc = start_server(data)
    later = _cycles(proc.url, "a", 30)  # only in the log (and the live file's later generation)
    proc.kill9()
    for name in ("coord.db-wal", "coord.db-shm"):
        (data / name).unlink(missing_ok=True)
    shutil.copy2(backup / "coord.db", data / "coord.db")  # the older copy is restored; its log stays beside it
    proc = start_server(data, control=control)
    try:
        token = int(_hold(proc.url, "a")["token_value"])
    finally:
        proc.stop()
    return first + later, token, data


def test_a_log_of_a_later_generation_is_moved_aside_and_tokens_still_rise(tmp_path):
    acked, token, data = _restore_run(tmp_path, None)
    aside = list(data.glob("coord.log.*.stale"))
    assert len(aside) == 1, list(data.iterdir())
    assert token > max(acked)
    # Not applied: the restored file's scope row is as backed up, then the new grant (in the new epoch).
    assert any("later than the file" in path.read_text() for path in data.glob("server-*.log"))


def test_control_a_restore_without_the_epoch_rule_gives_a_token_that_went_back(tmp_path):
    acked, token, _ = _restore_run(tmp_path, "epochs-off")
    assert token <= max(acked)


def _live_server_with_logged_change(tmp_path: Path):  # type: ignore[no-untyped-def]
    proc = start_server(tmp_path / "data")
    lease = _hold(proc.url, "live")
    db = tmp_path / "data" / "coord.db"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:  # the grant is acknowledged and only in the log: the file's rows do not have it yet
        assert conn.execute("SELECT 1 FROM scopes WHERE scope = 'live'").fetchone() is None
    finally:
        conn.close()
    return proc, lease, db


def test_status_history_and_the_store_see_a_change_only_in_the_log(tmp_path):
    proc, lease, db = _live_server_with_logged_change(tmp_path)
    try:
        info, _ = _readonly.read_scope(db, time.monotonic_ns(), "live")
        assert info is not None and info.holder is not None and info.last_token == lease["token_value"]
        events, _ = _readonly.read_history(db, "live", 10)
        assert [(e.kind, e.token_value) for e in events] == [("grant", lease["token_value"])]
        assert CoordinatorIssued(db)("live", int(lease["token_value"])) == lease["token_value"]  # type: ignore[arg-type]
        # The server's own history route folds the log first.
        served = json.loads(request(proc.url, "GET", "/v1/locks/live/history")[2])["events"]
        assert [(e["kind"], e["token_value"]) for e in served] == [("grant", lease["token_value"])]
    finally:
        proc.stop()


def test_control_the_same_reads_without_the_log_miss_the_change(tmp_path, monkeypatch):
    proc, lease, db = _live_server_with_logged_change(tmp_path)
    monkeypatch.setattr(record_log, "logged_changes", lambda *args: ([], False))
    try:
        info, _ = _readonly.read_scope(db, time.monotonic_ns(), "live")
        events, _ = _readonly.read_history(db, "live", 10)
        assert info is None and events == []
        assert CoordinatorIssued(db)("live", int(lease["token_value"])) < lease["token_value"]  # type: ignore[operator]
    finally:
        proc.stop()


def test_an_embedded_opener_applies_the_log_a_killed_server_left(tmp_path):
    data, acked, _ = _killed_with_log(tmp_path)
    with SQLiteCoordinator(data / "coord.db") as coordinator:
        assert coordinator.records.records()["a"].last_token == max(acked)
        assert [e.token_value for e in coordinator.records.history("a", 100) if e.kind == "grant"] == acked


def _appends(log: record_log.RecordLog, cluster_id: str, cycles: int, per_batch: int = 1) -> None:
    """``cycles`` grant + release cycles of scope ``s``, ``per_batch`` cycles a batch (one frame)."""
    record, batch = ScopeRecord("s"), []
    for token in range(1, cycles + 1):
        lease = Lease(f"lease-{token:032d}", "h", FencingToken(cluster_id, "s", token), 1000, 1, 2)
        granted = ScopeRecord("s", token, lease)
        released = ScopeRecord("s", token)
        batch += [(record, granted), (granted, released)]
        record = released
        if len(batch) == 2 * per_batch:
            log.commit_records(batch)
            batch = []


@pytest.mark.parametrize("fold", ["on", "control-off"])
def test_folds_keep_the_log_at_its_size(tmp_path, fold, monkeypatch):
    log_bytes = 2 * record_log.FOLD_MARGIN_BYTES
    with SQLiteCoordinator(tmp_path / "coord.db", exclusive=True) as coordinator:
        log = coordinator.records.open_log(log_bytes=log_bytes, fold_changes=1000)
        if fold == "control-off":
            monkeypatch.setattr(log, "_fold_locked", lambda: None)
        _appends(log, coordinator.cluster_id, 20_000, per_batch=50)  # ~3 MB of frames in 400 batches
        grown = os.stat(log.path).st_size
        if fold == "control-off":
            assert grown > log_bytes
            return
        assert grown == log_bytes and log.folds >= 39
        log.close()
        assert coordinator.records.records()["s"].last_token == 20_000
        assert len(coordinator.records.history("s", 100)) == 100


def test_a_failed_write_fails_the_batch_and_acknowledges_nothing(tmp_path):
    with SQLiteCoordinator(tmp_path / "coord.db", exclusive=True) as coordinator:
        log = coordinator.records.open_log()
        _appends(log, coordinator.cluster_id, 3)
        writable, log.fd = log.fd, os.open(log.path, os.O_RDONLY)  # every write now fails (EBADF), as a full disk
        try:
            with pytest.raises(BackendUnavailable):
                _appends(log, coordinator.cluster_id, 1)
            assert (len(log.pending), log.number) == (6, 3)  # nothing of the failed batch counts
        finally:
            os.close(log.fd)
            log.fd = writable
        log.close()
        assert coordinator.records.records()["s"].last_token == 3


@pytest.mark.parametrize("check", ["on", "control-unchecked"])
def test_a_change_that_lowers_a_token_is_refused_not_logged(tmp_path, check):
    """A change that breaks C1 never reaches the log: a fold writes each scope's row once, from its first old to its
    last new record, so it would not see the token go back in between."""
    path = tmp_path / "coord.db"
    going_back = [(ScopeRecord("s", 3), ScopeRecord("s", 2))]
    with SQLiteCoordinator(path, exclusive=True) as coordinator:
        log = coordinator.records.open_log()
        _appends(log, coordinator.cluster_id, 3)
        if check == "on":
            with pytest.raises(InvariantViolation):
                log.commit_records(going_back)
            assert log.appends == 3
            log.close()
        else:  # the frame an append without the check would write, then a crash (no fold)
            payload = record_log.encode_record(going_back[0][1], "s", 0)
            frame = record_log.encode_frame(record_log.cluster_seed(coordinator.cluster_id), log.generation, 4,
                                            payload)
            _write_at(log.path, log.offset, frame)
            os.close(log.fd)
    with SQLiteCoordinator(path) as coordinator:
        last = coordinator.records.records()["s"].last_token
    if check == "on":
        assert last == 3
    else:  # the fold writes the scope's row once (first old -> last new), where the token went back
        assert last == 2


def _lock_cycles(cluster_id: str, records: dict[str, ScopeRecord], cycles: int, at_ms: int
                 ) -> list[record_log.PendingChange]:
    """``cycles`` grant + end cycles round the scopes of ``records`` (changed in place), as a fold's pending changes:
    every seventh lease expires rather than being released, and the last change forgets an idle scope."""
    pending: list[record_log.PendingChange] = []
    names = sorted(records)
    for n in range(cycles):
        old = records[names[n % len(names)]]
        token = old.last_token + 1
        lease = Lease(f"lease-{old.scope}-{token:024d}", f"h{n % 3}", FencingToken(cluster_id, old.scope, token),
                      1000, 10, 20)
        granted = ScopeRecord(old.scope, token, lease)
        ended = ScopeRecord(old.scope, token, delay_until_ns=20 if token % 7 == 0 else 0)  # 20: expired
        pending += [(old, granted, at_ms + n), (granted, ended, at_ms + n)]
        records[old.scope] = ended
    scope = f"idle-{at_ms}"  # granted, released and forgotten within one fold: the floor keeps its token (C1)
    lease = Lease(f"lease-{scope}", "h", FencingToken(cluster_id, scope, 1), 1000, 10, 20)
    granted, idle = ScopeRecord(scope, 1, lease), ScopeRecord(scope, 1)
    pending += [(ScopeRecord(scope), granted, at_ms), (granted, idle, at_ms), (idle, None, at_ms)]
    return pending


def _file_rows(path: Path) -> dict[str, list[tuple[object, ...]]]:
    conn = sqlite3.connect(path)
    try:
        return {table: conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()  # noqa: S608
                for table in ("scopes", "waiters", "history", "history_recent", "meta")}
    finally:
        conn.close()


def _reference_apply(conn: sqlite3.Connection, pending: list[record_log.PendingChange]) -> None:
    """What a direct commit writes, change by change (`store_record` with the change's time): the fold's reference."""
    from stockade.coordinators.sqlite._journal import journal_change
    from stockade.coordinators.sqlite._rows import write_record
    for old, new, at_ms in pending:
        journal_change(conn, old, new, at_ms)
        write_record(conn, old, new)


@pytest.mark.parametrize("fold", ["batched", "control-no-scope-trims"])
def test_a_fold_writes_the_same_rows_as_the_changes_written_one_by_one(tmp_path, fold, monkeypatch):
    """A fold journals its changes in batches (one executemany between two trims) and writes each scope's row once;
    the file's every row must be those of the same changes written one by one, as a direct commit writes them:
    numbers, trims (a scope's at every 32nd token, the file's moves every 100 events) and rows. Control: the batched
    fold without the scope trims leaves rows the reference does not."""
    import stockade.coordinators.sqlite as sqlite_package
    from stockade.coordinators.sqlite import _journal
    files = {}
    for way in ("fold", "reference"):
        files[way] = tmp_path / f"{way}.db"
        with SQLiteCoordinator(files[way], exclusive=True) as coordinator:
            with monkeypatch.context() as patch:
                if way == "reference":
                    patch.setattr(sqlite_package, "apply_log_changes", _reference_apply)
                elif fold != "batched":
                    patch.setattr(_journal, "_TRIM_SCOPE", "SELECT ?, ?, ?")
                records = {f"s{i}": ScopeRecord(f"s{i}") for i in range(5)}
                for generation in range(1, 5):  # past 100 events of a scope: its trims delete
                    cycles, at_ms = 300 + 37 * generation, 1_000_000 * generation
                    pending = _lock_cycles(coordinator.cluster_id, records, cycles, at_ms)
                    coordinator.records.fold_log(pending, generation)
    fold_rows, reference_rows = _file_rows(files["fold"]), _file_rows(files["reference"])
    for rows in (fold_rows, reference_rows):  # of the meta, what changes write (the rest is each file's own)
        rows["meta"] = [(k, v) for k, v in rows["meta"] if k == "forgotten_floor"]
    assert len(reference_rows["history"]) > 400 and reference_rows["history_recent"]
    if fold == "batched":
        assert fold_rows == reference_rows
    else:
        assert len(fold_rows["history"]) > len(reference_rows["history"])
