"""Restoring etcd from a snapshot without tokens going back: detection, `stockade etcd bump-revision`, controls.

etcd 3.4 restores a snapshot at the snapshot's revision, and a token is a
create revision. A fresh process tells a restored cluster by its status (the
raft log restarts behind the revision, or etcd's cluster id changed) and
refuses to grant until the bump has run; the bump advances the revision past
the highest mark of the fenced stores and records the cluster again.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PYTHON, python_env
from helpers.etcd_cluster import EtcdCluster, etcd_available

import stockade
from stockade.cli import etcd as etcd_cli
from stockade.coordinators.etcd import (
    GAP_SLACK,
    Incarnation,
    incarnation_of,
    marker_of,
    recordable,
    restored_reason,
)
from stockade.coordinators.etcd._async.port import _RESTORE_CHECK_NS

LONG = os.environ.get("STOCKADE_LONG") == "1"
BUMP_WRITES_LONG = 100_000

pytestmark = pytest.mark.skipif(
    not etcd_available() and os.environ.get("CI") != "true", reason="etcd is not installed (CI never skips)"
)

# A fresh process: N grants on one scope, each written to the store; prints its tokens, or the refusal.
FRESH = """
import json, sys, stockade
url, store_url, scope, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
coord = stockade.connect(url)
store = stockade.open_store(store_url, cluster_id=coord.cluster_id, keys=coord.verify_keys())
tokens, refused = [], None
try:
    for i in range(count):
        with coord.lock(scope, ttl_ms=5000) as lease:
            store.put(scope, "k", str(i).encode(), token=lease.token)
            tokens.append(lease.token.value)
except stockade.BackendUnavailable as exc:
    refused = str(exc)
