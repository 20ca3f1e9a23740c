"""The fenced store (stockade.resources.store): rules R1-R6 one by one, bad input, and a model check.

Every rejection test also checks that nothing changed, by comparing a dump of
every table in the file (kv, hwm, audit, idempotency, counters, meta) taken
through a separate connection.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stockade import metrics
from stockade.core.errors import BackendUnavailable, InvalidArgument, StaleToken, TokenMismatch
from stockade.core.limits import LIST_PAGE_MAX
from stockade.core.tokens import FencingToken
from stockade.core.values import FenceFloors
from stockade.resources import _observe
from stockade.resources.store import AuditRecord, SQLiteStore, WriteResult, restore
from stockade.testing.mutants import FencingOffStore, StrictGreaterStore

CLUSTER = "0123456789abcdef"
OTHER_CLUSTER = "fedcba9876543210"


def tok(value: int, scope: str = "a", cluster: str = CLUSTER) -> FencingToken:
    return FencingToken(cluster, scope, value)


def dump(path: Path) -> dict[str, list[tuple]]:
    """Every row of every table, through a connection of its own."""
    conn = sqlite3.connect(str(path))
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in tables}
    finally:
        conn.close()


@pytest.fixture
def store(tmp_path):
    with SQLiteStore(tmp_path / "store.db", cluster_id=CLUSTER, keys="unsigned") as s:
        yield s


# -- opening -----------------------------------------------------------------------------------


def test_new_file_requires_cluster_id_and_creates_nothing(tmp_path):
    path = tmp_path / "new.db"
    with pytest.raises(InvalidArgument) as info:
        SQLiteStore(path, keys="unsigned")
    assert info.value.field == "cluster_id"
    assert not path.exists()


def test_existing_file_reads_cluster_and_refuses_another(tmp_path):
    path = tmp_path / "s.db"
    SQLiteStore(path, cluster_id=CLUSTER, keys="unsigned").close()
    with SQLiteStore(path, keys="unsigned") as s:
        assert s.cluster_id == CLUSTER and s.path == path
    with SQLiteStore(path, cluster_id=CLUSTER, keys="unsigned") as s:
        assert s.cluster_id == CLUSTER
    before = dump(path)
    with pytest.raises(InvalidArgument):
        SQLiteStore(path, cluster_id=OTHER_CLUSTER, keys="unsigned")
    with pytest.raises(InvalidArgument):
        SQLiteStore(path, cluster_id="not-hex", keys="unsigned")
    assert dump(path) == before


def test_refuses_a_file_that_is_not_a_store(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(str(path))
    conn.execute("CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT)")
    conn.execute("INSERT INTO meta VALUES ('cluster_id', ?)", (CLUSTER,))
    conn.commit()
    conn.close()
    with pytest.raises(InvalidArgument):
        SQLiteStore(path, keys="unsigned")


@pytest.mark.parametrize(
    "kwargs",
    [{"value_bytes_max": -1}, {"value_bytes_max": 1.5}, {"busy_timeout_ms": 10**9}, {"busy_timeout_ms": True},
     {"audit_records_max": 0}, {"idempotency_keys_max": 10**9}],
)
def test_bad_constructor_arguments(tmp_path, kwargs):
    with pytest.raises(InvalidArgument):
        SQLiteStore(tmp_path / "s.db", cluster_id=CLUSTER, keys="unsigned", **kwargs)
    assert not (tmp_path / "s.db").exists()


# -- basic operations ----------------------------------------------------------------------------


def test_put_get_delete_list(store):
    r1 = store.put("a", "k1", b"one", token=tok(1))
    assert r1 == WriteResult("a", "k1", 1, 1, 1, False)
    store.put("a", "k2", "two", token=tok(1))  # str is stored as UTF-8
    store.put("a", "k3", bytearray(b"three"), token=tok(2))
    item = store.get("a", "k2")
    assert (item.value, item.token_value, item.commit_seq) == (b"two", 1, 2)
    assert store.get("a", "missing") is None
    assert store.get("b", "k1") is None  # scopes are separate namespaces
    assert [i.key for i in store.list("a")] == ["k1", "k2", "k3"]
    assert [i.key for i in store.list("a", after="k1", limit=1)] == ["k2"]
    r = store.delete("a", "k1", token=tok(2))
    assert (r.commit_seq, r.token_value) == (4, 2)
    assert store.get("a", "k1") is None
    store.delete("a", "never-there", token=tok(2))  # a fenced, audited write all the same
    assert [(a.commit_seq, a.key, a.op) for a in store.audit("a")] == [
        (1, "k1", "put"), (2, "k2", "put"), (3, "k3", "put"), (4, "k1", "delete"), (5, "never-there", "delete")]
    assert store.high_water("a") == 2 and store.high_water("b") == 0
    assert store.high_waters() == {"a": 2}
    assert store.commit_seq() == 5


def test_audit_paging_and_scope_filter(store):
    for i in range(5):
        store.put("a" if i % 2 else "b", f"k{i}", b"", token=tok(1, "a" if i % 2 else "b"))
    assert [r.commit_seq for r in store.audit(after_seq=2, limit=2)] == [3, 4]
    assert [r.commit_seq for r in store.audit("a")] == [2, 4]


def test_encoded_token_string_is_accepted(store):
    assert store.put("a", "k", b"v", token=tok(7).encode()).token_value == 7
    with store.transaction("a", token=tok(7).encode()) as tx:
        tx.put("k", b"w")
    assert store.get("a", "k").value == b"w"


def test_values_up_to_the_configured_bound(tmp_path):
    with SQLiteStore(tmp_path / "s.db", cluster_id=CLUSTER, value_bytes_max=10, keys="unsigned") as s:
        s.put("a", "k", b"x" * 10, token=tok(1))
        s.put("a", "empty", b"", token=tok(1))
        with pytest.raises(InvalidArgument):
            s.put("a", "k", b"x" * 11, token=tok(1))


# -- the fence: R1, R2 ---------------------------------------------------------------------------


def test_equal_token_accepted_many_times(store):
    for i in range(20):
        store.put("a", f"k{i % 3}", str(i), token=tok(5))
    assert store.high_water("a") == 5
    assert len(store.audit("a")) == 20


def test_stale_token_raises_with_fields_and_changes_nothing(store):
    store.put("a", "k", b"new", token=tok(5))
    before = dump(store.path)
    with pytest.raises(StaleToken) as info:
        store.put("a", "k", b"old", token=tok(4))
    assert info.value.token == tok(4) and info.value.high_water == 5
    with pytest.raises(StaleToken):
        store.delete("a", "k", token=tok(1))
    assert dump(store.path) == before
    assert store.get("a", "k").value == b"new"


def test_higher_token_raises_the_mark_and_lower_is_fenced_out(store):
    store.put("a", "k", b"1", token=tok(1))
    store.put("a", "k", b"3", token=tok(3))
    with pytest.raises(StaleToken):
        store.put("a", "k", b"2", token=tok(2))
    assert store.high_water("a") == 3


@pytest.mark.parametrize(
    "bad, reason",
    [(tok(9, scope="b"), "wrong-scope"), (tok(9, cluster=OTHER_CLUSTER), "wrong-cluster"),
     (tok(1, scope="b"), "wrong-scope")],
)
def test_token_of_another_scope_or_cluster_is_never_compared(store, bad, reason):
    store.put("a", "k", b"v", token=tok(5))
    before = dump(store.path)
    with pytest.raises(TokenMismatch) as info:
        store.put("a", "k", b"evil", token=bad)
    assert info.value.reason == reason
    with pytest.raises(TokenMismatch):
        with store.transaction("a", token=bad):
            pass
    assert dump(store.path) == before


def test_high_water_and_seq_survive_reopen(tmp_path):
    path = tmp_path / "s.db"
    with SQLiteStore(path, cluster_id=CLUSTER, keys="unsigned") as s:
        s.put("a", "k", b"v", token=tok(9))
        s.put("b", "k", b"v", token=tok(2, "b"))
    with SQLiteStore(path, keys="unsigned") as s:
        assert s.high_waters() == {"a": 9, "b": 2}
        with pytest.raises(StaleToken):
            s.put("a", "k", b"zombie", token=tok(8))
        assert s.put("a", "k", b"w", token=tok(9)).commit_seq == 3


def test_two_objects_on_one_file_share_the_mark(tmp_path):
    path = tmp_path / "s.db"
    with SQLiteStore(path, cluster_id=CLUSTER, keys="unsigned") as s1, SQLiteStore(path, keys="unsigned") as s2:
        s1.put("a", "k", b"v", token=tok(4))
        with pytest.raises(StaleToken):
            s2.put("a", "k", b"v", token=tok(3))
        s2.put("a", "k", b"v", token=tok(4))


# -- R5: every rejection observable -------------------------------------------------------------------


@pytest.fixture
def fresh_rejection_log(monkeypatch):
    """A rate limit of its own, so that rejections made by earlier tests cannot use up this one's lines."""
    monkeypatch.setattr(_observe, "_limit", _observe.RejectionLog())


