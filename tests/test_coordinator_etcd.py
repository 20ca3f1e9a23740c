"""The etcd coordinator on a real three-member etcd 3.4: its own rules, and S13 (failover).

The conformance suite runs on etcd from tests/test_coordinator_conformance.py;
this file holds what is etcd's own: the TTL mapping, the url, the keyring kept
in etcd, a keepalive that fails (K2), the lock-delay of a grant whose answer
was lost (C5 in doubt), and the acquire storm through leader failovers (S13)
beside its control. FIFO order with several waiters (C4) and the lock-delay
after a lapse, not after a release, and across a restart (C5) are the
conformance suite's, with its control on etcd (``etcd-lock-delay-off``).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import HELPERS, PYTHON, python_env
from helpers.etcd_cluster import EtcdCluster, etcd_available

import stockade
from stockade.coordinators.etcd import Layout, parse_location, ttl_s_of
from stockade.coordinators.registry import Capability

LONG = os.environ.get("STOCKADE_LONG") == "1"
FAILOVERS = 24 if LONG else 6
STORM_PROCESSES = 4

pytestmark = pytest.mark.skipif(
    not etcd_available() and os.environ.get("CI") != "true", reason="etcd is not installed (CI never skips)"
)


# -- pure: url and TTL mapping ---------------------------------------------------------------------


def test_ttl_maps_to_whole_seconds_rounded_up():
    assert [ttl_s_of(ms) for ms in (100, 999, 1000, 1001, 2500, 3_600_000)] == [1, 1, 1, 2, 3, 3600]
    with pytest.raises(stockade.InvalidArgument):
        ttl_s_of(0)
    with pytest.raises(stockade.InvalidArgument):
        ttl_s_of(3_600_001)


def test_url_members_and_namespace():
    members, layout = parse_location("h1:2379,h2:2380,[::1]:2381/team-a")
    assert [(m.host, m.port) for m in members] == [("h1", 2379), ("h2", 2380), ("::1", 2381)]
    assert layout.prefix == b"stockade/ns/team-a/" and Layout().prefix == b"stockade/"
    assert parse_location("h1")[0][0].port == 2379
    for bad in ["", "h1:x", "h1:0", "h1:2379/a/b", "user@h1:2379", "h1:2379?x=1"]:
        with pytest.raises(stockade.InvalidArgument):
            parse_location(bad)
    with pytest.raises(stockade.InvalidArgument, match="lock_delay_ms"):
        stockade.connect("etcd://127.0.0.1:9", lock_delay_ms=-1)  # refused before any I/O


# -- on the session's cluster ------------------------------------------------------------------------


@pytest.fixture
def url(etcd_cluster, tmp_path) -> str:
    return f"{etcd_cluster.url}/{tmp_path.name}"


def test_tokens_are_signed_with_the_keyring_kept_in_etcd(url, tmp_path):
    coord = stockade.connect(url)
    again = stockade.connect(url)
    assert again.cluster_id == coord.cluster_id  # written once, read by every client
    assert Capability.DENSE_TOKENS not in coord.capabilities and Capability.NATIVE_WAIT in coord.capabilities
    store = stockade.open_store(f"sqlite:///{tmp_path / 'store.db'}", cluster_id=coord.cluster_id,
                                keys=again.verify_keys())
    lease = coord.acquire("signed", ttl_ms=2000)
    assert lease.token.kid and lease.token.mac
    store.put("signed", "k", b"v", token=lease.token)  # verified with the other client's copy of the keyring
    # Control: the same value without the MAC is refused by that store.
    forged = stockade.FencingToken(coord.cluster_id, "signed", lease.token.value + 1)
    with pytest.raises(stockade.TokenMismatch):
        store.put("signed", "k", b"forged", token=forged)
    lease.release()
    other = stockade.connect(url + "-other")
    assert other.cluster_id != coord.cluster_id  # another namespace, another cluster id and keyring
    for handle in (coord, again, other):
        handle.close()


# -- faults on a cluster of their own ------------------------------------------------------------------


@pytest.fixture
def own_cluster(tmp_path):
    cluster = EtcdCluster(tmp_path / "etcd")
    yield cluster
    cluster.stop()


def test_keepalive_that_fails_marks_the_lease_lost_by_its_local_deadline(own_cluster):
    coord = stockade.connect(own_cluster.url, timeout_ms=800)
    lease = coord.acquire("k2", ttl_ms=1000)
    kept = coord.acquire("control", ttl_ms=3000)  # 3 s: a 1 s one's renewal came late at load 20 (lost once)
    time.sleep(3.2)
    assert not kept.lost  # control: with the cluster up, the keepalive holds a lease past its TTL
    paused_ns = time.monotonic_ns()
    for name in own_cluster.names:
        own_cluster.pause(name)
    try:
        assert lease.wait_lost(timeout_ms=5000)
        lost_after_ms = (time.monotonic_ns() - paused_ns) // 1_000_000
        assert "deadline" in lease.lost_cause or "refused" in lease.lost_cause, lease.lost_cause
        assert lost_after_ms <= 1000 + 400  # by the local deadline (TTL from the last renewal's send), not later
    finally:
        for name in own_cluster.names:
            own_cluster.resume(name)
    coord.close()


def _storm(cluster: EtcdCluster, tmp_path: Path, failovers: int, mutant: str = "", grants_min: int = 8) -> dict:
    """Run the storm through ``failovers`` leader faults; the figures of `_check`."""
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    coord = stockade.connect(cluster.url)
    keys = "unsigned" if mutant else coord.verify_keys()  # the control's made-up tokens carry no MAC
    stockade.open_store(store_url, cluster_id=coord.cluster_id, keys=keys).close()  # created once, first
    coord.close()
    logs = [tmp_path / f"worker{i}.log" for i in range(STORM_PROCESSES)]
    workers = []
    for index, log in enumerate(logs):
        with open(log, "wb") as out:
            argv = [PYTHON, str(HELPERS / "failover_storm.py"), cluster.url, store_url, str(index)]
            workers.append(subprocess.Popen(
                argv + ([mutant] if mutant else []), stdout=out, stderr=subprocess.STDOUT, env=python_env()
            ))
    faults: list[int] = []
    leaders_changed = 0
    try:
        for index in range(failovers):
            _wait_grants(logs, len(faults) * 4 + 8, workers)
            leader = cluster.leader()
            faults.append(time.monotonic_ns())
            if index % 2 == 0:
                cluster.kill(leader)
                new_leader = cluster.leader()
                cluster.start(leader)
                cluster.wait_healthy([leader])
            else:
                cluster.pause(leader)
                time.sleep(2.5)  # past the election timeout (1 s): the others elect a new leader
                new_leader = cluster.leader()
                cluster.resume(leader)
            leaders_changed += new_leader != leader
        _wait_grants(logs, max(grants_min, len(faults) * 4 + 8), workers)
    finally:
        for worker in workers:
            worker.kill()
            worker.wait(10)
    figures = _check([log.read_text() for log in logs], faults)
    figures["leader_changes"] = leaders_changed
    return figures


def _grants(texts: list[str]) -> list[tuple[str, int, int, int]]:
    """(scope, token, time, worker) of every grant."""
    found = []
    for worker, text in enumerate(texts):
        for line in text.splitlines():
            fields = line.split()
            if len(fields) == 4 and fields[0] == "grant" and fields[2].isdigit() and fields[3].isdigit():
                found.append((fields[1], int(fields[2]), int(fields[3]), worker))
    return found


def _wait_grants(logs: list[Path], count: int, workers: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + 60
    while len(_grants([log.read_text() for log in logs if log.exists()])) < count:
        for worker, log in zip(workers, logs, strict=False):
            assert worker.poll() is None, f"a storm worker died: {log.read_text()[-800:] if log.exists() else ''}"
        assert time.monotonic() < deadline, "the storm made no progress"
        time.sleep(0.05)


def _check(texts: list[str], faults: list[int]) -> dict:
    grants = sorted(_grants(texts), key=lambda g: g[2])
    regressions = duplicates = stale_accepted = 0
    seen: set[int] = set()  # create revisions are unique in the whole cluster, not only per scope
    highest: dict[str, int] = {}
    for scope, token, _, _ in grants:
        duplicates += token in seen
        seen.add(token)
        regressions += scope in highest and token <= highest[scope]  # not above every earlier one of its scope
        highest[scope] = max(highest.get(scope, 0), token)
    writes = []
    for text in texts:
        for line in text.splitlines():
            fields = line.split()
            if len(fields) == 5 and fields[0] == "write" and fields[4].isdigit():
                writes.append((int(fields[4]), fields[1], int(fields[2]), fields[3]))
    accepted: dict[str, int] = {}
    for _, scope, token, outcome in sorted(writes):
        if outcome == "ok":
            stale_accepted += token < accepted.get(scope, 0)
            accepted[scope] = max(accepted.get(scope, 0), token)
    overlaps = _overlaps(texts)
    times = [g[2] for g in grants]
    to_next_ms = []
    for fault in faults:
        after = [t for t in times if t > fault]
        if after:
            to_next_ms.append((min(after) - fault) / 1e6)
    return {
        "grants": len(grants), "regressions": regressions, "duplicates": duplicates,
        "stale_accepted": stale_accepted, "writes": len(writes), "overlaps": overlaps,
        "median_to_next_grant_ms": statistics.median(to_next_ms) if to_next_ms else None,
        "errors": sum(text.count("\nerror ") for text in texts),
    }


def _overlaps(texts: list[str]) -> int:
    spans: dict[str, list[tuple[int, int]]] = {}
    for text in texts:
        start: dict[tuple[str, str], int] = {}
        for line in text.splitlines():
            fields = line.split()
            if fields and fields[0] == "grant":
                start[(fields[1], fields[2])] = int(fields[3])
            elif fields and fields[0] == "release" and (fields[1], fields[2]) in start:
                spans.setdefault(fields[1], []).append((start.pop((fields[1], fields[2])), int(fields[3])))
    count = 0
    for intervals in spans.values():
        intervals.sort()
        end = 0
        for begin, finish in intervals:
            count += begin < end
            end = max(end, finish)
    return count


def test_s13_acquire_storm_through_leader_failovers(own_cluster, tmp_path):
    figures = _storm(own_cluster, tmp_path, FAILOVERS)
    print(f"S13 etcd: {figures}")
    assert figures["leader_changes"] >= FAILOVERS - 1, figures  # a paused leader may be re-elected, rarely
    assert figures["regressions"] == 0 and figures["duplicates"] == 0 and figures["stale_accepted"] == 0, figures
    assert figures["grants"] >= FAILOVERS * 4, figures


def test_s13_control_tokens_from_a_local_counter_are_caught(own_cluster, tmp_path):
    figures = _storm(own_cluster, tmp_path, 1, mutant="local-counter", grants_min=80)
    print(f"S13 control: {figures}")
    assert figures["duplicates"] > 0 and figures["regressions"] > 0, figures


def test_cli_status_and_lock_on_etcd(url, tmp_path):
    coord = stockade.connect(url)
    lease = coord.acquire("cli", ttl_ms=5000, holder="cli-holder")
    status = subprocess.run([PYTHON, "-m", "stockade", "status", "--url", url, "--json"],
                            capture_output=True, text=True, env=python_env(), timeout=60)
    assert status.returncode == 0, status.stderr
    assert '"holder": "cli-holder"' in status.stdout and f'"token": {lease.token.value}' in status.stdout
    lease.release()
    locked = subprocess.run(
        [PYTHON, "-m", "stockade", "lock", "--url", url, "--data-dir", str(tmp_path), "cli", "--",
         PYTHON, "-c", "import os; print(os.environ['STOCKADE_TOKEN'])"],
        capture_output=True, text=True, env=python_env(), timeout=60,
    )
    assert locked.returncode == 0, locked.stderr
    assert locked.stdout.startswith(f"stk2.{coord.cluster_id}.")
    assert coord.last_issued("cli") > lease.token.value
    coord.close()


def test_a_restored_snapshot_is_refused_by_a_client_that_saw_later_revisions(own_cluster, tmp_path):
    coord = stockade.connect(own_cluster.url)
    for _ in range(3):
        coord.acquire("restored", ttl_ms=2000).release()
    own_cluster.snapshot(tmp_path / "snap.db")
    issued = []
    for _ in range(5):
        lease = coord.acquire("restored", ttl_ms=2000)
        issued.append(lease.token.value)
        lease.release()
    own_cluster.restore(tmp_path / "snap.db")
    with pytest.raises(stockade.BackendUnavailable, match="went back"):
        coord.acquire("restored", ttl_ms=2000)  # 0 tokens from the restored cluster in this process
    coord.close()
    # A process that never saw the later revisions tells the restore by etcd's status, and refuses
    # too (tests/test_etcd_restore.py: the bump that ends it); control: the next create revision
    # repeats a value already issued.
    fresh = stockade.connect(own_cluster.url)
    with pytest.raises(stockade.BackendUnavailable, match="restored from a snapshot"):
        fresh.acquire("restored", ttl_ms=2000)
    fresh.close()
    assert own_cluster.put(b"control/next") <= max(issued)


def test_a_holder_paused_past_its_ttl_has_its_writes_rejected(url, tmp_path):
    from test_check import ROUNDS, paused_holder_check

    out, status = paused_holder_check(url, tmp_path)
    assert status == 0 and f"held    pause: 0 of {ROUNDS} stale writes applied" in out, out


def test_a_paused_holder_control_without_the_fence_is_caught(url, tmp_path):
    from test_check import ROUNDS, paused_holder_check

    out, status = paused_holder_check(url, tmp_path, "--control", "fencing-off")
    assert status == 1 and f"BROKEN  pause: {ROUNDS} of {ROUNDS} stale writes applied" in out, out


def test_async_client_opened_inside_a_running_loop(url):
    import asyncio

    async def body() -> tuple[str, int]:
        coord = stockade.connect_async(url)  # nothing blocks here: the cluster id is read on the first await
        with pytest.raises(stockade.InvalidArgument):
            _ = coord.cluster_id
        async with coord:
            lease = await coord.acquire("in-loop", ttl_ms=1000)
            await lease.release()
            return coord.cluster_id, lease.token.value

    cluster_id, value = asyncio.run(body())
    assert cluster_id == stockade.connect(url).cluster_id and value > 0


def test_grants_never_released_are_forgotten_once_they_lapse(url, monkeypatch):
    """Holders that vanish without a release (a server in front of etcd sees many): what the
    port records of its grants stays bounded, and live grants are never forgotten."""
    from stockade.coordinators.etcd._sync import port as sync_etcd

    monkeypatch.setattr(sync_etcd, "_PRUNE_AT_MIN", 4)
    coord = stockade.connect(url)
    port = coord._port
    recorded = []
    for i in range(12):
        coord.acquire(f"vanished{i}", ttl_ms=2000, keepalive=False)
        for lease in port._renewed:  # as if last renewed long ago: etcd has expired them
            port._renewed[lease] -= 10 * 1_000_000_000
        recorded.append(len(port._granted))
    assert max(recorded) <= 4, recorded
    live = [coord.acquire(f"live{i}", ttl_ms=30_000, keepalive=False) for i in range(6)]
    assert {lease.lease_id for lease in live} <= set(port._granted.values())  # renewed recently: kept
    for lease in live:
        lease.renew()
        lease.release()
    coord.close()


def _lose_next_grant_answer(port) -> dict:
    """Make ``port``'s next write Txn, once armed, land and lose its answer: the resend (as the
    gateway call does when no answer came) then finds its compare failed."""
    real_txn, real_hold_back = port._txn, port._hold_back
    state: dict = {"armed": False, "resent": [], "held_back": 0}

    def txn(body):
        lose = state["armed"] and any("request_put" in op for op in body.get("success", []))
        if lose:  # decided before it is sent: a Txn already on its way when the test armed it is not this one
            state["armed"] = False
        answer = real_txn(body)
        if lose:
            again = real_txn(body)
            state["resent"].append((answer[0], again[0]))
            return again
        return answer

    def hold_back(*args):
        state["held_back"] += 1
        return real_hold_back(*args)

    port._txn, port._hold_back = txn, hold_back
    return state


@pytest.mark.parametrize("lapse", [False, True], ids=["after-a-release", "control-after-a-lapse"])
def test_a_grant_whose_answer_was_lost_waits_the_lock_delay_only_after_a_lapse(url, lapse):
    """The retried grant cannot read how the last holder left (its first send overwrote that), so
    it reads the journal: after a release it is not held back; after a lapse it still is (C5)."""
    scope = "lost-answer-" + ("lapse" if lapse else "release")
    holder = stockade.connect(url)
    waiter = stockade.connect(url, lock_delay_ms=1000)
    state = _lose_next_grant_answer(waiter._port)
    held = holder.acquire(scope, ttl_ms=1000 if lapse else 10_000, keepalive=not lapse)
    got: list = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(scope, ttl_ms=5000, wait_ms=30_000)))
    thread.start()
    deadline = time.monotonic() + 20
    while holder.inspect(scope).waiters < 1:  # queued: its next write Txn is the grant
        assert time.monotonic() < deadline
        time.sleep(0.01)
    state["armed"] = True
    if not lapse:
        held.release()
    thread.join(60)
    assert got and got[0].token.value > held.token.value
    assert state["resent"] == [(True, False)]  # the loss happened: the first send landed, the resend found it so
    assert state["held_back"] == (1 if lapse else 0)
    events = waiter.history(scope, limit=3)
    assert [e.kind for e in events][-2:] == ["expire" if lapse else "release", "grant"]
    got[0].release()
    holder.close()
    waiter.close()


def test_only_a_release_right_before_the_grant_spares_the_lock_delay():
    from stockade.coordinators.etcd._journal import released_before
    from stockade.coordinators.journal import HistoryEvent

    def event(seq: int, kind: str, token: int) -> HistoryEvent:
        return HistoryEvent(seq, "s", kind, "h", token, 0)

    assert released_before([event(1, "release", 5), event(2, "grant", 9)], 9)
    assert not released_before([event(1, "expire", 5), event(2, "grant", 9)], 9)  # a lapse: the delay is waited
    assert not released_before([event(2, "grant", 9)], 9)  # no predecessor known: in doubt
    assert not released_before([event(1, "release", 5), event(2, "grant", 7)], 9)  # not this grant's history
    assert not released_before([], 9)