print(json.dumps({"tokens": tokens, "refused": refused}))
"""


def _fresh(url: str, store_url: str, scope: str, count: int) -> dict:
    done = subprocess.run([PYTHON, "-c", FRESH, url, store_url, scope, str(count)], capture_output=True, text=True,
                          env=python_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _bump(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "stockade", "etcd", "bump-revision", *args], capture_output=True, text=True,
                          env=python_env(), timeout=600)


# -- pure -----------------------------------------------------------------------------------------------


def test_restored_reason_reads_the_gap_and_the_cluster_id():
    marker = Incarnation("7", gap=40, revision=500)
    assert restored_reason(None, Incarnation("7", -1000, 1)) is None  # nothing recorded: nothing to compare
    assert restored_reason(marker, Incarnation("7", 40, 900)) is None
    assert restored_reason(marker, Incarnation("7", 40 - GAP_SLACK, 900)) is None
    assert "raft log restarted" in restored_reason(marker, Incarnation("7", 40 - GAP_SLACK - 1, 900))
    assert "cluster id changed" in restored_reason(marker, Incarnation("8", 40, 900))
    assert restored_reason(recordable(Incarnation("7", 40, 9)), Incarnation("7", 40 - 2 * GAP_SLACK, 900)) is None
    status = {"header": {"cluster_id": "41", "revision": "51"}, "raftIndex": "12", "raftAppliedIndex": "11"}
    assert incarnation_of(status) == Incarnation("41", 11 - 51, 51)
    for bad in ({}, {"header": {"revision": "1"}}, {"header": {"cluster_id": "x", "revision": "1"}, "raftIndex": 1}):
        with pytest.raises(stockade.BackendUnavailable):
            incarnation_of(bad)
    with pytest.raises(stockade.BackendUnavailable):
        marker_of(type("KV", (), {"value": b"{not json"})())  # type: ignore[arg-type]


def test_cli_refuses_bad_input_before_any_request(capsys, monkeypatch):
    monkeypatch.delenv("STOCKADE_URL", raising=False)
    for args, words in [
        ((), "needs --url etcd://"),
        (("--url", "http://127.0.0.1:9", "--to", "5"), "needs --url etcd://"),
        (("--url", "etcd://127.0.0.1:9"), "--to N, or --from-store"),
        (("--url", "etcd://127.0.0.1:9", "--to", "-1"), "to"),
        (("--url", "etcd://127.0.0.1:9", "--to", "5", "--workers", "0"), "workers"),
        (("--url", "etcd://127.0.0.1:9", "--to", "5", "--margin", "-3"), "margin"),
    ]:
        assert etcd_cli.run(["bump-revision", *args]) == 2, args  # bad input
        assert words in capsys.readouterr().err, args


# -- a real three-member cluster, restored ----------------------------------------------------------------


@pytest.fixture
def own_cluster(tmp_path):
    cluster = EtcdCluster(tmp_path / "etcd")
    yield cluster
    cluster.stop()


def _gap(cluster: EtcdCluster) -> int:
    status = cluster.status("n1")
    return int(status["raftAppliedIndex"]) - int(status["header"]["revision"])


def _grants(coord, store, scope: str, count: int) -> list[int]:
    tokens = []
    for index in range(count):
        with coord.lock(scope, ttl_ms=5000) as lease:
            store.put(scope, "k", str(index).encode(), token=lease.token)
            tokens.append(lease.token.value)
    return tokens


def test_restore_then_bump_from_the_store_marks(own_cluster, tmp_path):
    """Grants, snapshot, more grants (tokens up to T), restore all three members; a fresh process is refused
    (control: the next create revision is <= T); bump-revision from the store's marks; the fresh process's
    grants are all above T."""
    url, store_url = own_cluster.url, f"sqlite:///{tmp_path / 'store.db'}"
    coord = stockade.connect(url)
    store = stockade.open_store(store_url, cluster_id=coord.cluster_id, keys=coord.verify_keys())
    before = _grants(coord, store, "a", 15) + _grants(coord, store, "b", 15)
    at_snapshot = coord.history("b")
    own_cluster.snapshot(tmp_path / "snap.db")
    after = _grants(coord, store, "a", 10) + _grants(coord, store, "b", 10)
    highest = max(after)  # T: the highest token issued, and the store's highest mark
    assert max(before) < min(after) and store.high_water("b") == highest
    assert coord.history("b")[-1].token_value == highest
    own_cluster.restore(tmp_path / "snap.db")
    # History: the process that read later revisions refuses to read; a fresh one reads the snapshot's.
    with pytest.raises(stockade.BackendUnavailable, match="revision went back"):
        coord.history("b")
    coord.close()
    with stockade.connect(url) as reader:
        assert reader.history("b") == at_snapshot

    refused = _fresh(url, store_url, "b", 3)
    assert refused["tokens"] == [] and "raft log restarted" in refused["refused"], refused  # 0 grants
    # A refusing client writes no raft entry (each would raise the difference the check reads): over
    # 20 connects and refused acquires it grows by no more than the snapshot's leases can expire.
    leases = len(own_cluster._post("n1", "/v3/lease/leases", {}).get("leases", []))
    gap = _gap(own_cluster)
    for _ in range(20):
        with stockade.connect(url) as again, pytest.raises(stockade.BackendUnavailable, match="restored"):
            again.acquire("b", ttl_ms=2000)
    assert _gap(own_cluster) - gap <= leases < 20
    # Control: what that grant's token would have been: a value already issued (a regression).
    assert own_cluster.put(b"control/next") <= highest

    dry = _bump("--url", url, "--from-store", store_url, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["restored"] and plan["target"] == highest and plan["writes"] == highest - plan["revision_before"] > 0
    assert _fresh(url, store_url, "b", 1)["tokens"] == []  # a dry run changes nothing

    done = _bump("--url", url, "--from-store", store_url, "--json", "--workers", "8")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["revision_after"] >= highest and report["writes_made"] >= report["writes"]

    fresh = _fresh(url, store_url, "b", 10) | {"a": _fresh(url, store_url, "a", 5)}
    tokens = fresh["tokens"] + fresh["a"]["tokens"]
    assert fresh["refused"] is None and len(tokens) == 15
    regressions = [t for t in tokens if t <= highest]
    assert regressions == []  # 0 of 15 at or below T
    assert fresh["tokens"] == sorted(set(fresh["tokens"]))
    with stockade.connect(url) as reader:  # the snapshot's events, then the new ones, in order
        events = reader.history("b")
    assert events[:-20] == at_snapshot[-80:] and [e.token_value for e in events[-20::2]] == fresh["tokens"]
    assert [e.seq for e in events] == sorted({e.seq for e in events})
    again = _bump("--url", url, "--to", str(highest), "--json")  # a second run: nothing to write, harmless
    assert again.returncode == 0 and json.loads(again.stdout)["writes"] == 0, again.stderr


def test_a_restore_under_another_cluster_token_is_told_by_etcds_cluster_id(own_cluster, tmp_path):
    url = own_cluster.url
    coord = stockade.connect(url)
    tokens = [coord.acquire("t", ttl_ms=2000) for _ in range(1)]
    tokens[0].release()
    own_cluster.snapshot(tmp_path / "snap.db")
    issued = []
    for _ in range(5):
        lease = coord.acquire("t", ttl_ms=2000)
        issued.append(lease.token.value)
        lease.release()
    coord.close()
    own_cluster.restore(tmp_path / "snap.db", cluster_token=own_cluster.token + "-restored")
    fresh = stockade.connect(url)
    with pytest.raises(stockade.BackendUnavailable, match="cluster id changed"):
        fresh.acquire("t", ttl_ms=2000)
    done = _bump("--url", url, "--to", str(max(issued)), "--json")
    assert done.returncode == 0, done.stderr
    lease = fresh.acquire("t", ttl_ms=2000)  # the same process: it reads the new record and grants
    assert lease.token.value > max(issued)
    lease.release()
    fresh.close()


@pytest.mark.skipif(not LONG, reason="the 10^5-revision bump runs with STOCKADE_LONG=1")
def test_bump_rate_for_a_large_gap(own_cluster, tmp_path):
    url = own_cluster.url
    stockade.connect(url).close()
    target = int(own_cluster.status("n1")["header"]["revision"]) + BUMP_WRITES_LONG
    done = _bump("--url", url, "--to", str(target), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    print(f"bump of {report['writes']} revisions: {report['seconds']:.1f} s, "
          f"{report['writes_made'] / report['seconds']:.0f} writes/s")
    assert report["revision_after"] >= target
    Path(tmp_path / "rate.json").write_text(done.stdout)


def test_a_holder_that_lived_through_the_restore_loses_its_lease(own_cluster, tmp_path):
    """A released etcd lease is kept for the next acquire; granted again after the snapshot, it is older than
    the snapshot and outlives the restore, while the holder key made after the snapshot does not. Renewal
    reads the key: the holder is told (LeaseLost) even once the bump has put the revision past its own."""
    url = own_cluster.url
    coord = stockade.connect(url)
    coord.acquire("ghost", ttl_ms=30_000).release()  # its etcd lease is kept for reuse
    own_cluster.snapshot(tmp_path / "snap.db")
    lease = coord.acquire("ghost", ttl_ms=30_000, keepalive=False)
    granted = time.monotonic()
    etcd_lease = int(lease.lease_id.split(".")[0])
    own_cluster.restore(tmp_path / "snap.db")
    done = _bump("--url", url, "--to", str(lease.token.value + 1), "--json")
    assert done.returncode == 0, done.stderr
    # Control: the etcd lease alone says "held" (what a keepalive-only renewal would believe).
    alive = own_cluster._post("n1", "/v3/lease/keepalive", {"ID": str(etcd_lease)}, 5.0)
    assert int(alive["result"]["TTL"]) > 0
    # A renewal reads the holder key at most once a second (the grant read it): on a fast machine the
    # restore and the bump can take less, so wait that second out (a lower bound, not a timing guess).
    time.sleep(max(0.0, granted + _RESTORE_CHECK_NS / 1e9 - time.monotonic()))
    with pytest.raises(stockade.LeaseLost) as lost:
        lease.renew()
    assert isinstance(lost.value.__cause__, stockade.NotHolder) and "key is gone" in str(lost.value.__cause__)
    assert lease.lost
    coord.close()