@pytest.mark.parametrize(
    "token, reason",
    [(tok(3), "stale"), (tok(9, scope="other"), "wrong-scope"),
     (tok(9, scope="r5", cluster=OTHER_CLUSTER), "wrong-cluster")],
)
def test_rejection_is_logged_and_counted(store, caplog, fresh_rejection_log, token, reason):
    store.put("r5", "k", b"v", token=tok(5, "r5"))
    if token.scope == "a":
        token = tok(token.value, "r5")
    counted = metrics.FENCE_REJECTIONS.value(reason=reason)
    with caplog.at_level(logging.WARNING, logger="stockade.fence"):
        with pytest.raises((StaleToken, TokenMismatch)):
            store.put("r5", "k", b"v", token=token)
    records = [r for r in caplog.records if r.name == "stockade.fence"]
    assert len(records) == 1
    record = records[0]
    assert record.resource == store.resource
    assert (record.scope, record.token, record.high_water, record.reason) == ("r5", token.encode(), 5, reason)
    assert reason in record.getMessage() and "r5" in record.getMessage()
    assert metrics.FENCE_REJECTIONS.value(reason=reason) == counted + 1
    assert f'stockade_fence_rejections_total{{reason="{reason}"}}' in metrics.REGISTRY.render()


def test_accepted_writes_and_replays_are_not_counted_as_rejections(store, caplog):
    store.put("quiet", "k", b"v", token=tok(5, "quiet"), idempotency_key="once")
    counted = metrics.FENCE_REJECTIONS.value(reason="stale")
    with caplog.at_level(logging.DEBUG, logger="stockade.fence"):
        store.put("quiet", "k", b"v", token=tok(5, "quiet"))
        store.put("quiet", "k2", b"v", token=tok(6, "quiet"))
        store.put("quiet", "k", b"v", token=tok(5, "quiet"), idempotency_key="once")  # stale, but a replay
    assert not [r for r in caplog.records if r.name == "stockade.fence"]
    assert metrics.FENCE_REJECTIONS.value(reason="stale") == counted


# -- R3: idempotency ---------------------------------------------------------------------------------


def test_idempotency_key_replays_the_original_result(store):
    first = store.put("a", "k", b"v", token=tok(3), idempotency_key="op-1")
    after_first = dump(store.path)
    again = store.put("a", "k", b"v", token=tok(3), idempotency_key="op-1")
    assert again == WriteResult("a", "k", 3, 3, first.commit_seq, replayed=True)
    assert dump(store.path) == after_first  # applied nothing: no audit record, no seq


def test_idempotency_replay_even_after_the_token_went_stale(store):
    first = store.put("a", "k", b"v", token=tok(3), idempotency_key="op-1")
    store.put("a", "k", b"newer", token=tok(4))
    before = dump(store.path)
    again = store.put("a", "k", b"v", token=tok(3), idempotency_key="op-1")
    assert again.replayed and again.commit_seq == first.commit_seq and again.token_value == 3
    assert dump(store.path) == before
    assert store.get("a", "k").value == b"newer"  # the replay did not write the old value back
    deleted = store.delete("a", "k", token=tok(4), idempotency_key="del-1")
    assert store.delete("a", "k", token=tok(4), idempotency_key="del-1") == WriteResult(
        "a", "k", 4, 4, deleted.commit_seq, replayed=True)


def test_idempotency_key_reused_for_another_operation_is_refused(store):
    store.put("a", "k", b"v", token=tok(3), idempotency_key="op-1")
    before = dump(store.path)
    for call in (lambda: store.put("a", "k", b"other", token=tok(3), idempotency_key="op-1"),
                 lambda: store.put("a", "k2", b"v", token=tok(3), idempotency_key="op-1"),
                 lambda: store.delete("a", "k", token=tok(3), idempotency_key="op-1")):
        with pytest.raises(InvalidArgument) as info:
            call()
        assert info.value.field == "idempotency_key"
    assert dump(store.path) == before
    # the same key in another scope is another operation
    assert not store.put("b", "k", b"other", token=tok(1, "b"), idempotency_key="op-1").replayed


def test_idempotency_replay_needs_a_token_of_this_scope_and_cluster(store):
    store.put("a", "k", b"v", token=tok(3), idempotency_key="op-1")
    with pytest.raises(TokenMismatch):
        store.put("a", "k", b"v", token=tok(3, cluster=OTHER_CLUSTER), idempotency_key="op-1")


def test_idempotency_keys_are_a_bounded_window_of_the_newest(tmp_path):
    with SQLiteStore(tmp_path / "s.db", cluster_id=CLUSTER, idempotency_keys_max=3, keys="unsigned") as s:
        for i in range(4):
            s.put("a", f"k{i}", b"v", token=tok(1), idempotency_key=f"i{i}")
        rows = dump(s.path)["idempotency"]
        assert sorted(r[1] for r in rows) == ["i1", "i2", "i3"]  # the oldest key is forgotten
        # within the window a retry replays, even with a newer token (R3)
        assert s.put("a", "k1", b"v", token=tok(2), idempotency_key="i1").replayed
        # outside it, a retry is a new operation (documented)
        assert not s.put("a", "k0", b"v", token=tok(2), idempotency_key="i0").replayed


def test_audit_trail_is_bounded_and_seq_keeps_counting(tmp_path):
    with SQLiteStore(tmp_path / "s.db", cluster_id=CLUSTER, audit_records_max=5, keys="unsigned") as s:
        for i in range(12):
            s.put("a", "k", str(i), token=tok(1))
        assert [r.commit_seq for r in s.audit()] == [8, 9, 10, 11, 12]
        assert s.put("a", "k", b"x", token=tok(1)).commit_seq == 13


# -- R6: transactions ----------------------------------------------------------------------------------


def test_transaction_commits_all_steps(store):
    with store.transaction("a", token=tok(2)) as tx:
        assert tx.put("x", b"1").token_value == 2
        assert tx.get("x").value == b"1"  # sees its own step
        tx.put("y", b"2")
        tx.delete("x")
    assert store.get("a", "x") is None and store.get("a", "y").value == b"2"
    assert [(r.key, r.op) for r in store.audit("a")] == [("x", "put"), ("y", "put"), ("x", "delete")]
    assert store.high_water("a") == 2


def test_transaction_aborts_entirely_on_exception(store):
    store.put("a", "x", b"0", token=tok(1))
    before = dump(store.path)
    with pytest.raises(RuntimeError):
        with store.transaction("a", token=tok(2)) as tx:
            tx.put("x", b"1")
            tx.put("y", b"2")
            raise RuntimeError("boom")
    assert dump(store.path) == before  # steps and the raised mark are all rolled back


def test_transaction_with_stale_token_refused_at_begin(store):
    store.put("a", "x", b"0", token=tok(5))
    before = dump(store.path)
    with pytest.raises(StaleToken):
        with store.transaction("a", token=tok(4)):
            pytest.fail("the body must not run")
    assert dump(store.path) == before


def test_transaction_misuse(store):
    with store.transaction("a", token=tok(1)) as tx:
        # The transaction holds no lock while its block runs, so the store itself stays usable.
        store.put("a", "outside", b"v", token=tok(1))
        with pytest.raises(InvalidArgument):
            tx.put("k", b"x" * (store.value_bytes_max + 1))
        tx.put("k", b"ok")  # a refused step changed nothing and the tx goes on
    with pytest.raises(InvalidArgument):
        tx.put("late", b"v")
    assert store.get("a", "k").value == b"ok" and store.get("a", "late") is None


def test_transaction_does_not_block_others_and_aborts_whole_under_a_higher_token(tmp_path):
    path = tmp_path / "s.db"
    with SQLiteStore(path, cluster_id=CLUSTER, keys="unsigned") as s1, \
            SQLiteStore(path, busy_timeout_ms=1_000, keys="unsigned") as s2:
        before = dump(path)
        with pytest.raises(StaleToken):
            with s1.transaction("a", token=tok(1)) as tx:
                tx.put("k", b"L1")
                assert s2.get("a", "k") is None  # buffered: not visible outside before the commit
                s2.put("other", "k", b"v", token=tok(1, "other"))  # no lock held: other writers go on
                s2.put("a", "k", b"H", token=tok(2))  # a higher token lands meanwhile
                tx.put("k2", b"L2")
        # R6: the lower transaction aborted entirely (the commit re-checked the mark); H's write stands
        assert s1.get("a", "k").value == b"H" and s1.get("a", "k2") is None
        assert [(r.scope, r.token_value) for r in s1.audit()] == [("other", 1), ("a", 2)]
        assert dump(path)["hwm"] == sorted(before["hwm"] + [("a", 2), ("other", 1)])


def test_transaction_results_get_their_seq_at_commit(store):
    store.put("a", "k", b"v", token=tok(1))
    with store.transaction("a", token=tok(1)) as tx:
        assert tx.put("x", b"1").commit_seq == 0  # pending until the commit
        assert tx.get("k").value == b"v" and tx.get("x").value == b"1"
        tx.delete("k")
        assert tx.get("k") is None
        assert tx.results is None
    assert [(r.key, r.commit_seq) for r in tx.results] == [("x", 2), ("k", 3)]


def test_busy_store_fails_with_certain_no_effect(tmp_path):
    path = tmp_path / "s.db"
    with SQLiteStore(path, cluster_id=CLUSTER, keys="unsigned") as s1, \
            SQLiteStore(path, busy_timeout_ms=50, keys="unsigned") as s2:
        with s1.admitted(tok(1), "a"):  # the port's locked unit holds the write lock
            with pytest.raises(BackendUnavailable) as info:
                s2.put("a", "k", b"v", token=tok(2))
        assert info.value.certain_no_effect
    with SQLiteStore(path, busy_timeout_ms=50, keys="unsigned") as shared:
        errors = []
        with shared.admitted(tok(2), "a"):
            t = threading.Thread(target=lambda: errors.append(_catch(lambda: shared.high_water("a"))))
            t.start()
            t.join()
        assert isinstance(errors[0], BackendUnavailable) and errors[0].certain_no_effect


def _catch(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc
    return None


def test_closed_store_is_unavailable(tmp_path):
    s = SQLiteStore(tmp_path / "s.db", cluster_id=CLUSTER, keys="unsigned")
    s.close()
    s.close()  # idempotent
    with pytest.raises(BackendUnavailable):
        s.get("a", "k")


# -- R4: backup and restore ------------------------------------------------------------------------------


def test_backup_and_restore_with_fence_floor_and_report(tmp_path):
    path, backup_path, report_path = tmp_path / "s.db", tmp_path / "b.db", tmp_path / "report.json"
    with SQLiteStore(path, cluster_id=CLUSTER, keys="unsigned") as s:
        s.put("a", "k", b"before", token=tok(3))
        info = s.backup(backup_path)
        assert (info.commit_seq, info.high_waters, info.path) == (1, {"a": 3}, backup_path)
        s.put("a", "k", b"after", token=tok(4), idempotency_key="late")
        s.put("new", "k", b"after", token=tok(2, "new"))
    # the coordinator has since issued token 6 for "a" (the current holder) and 2 for "new"
    report = restore(backup_path, path, fence_floors={"a": 6, "new": 2}, floors_complete=True,
                     report_path=report_path)
    assert report.removed == [AuditRecord(2, "a", "k", "put", 4, "late"), AuditRecord(3, "new", "k", "put", 2, None)]
    assert report.fence_floors == {"a": 6, "new": 2}
    document = json.loads(report_path.read_text())
    assert document["removed_complete"] is True and document["old_store"]["state"] == "present"
    assert [r["commit_seq"] for r in document["removed"]] == [2, 3]
    assert document["high_waters_after"] == {"a": 6, "new": 2}
    with SQLiteStore(path, keys="unsigned") as s:
        assert s.get("a", "k").value == b"before"
        assert s.high_waters() == {"a": 6, "new": 2}
        for zombie in (tok(3), tok(4), tok(5)):  # holders from before the restore are fenced out (P5)
            with pytest.raises(StaleToken):
                s.put("a", "k", b"zombie", token=zombie)
        with pytest.raises(StaleToken):
            s.put("new", "k", b"zombie", token=tok(1, "new"))
        r = s.put("a", "k", b"current", token=tok(6))  # the current holder continues
        assert r.commit_seq == 4  # after the old store's 3: never reused
        # the lost idempotency key is gone with its write; the retry is a new, current write
        assert not s.put("a", "k", b"after", token=tok(6), idempotency_key="late").replayed


def test_restore_takes_max_of_backup_mark_floor_and_old_store(tmp_path):
    path, backup_path = tmp_path / "s.db", tmp_path / "b.db"
    with SQLiteStore(path, cluster_id=CLUSTER, keys="unsigned") as s:
        s.put("a", "k", b"v", token=tok(8))
        s.put("b", "k", b"v", token=tok(2, "b"))
        s.backup(backup_path)
        s.put("b", "k", b"v", token=tok(5, "b"))
    report = restore(backup_path, path, fence_floors=FenceFloors({"a": 1}, default=3), report_path=tmp_path / "r.json")
    assert report.fence_floors == {"a": 1, "b": 3}  # "b" is not named: the default covers it
    assert report.raised == {"b": (2, 5)}  # only "b" ends above the backup's mark (the old store's 5)
    with SQLiteStore(path, keys="unsigned") as s:
        # a floor below the backup's mark never lowers it; the old store's 5 is kept too
        assert s.high_waters() == {"a": 8, "b": 5}


def test_restore_without_old_store_says_so(tmp_path):
    path, backup_path, report_path = tmp_path / "s.db", tmp_path / "b.db", tmp_path / "r.json"
    with SQLiteStore(path, cluster_id=CLUSTER, keys="unsigned") as s:
        s.put("a", "k", b"v", token=tok(2))
        s.backup(backup_path)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    report = restore(backup_path, path, fence_floors={"a": 4, "gone": 7}, floors_complete=True,
                     report_path=report_path)
    assert report.removed == []
    document = json.loads(report_path.read_text())
    assert document["old_store"]["state"] == "missing" and document["removed_complete"] is False
    with SQLiteStore(path, keys="unsigned") as s:
        assert s.high_waters() == {"a": 4, "gone": 7}


def test_restore_report_says_when_the_audit_no_longer_covers_the_gap(tmp_path):
    path, backup_path, report_path = tmp_path / "s.db", tmp_path / "b.db", tmp_path / "r.json"
    with SQLiteStore(path, cluster_id=CLUSTER, audit_records_max=3, keys="unsigned") as s:
        s.put("a", "k", b"v", token=tok(1))
        s.backup(backup_path)
        for i in range(6):
            s.put("a", f"k{i}", b"v", token=tok(2))
    report = restore(backup_path, path, fence_floors={}, floors_complete=True, report_path=report_path)
    assert [r.commit_seq for r in report.removed] == [5, 6, 7]
    assert json.loads(report_path.read_text())["removed_complete"] is False


def test_restore_refusals_change_nothing(tmp_path):
    path, backup_path = tmp_path / "s.db", tmp_path / "b.db"
    with SQLiteStore(path, cluster_id=CLUSTER, keys="unsigned") as s:
        s.put("a", "k", b"v", token=tok(2))
        s.backup(backup_path)
        s.put("a", "k", b"w", token=tok(3))
    before = dump(path)
    for floors in ({"a": -1}, {"a": 2**63}, {"a": "7"}, {"bad scope": 1}, lambda scope: 1.5, 42):
        with pytest.raises(InvalidArgument):
            restore(backup_path, path, fence_floors=floors, floors_complete=True, report_path=tmp_path / "r.json")
    for floors in ({}, {"a": 9}, lambda scope: 9):  # may miss scopes: refused unless vouched complete
        with pytest.raises(InvalidArgument) as info:
            restore(backup_path, path, fence_floors=floors, report_path=tmp_path / "r.json")
        assert info.value.field == "fence_floors"
    with pytest.raises(InvalidArgument):
        restore(path, path, fence_floors={}, floors_complete=True, report_path=tmp_path / "r.json")
    other = tmp_path / "other.db"
    with SQLiteStore(other, cluster_id=OTHER_CLUSTER, keys="unsigned") as s:
        s.put("a", "k", b"v", token=tok(1, cluster=OTHER_CLUSTER))
        s.backup(tmp_path / "other-backup.db")
    with pytest.raises(InvalidArgument):
        restore(tmp_path / "other-backup.db", path, fence_floors={}, floors_complete=True,
                report_path=tmp_path / "r.json")
    assert dump(path) == before
    assert not (tmp_path / "r.json").exists()
    assert not list(tmp_path.glob("*.restoring*"))


def test_restore_refuses_to_replace_a_file_that_is_not_a_store(tmp_path):
    with SQLiteStore(tmp_path / "s.db", cluster_id=CLUSTER, keys="unsigned") as s:
        s.backup(tmp_path / "b.db")
    foreign = tmp_path / "coordinator.db"
    conn = sqlite3.connect(str(foreign))
    conn.execute("CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(InvalidArgument):
        restore(tmp_path / "b.db", foreign, fence_floors={}, floors_complete=True, report_path=tmp_path / "r.json")
    assert dump(foreign) == {"meta": []}


def test_backup_refuses_the_store_itself(store):
    with pytest.raises(InvalidArgument):
        store.backup(store.path)


def test_backup_is_online_and_consistent(tmp_path):
    path = tmp_path / "s.db"
    with SQLiteStore(path, cluster_id=CLUSTER, keys="unsigned") as writer, SQLiteStore(path, keys="unsigned") as backer:
        stop = threading.Event()

        def write():
            i = 0
            while not stop.is_set():
                i += 1
                writer.put("a", f"k{i % 7}", str(i), token=tok(1 + i // 50))

        thread = threading.Thread(target=write)
        thread.start()
        try:
            infos = [backer.backup(tmp_path / f"b{n}.db") for n in range(5)]
        finally:
            stop.set()
            thread.join()
    for info in infos:
        with SQLiteStore(info.path, keys="unsigned") as copy:
            assert copy.commit_seq() == info.commit_seq
            assert copy.high_waters() == info.high_waters
            audit = copy.audit(limit=LIST_PAGE_MAX)
            assert not audit or audit[-1].commit_seq == info.commit_seq


# -- bad input changes nothing ----------------------------------------------------------------------------

_SMALL_VALUE_MAX = 16
_STALE = tok(2)
_GOOD = tok(5)
_BAD_TOKENS = [
    (0, InvalidArgument), (-1, InvalidArgument), (2**63, InvalidArgument), (5, InvalidArgument),
    (True, InvalidArgument), (5.0, InvalidArgument), (float("nan"), InvalidArgument), (None, InvalidArgument),
    (b"stk1", InvalidArgument), ({"value": 5}, InvalidArgument),
    (f"stk1.{CLUSTER}.0.a", InvalidArgument), (f"stk1.{CLUSTER}.-1.a", InvalidArgument),
    (f"stk1.{CLUSTER}.{2**63}.a", InvalidArgument), (f"stk1.{CLUSTER}.05.a", InvalidArgument),
    (f"stk1.{CLUSTER}.5.5", TokenMismatch), ("stk1.XYZ.5.a", InvalidArgument), (f"stk2.{CLUSTER}.5.a", InvalidArgument),
    (f"stk1.{CLUSTER}.5", InvalidArgument), ("", InvalidArgument), ("x" * 10_000, InvalidArgument),
    (f"stk1.{CLUSTER}.5.a b", InvalidArgument), (f"stk1.{CLUSTER}.1e2.a", InvalidArgument),
    (f"stk1.{CLUSTER}.5.0", TokenMismatch),
    (tok(9, "b"), TokenMismatch), (tok(9, cluster=OTHER_CLUSTER), TokenMismatch),
    (tok(9, "b").encode(), TokenMismatch), (_STALE, StaleToken), (_STALE.encode(), StaleToken),
]


def _forged_token(value):
    forged = object.__new__(FencingToken)
    object.__setattr__(forged, "cluster", CLUSTER)
    object.__setattr__(forged, "scope", "a")
    object.__setattr__(forged, "value", value)
    return forged


_CASES = {
    **{f"put-token-{i}-{bad!r:.40}": (lambda s, bad=bad: s.put("a", "k", b"v", token=bad), exc)
       for i, (bad, exc) in enumerate(_BAD_TOKENS)},
    **{f"delete-token-{i}": (lambda s, bad=bad: s.delete("a", "k", token=bad), exc)
       for i, (bad, exc) in enumerate(_BAD_TOKENS)},
    **{f"tx-token-{i}": (lambda s, bad=bad: s.transaction("a", token=bad).__enter__(), exc)
       for i, (bad, exc) in enumerate(_BAD_TOKENS)},
    "forged-token-0": (lambda s: s.put("a", "k", b"v", token=_forged_token(0)), InvalidArgument),
    "forged-token-str": (lambda s: s.put("a", "k", b"v", token=_forged_token("9")), InvalidArgument),
    "forged-token-2**63": (lambda s: s.put("a", "k", b"v", token=_forged_token(2**63)), InvalidArgument),
    **{f"scope-{bad!r:.30}": (lambda s, bad=bad: s.put(bad, "k", b"v", token=_GOOD), InvalidArgument)
       for bad in ["", "a b", "a/b", "é", "a\x00", "x" * 201, 5, None, b"a"]},
    **{f"key-{bad!r:.30}": (lambda s, bad=bad: s.put("a", bad, b"v", token=_GOOD), InvalidArgument)
       for bad in ["", "x" * 1025, "é" * 513, "a\x00b", "\ud800", 5, None, b"k"]},
    **{f"value-{bad!r:.30}": (lambda s, bad=bad: s.put("a", "k", bad, token=_GOOD), InvalidArgument)
       for bad in [b"x" * (_SMALL_VALUE_MAX + 1), "é" * 9, 5, None, 1.5, ["a"], "\ud800"]},
    **{f"idempotency-{bad!r:.30}": (lambda s, bad=bad: s.put("a", "k", b"v", token=_GOOD, idempotency_key=bad),
                                    InvalidArgument)
       for bad in ["", "has space", "x" * 201, "tab\t", "é", 5, b"key"]},
    "idempotency-reused": (lambda s: s.put("a", "other", b"v", token=_GOOD, idempotency_key="seen"), InvalidArgument),
    "delete-key-nul": (lambda s: s.delete("a", "a\x00", token=_GOOD), InvalidArgument),
    "list-limit-0": (lambda s: s.list("a", limit=0), InvalidArgument),
    "list-limit-big": (lambda s: s.list("a", limit=LIST_PAGE_MAX + 1), InvalidArgument),
    "list-after-nul": (lambda s: s.list("a", after="\x00"), InvalidArgument),
    "audit-after-negative": (lambda s: s.audit(after_seq=-1), InvalidArgument),
    "audit-scope-bad": (lambda s: s.audit("a b"), InvalidArgument),
    "get-scope-bad": (lambda s: s.get("", "k"), InvalidArgument),
    "high-water-scope-bad": (lambda s: s.high_water("a/b"), InvalidArgument),
    "tx-step-bad-value": (lambda s: _tx_then(s, lambda tx: tx.put("k", 5)), InvalidArgument),
    "tx-step-bad-key": (lambda s: _tx_then(s, lambda tx: tx.delete("")), InvalidArgument),
}


def _tx_then(store, step):
    with store.transaction("a", token=_GOOD) as tx:
        tx.put("k", b"written-then-rolled-back")
        step(tx)


@pytest.fixture(scope="module")
def bad_input_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("bad-input") / "store.db"
    with SQLiteStore(path, cluster_id=CLUSTER, value_bytes_max=_SMALL_VALUE_MAX, keys="unsigned") as s:
        s.put("a", "k", b"v", token=_GOOD, idempotency_key="seen")
        s.put("b", "k", b"v", token=tok(9, "b"))
        yield s


@pytest.mark.parametrize("name", sorted(_CASES))
def test_bad_input_raises_typed_error_and_changes_nothing(bad_input_store, name):
    call, expected = _CASES[name]
    before = dump(bad_input_store.path)
    assert set(before) >= {"kv", "hwm", "audit", "idempotency", "counters", "meta"}
    with pytest.raises(expected):
        call(bad_input_store)
    assert dump(bad_input_store.path) == before


# -- the fence rule against a naive model (hypothesis) --------------------------------------------------------

_op = st.tuples(
    st.sampled_from(["a", "b"]),  # scope
    st.integers(1, 8),  # token value
    st.sampled_from(["put", "delete"]),
    st.sampled_from(["k1", "k2"]),
    st.sampled_from([b"x", b"y"]),
    st.sampled_from([None, None, "i1", "i2"]),  # idempotency key
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, max_size=25), mutant=st.just(None))
def test_fence_rule_matches_a_naive_model(ops, mutant):
    failures = _run_model(SQLiteStore, ops)
    assert failures == [], failures


def _run_model(store_class, ops):
    """Run ``ops`` on a store and on the model; return the disagreements."""
    accepted: dict[str, list[int]] = {"a": [], "b": []}  # the model: accepted tokens per scope
    data: dict[tuple[str, str], bytes] = {}
    idem: dict[tuple[str, str], tuple[tuple, WriteResult]] = {}
    audit: list[tuple] = []
    failures = []
    with tempfile.TemporaryDirectory() as directory:
        with store_class(Path(directory) / "s.db", cluster_id=CLUSTER, keys="unsigned") as store:
            for scope, value, op, key, payload, ikey in ops:
                token = tok(value, scope)
                request = (op, key, payload if op == "put" else b"")
                try:
                    if op == "put":
                        got = store.put(scope, key, payload, token=token, idempotency_key=ikey)
                    else:
                        got = store.delete(scope, key, token=token, idempotency_key=ikey)
                except (StaleToken, InvalidArgument) as exc:
                    got = type(exc)
                if ikey is not None and (scope, ikey) in idem:
                    first_request, first_result = idem[(scope, ikey)]
                    want = first_result if first_request == request else InvalidArgument
                    if got != want:
                        failures.append((scope, value, op, key, ikey, "replay", got, want))
                    continue
                if value < max(accepted[scope], default=0):
                    if got is not StaleToken:
                        failures.append((scope, value, op, key, ikey, "stale accepted", got))
                    continue
                accepted[scope].append(value)
                if op == "put":
                    data[(scope, key)] = payload
                else:
                    data.pop((scope, key), None)
                audit.append((scope, key, op, value, ikey))
                if not isinstance(got, WriteResult) or got.replayed or got.token_value != value:
                    failures.append((scope, value, op, key, ikey, "rejected", got))
                    continue
                if ikey is not None:
                    idem[(scope, ikey)] = (request, WriteResult(
                        scope, key, value, value, got.commit_seq, replayed=True))
            stored = {(s, i.key): i.value for s in ("a", "b") for i in store.list(s)}
            if stored != data:
                failures.append(("final data", stored, data))
            marks = {s: max(v) for s, v in accepted.items() if v}
            if store.high_waters() != marks:
                failures.append(("high waters", store.high_waters(), marks))
            trail = [(r.scope, r.key, r.op, r.token_value, r.idempotency_key) for r in store.audit()]
            if trail != audit:
                failures.append(("audit", trail, audit))
    return failures


def test_model_check_catches_the_controls():
    # The same checker must fail on the broken stores, or it proves nothing.
    assert _run_model(FencingOffStore, [("a", 5, "put", "k1", b"x", None), ("a", 4, "put", "k1", b"y", None)])
    assert _run_model(StrictGreaterStore, [("a", 5, "put", "k1", b"x", None), ("a", 5, "put", "k1", b"y", None)])


def test_restore_over_an_unreadable_store_says_so(tmp_path):
    path, backup_path, report_path = tmp_path / "s.db", tmp_path / "b.db", tmp_path / "r.json"
    with SQLiteStore(path, cluster_id=CLUSTER, keys="unsigned") as s:
        s.put("a", "k", b"v", token=tok(2))
        s.backup(backup_path)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.write_bytes(b"this is not a database, it is what a bad disk left" * 100)
    restore(backup_path, path, fence_floors={"a": 3}, floors_complete=True, report_path=report_path)
    document = json.loads(report_path.read_text())
    assert document["old_store"]["state"] == "unreadable" and document["removed_complete"] is False
    with SQLiteStore(path, keys="unsigned") as s:
        assert s.high_waters() == {"a": 3} and s.get("a", "k").value == b"v"


def test_restore_refuses_a_store_in_use(tmp_path):
    path, backup_path = tmp_path / "s.db", tmp_path / "b.db"
    with SQLiteStore(path, cluster_id=CLUSTER, busy_timeout_ms=100, keys="unsigned") as s:
        s.put("a", "k", b"v", token=tok(2))
        s.backup(backup_path)
        s.put("a", "k", b"w", token=tok(3))
        writer = sqlite3.connect(str(path), isolation_level=None)  # another process's open write
        try:
            writer.execute("BEGIN IMMEDIATE")
            writer.execute("UPDATE kv SET value = x'00'")
            before = dump(path)
            with pytest.raises(BackendUnavailable, match="in use"):
                restore(backup_path, path, fence_floors={}, floors_complete=True, report_path=tmp_path / "r.json")
            assert dump(path) == before
        finally:
            writer.close()
    assert not (tmp_path / "r.json").exists()


def test_fencing_off_control_never_lowers_the_mark_but_accepts_stale(tmp_path):
    with FencingOffStore(tmp_path / "s.db", cluster_id=CLUSTER, keys="unsigned") as s:
        s.put("a", "k", b"new", token=tok(5))
        s.put("a", "k", b"stale", token=tok(1))  # the bug
        s.put("a", "k", b"alien", token=tok(9, cluster=OTHER_CLUSTER))  # the bug
        assert s.high_water("a") == 9
